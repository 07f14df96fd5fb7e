"""bench/large_model.py, issue 22's transformer, at its fast-tier size (`size_gb=0.005`, d=144, ~5 MB).

    x ─ [LayerNorm ─ MatMul ─ Add ─ erf-GELU ─ MatMul ─ Add ─┬─ Add(residual)] x 8 ─ y
                                      (block 4 only: ffn2_out └ Mul(2^-16))

The weights live in a data file beside the graph; block 4's FFN output is planted above fp16's 65504 and
scaled back, so the fp32 model is healthy while fp16 storage of that tensor overflows. Checked on real ORT
sessions over the generated files.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from large_model import BLOCKS, DATA, LargeModel, large_model  # noqa: E402

FP16_MAX = 65504.0
SIZE_GB = 0.005


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> LargeModel:
    return large_model(SIZE_GB, tmp_path_factory.mktemp("large_models"))


def samples(model: LargeModel) -> list[np.ndarray]:
    return [np.load(path)["x"] for path in sorted(model.samples.glob("sample*_inputs.npz"))]


def session(path: Path, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_weights_are_in_a_separate_data_file_beside_the_graph(small: LargeModel) -> None:
    graph = onnx.load(small.model, load_external_data=False)
    external = [tensor for tensor in graph.graph.initializer if tensor.data_location == onnx.TensorProto.EXTERNAL]
    locations = {entry.value for tensor in external for entry in tensor.external_data if entry.key == "location"}
    assert locations == {DATA}
    assert len(external) == 6 * BLOCKS + 1  # every weight and the planted scale; only 3 scalar constants inline
    assert small.model.stat().st_size < 20_000
    assert 5e6 <= small.data.stat().st_size < 6e6
    assert len(samples(small)) == 2 and samples(small)[0].shape == (1, 64, small.d)


def test_the_fp32_model_runs_finite_at_every_optimization_level(small: LargeModel) -> None:
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        compiled = session(small.model, level)
        for x in samples(small):
            (y,) = compiled.run(None, {"x": x})
            assert y.shape == x.shape and np.isfinite(y).all()


def test_only_the_planted_ffn_output_exceeds_fp16_range_and_the_model_output_does_not(small: LargeModel) -> None:
    """Every block's FFN output added as a graph output, on the unoptimized graph (fusion would hide them)."""
    graph = onnx.load(small.model, load_external_data=False)
    ffn_outputs = [f"b{block}/ffn2_out" for block in range(BLOCKS)]
    graph.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                              for name in ffn_outputs)
    probe = small.folder / "probe.onnx"  # beside the data file, whose location is relative to the graph
    onnx.save(graph, probe)
    try:
        run = session(probe, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        for x in samples(small):
            y, *ffn = run.run(None, {"x": x})
            peaks = dict(zip(ffn_outputs, (float(np.abs(values).max()) for values in ffn), strict=True))
            assert peaks.pop(small.ffn_output) > FP16_MAX
            assert max(peaks.values()) < FP16_MAX
            assert np.abs(y).max() < FP16_MAX
    finally:
        probe.unlink()


def test_a_complete_copy_is_reused_and_an_incomplete_one_rebuilt_identically(small: LargeModel,
                                                                              tmp_path: Path) -> None:
    before = small.data.stat().st_mtime_ns, sha256(small.data)
    assert large_model(SIZE_GB, small.folder.parent) == small
    assert (small.data.stat().st_mtime_ns, sha256(small.data)) == before

    other = large_model(SIZE_GB, tmp_path)
    assert other.folder.name == small.folder.name and sha256(other.data) == before[1]
    with open(other.data, "r+b") as handle:
        handle.truncate(1000)
    assert not other.complete()
    assert large_model(SIZE_GB, tmp_path).complete() and sha256(other.data) == before[1]
    assert [path.name for path in tmp_path.iterdir()] == [other.folder.name]  # no staging folder left behind
