"""`snakemake precision_bisect` on a model whose weights live in a data file beside its graph.

The model is bench/large_model.py's transformer at its fast-tier size (~5 MB of weights in
`transformer.onnx.data`), with block 4's FFN output planted above fp16's 65504:

    x ─ [LayerNorm ─ MatMul ─ Add ─ erf-GELU ─ MatMul ─ Add ─┬─ Add(residual)] x 8 ─ y
                                      (block 4 only: ffn2_out └ Mul(2^-16))

The answer must keep that FFN's second MatMul/Add/Mul in fp32 (the Add's output is beyond fp16's range);
the models the precision path writes must reference the weights instead of copying them (the reduced model
in the workspace), and the published model.onnx must come with its own data file and load, and pass, from
any folder.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import copy_workflow, snakemake

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from large_model import ACCURACY, LargeModel, large_model  # noqa: E402

PLANTED = {"b4/ffn2/matmul", "b4/ffn2/bias", "b4/ffn2/scale"}  # the planted block's FFN tail


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> LargeModel:
    return large_model(0.005, tmp_path_factory.mktemp("large_models"))


@pytest.fixture(scope="module")
def project(small: LargeModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workflow folder after `snakemake precision_bisect` on the external-data model."""
    folder = copy_workflow(tmp_path_factory.mktemp("external_precision"))
    snakemake(folder, "precision_bisect", "--configfile", str(small.config))
    return folder


def run(path: Path, feeds: dict[str, np.ndarray], level: ort.GraphOptimizationLevel) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.e2e
def test_the_planted_overflow_is_kept_in_fp32(project: Path) -> None:
    """The bias Add's output (~2e5) is stored in fp16 unless it is kept, and ORT's CPU provider hides its inf:
    the deploy job's range check keeps it, and the Mul reading it, with the MatMul."""
    keep = set((project / "results" / "precision_bisect" / "keep_dtype.txt").read_text().split())
    assert keep == PLANTED, keep


@pytest.mark.e2e
def test_the_published_model_has_its_own_data_file_and_passes_from_another_folder(
        project: Path, small: LargeModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    published = project / "results" / "precision_bisect"
    moved = tmp_path / "deployed"
    moved.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(published / name, moved / name)
    monkeypatch.chdir(tmp_path)  # neither the project's folder nor the model's
    graph = onnx.load(str(moved / "model.onnx"), load_external_data=False)
    external = [t for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {entry.value for t in external for entry in t.external_data if entry.key == "location"} == {
        "model.onnx.data"}
    assert {t.data_type for t in external} == {onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT}  # mixed
    for sample in sorted(small.samples.glob("sample*_inputs.npz")):
        feeds = dict(np.load(sample))
        reference = run(small.model, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        deployed = run(Path("deployed/model.onnx"), feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        np.testing.assert_allclose(deployed, reference, rtol=ACCURACY["rtol"], atol=ACCURACY["atol"])


@pytest.mark.e2e
def test_the_reduced_model_references_the_compiled_weights_without_copying_them(project: Path) -> None:
    """The precision stage's model adds Casts, no weight: its data file is the compiled copy's, hard-linked."""
    [reduced] = (project / "workspace" / "precision").glob("*/model.onnx")
    graph = onnx.load(str(reduced), load_external_data=False).graph
    data = reduced.parent / "model.onnx.data"
    compiled = [path for path in (project / "workspace" / "compile").glob("*/model.onnx.data")
                if path.stat().st_ino == data.stat().st_ino]
    assert len(compiled) == 1 and data.stat().st_nlink >= 2
    assert not [t.name for t in graph.initializer
                if t.data_location != onnx.TensorProto.EXTERNAL and len(t.raw_data) > 1024]
    source = onnx.load(str(compiled[0].with_suffix("")), load_external_data=False)
    assert {t.name for t in graph.initializer} == {t.name for t in source.graph.initializer}
