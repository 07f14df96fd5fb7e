"""precision_bisect on backend openvino-cpu, on the CPU's own kernels: a small model whose variance is
computed as E[x²]−E[x]² over a Convolution's output near 100, which cancels when that output is rounded to
bf16 (or f16), runs through `snakemake precision_bisect`; the answer, keeping the Convolution in f32, is
checked by compiling the published IR again here and reading back what ran. The corpus cases are in
tests/test_openvino_corpus.py. A reduced type this CPU lacks is skipped with the plugin's capabilities."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import copy_workflow, save_model, snakemake
from onnx import TensorProto, helper, numpy_helper

from accubisect.runtime.openvino_backend import CAPABILITY, HINTS, cpu_capabilities

pytestmark = pytest.mark.e2e
CAPABILITIES = cpu_capabilities()
DTYPES = [pytest.param(dtype, marks=pytest.mark.skipif(
    capability not in CAPABILITIES, reason=f"this CPU's OpenVINO capabilities are {', '.join(CAPABILITIES)}: "
                                           f"no {capability}")) for dtype, capability in CAPABILITY.items()]


def variance_model(path):
    """A harmless Convolution ("stem": half its integer input, exact in any type), then one near 100
    ("project") whose channel variance is E[x²]−E[x]²: rounding "project"'s output to the reduced type cancels
    the variance."""
    rng = np.random.default_rng(0)
    weights = {"stem_w": 0.5 * np.eye(16).reshape(16, 16, 1, 1), "project_w": rng.normal(0, 0.25, (16, 16, 1, 1)),
               "project_b": np.full(16, 100.0), "eps": np.array([1e-3])}
    nodes = [helper.make_node("Conv", ["x", "stem_w"], ["stem"], name="stem"),
             helper.make_node("Conv", ["stem", "project_w", "project_b"], ["h"], name="project"),
             helper.make_node("Mul", ["h", "h"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq"], ["meansq"], name="mean_of_squares", axes=[1]),
             helper.make_node("ReduceMean", ["h"], ["mean"], name="mean", axes=[1]),
             helper.make_node("Mul", ["mean", "mean"], ["mean2"], name="square_of_mean"),
             helper.make_node("Sub", ["meansq", "mean2"], ["var"], name="variance"),
             helper.make_node("Sub", ["h", "mean"], ["centered"], name="center"),
             helper.make_node("Add", ["var", "eps"], ["vareps"], name="add_eps"),
             helper.make_node("Sqrt", ["vareps"], ["std"], name="std"),
             helper.make_node("Div", ["centered", "std"], ["y"], name="normalize")]
    shape = [1, 16, 8, 8]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                      [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()],
                      path)


@pytest.mark.parametrize("dtype", DTYPES)
def test_precision_bisect_keeps_the_cancelling_convolution_in_f32_on_real_kernels(dtype, tmp_path):
    import openvino as ov

    model = variance_model(tmp_path / "variance.onnx")
    (tmp_path / "samples").mkdir()
    feeds = {"x": np.random.default_rng(1).integers(-8, 9, (1, 16, 8, 8)).astype(np.float32)}
    np.savez(tmp_path / "samples" / "sample0_inputs.npz", **feeds)
    folder = copy_workflow(tmp_path / "project")
    snakemake(folder, "precision_bisect", "--config", f"model={model}", f"samples={tmp_path / 'samples'}",
              "backend=openvino-cpu", f"precision={{dtype: {dtype}}}", "accuracy={rtol: 0.01, atol: 0.001}")
    results = folder / "results" / "precision_bisect"
    assert (results / "keep_dtype.txt").read_text() == "project\n"
    result = json.loads((results / "result.json").read_text())
    assert result["status"] == "fixed" and result["candidates"] >= 2, result
    assert result["final_verdict"]["passed"] and result["final_verdict"]["dropped"] == []
    assert not result["probes"][0]["passed"] and len(result["probes"]) < 10  # nothing kept fails; a few probes
    assert "passes the check" in (results / "summary.txt").read_text()

    core = ov.Core()  # the published IR, as a user loads it: the Convolution runs in f32, the stem reduced
    compiled = core.compile_model(core.read_model(str(results / "model.xml")), "CPU",
                                  {"INFERENCE_PRECISION_HINT": HINTS[dtype]})
    ran = {op.get_friendly_name(): op.get_rt_info()["runtimePrecision"].astype(str)
           for op in compiled.get_runtime_model().get_ordered_ops()}
    assert ran["project/WithoutBiases"] == "f32" and ran["stem"] == HINTS[dtype], ran
    reference = core.compile_model(str(model), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(feeds)[0]
    np.testing.assert_allclose(compiled(feeds)[0], reference, rtol=0.01, atol=0.001)
