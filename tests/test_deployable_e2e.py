"""The precision answer holds where it is deployed: the real `snakemake precision_bisect` on a model whose
compiled graph passes in fp16 while the user's own graph, which the deployable model is made from, does not."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from conftest import copy_workflow, save_model, snakemake
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.e2e


def conv_batchnorm(path):
    """x ─ Conv(w ~ 300) ─ BatchNormalization(variance 1e8) ─ y. ConvBNFusion folds the BatchNorm into the
    Conv's weights, so the compiled graph never holds the variance; in the model's own graph it becomes inf
    in fp16 and wipes out the output."""
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], name="bn")]
    inits = [const("w", rng.normal(0, 300, (4, 3, 3, 3))), const("scale", np.full(4, 10.0)),
             const("bias", rng.normal(0, 0.1, 4)), const("mean", np.zeros(4)), const("var", np.full(4, 1e8))]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits, path)


def shifted_sum(path):
    """x ─ MatMul(w) ─ Add(b ≈ 1e5) ─ Sub(1e5) ─ y. MatMulAddFusion makes MatMul and Add one Gemm, which must stay
    fp32 with the Sub (the bias and the sum overflow fp16): three of the model's nodes. In the model's own
    graph the MatMul's small output fits fp16, so the answer there is Add and Sub."""
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["shifted"], name="add"),
             helper.make_node("Sub", ["shifted", "c"], ["y"], name="sub")]
    inits = [const("w", rng.normal(0, 1, (8, 8))), const("b", 1e5 + rng.normal(0, 1, 8)), const("c", np.full(8, 1e5))]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits, path)


def project(folder, build, name, shape):
    """`name`.onnx made by `build`, two seeded samples in `name`_samples, and `name`.yaml naming them, judged
    at tolerances fp16 can meet, publishing to results/`name`."""
    build(folder / f"{name}.onnx")
    (folder / f"{name}_samples").mkdir()
    for index in range(2):
        np.savez(folder / f"{name}_samples" / f"sample{index}_inputs.npz",
                 x=np.random.default_rng(index).normal(0, 1, shape).astype(np.float32))
    config = {"model": f"{name}.onnx", "samples": f"{name}_samples", "results": f"results/{name}",
              "accuracy": {"rtol": 1e-2, "atol": 5e-2}}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("deployed"))
    project(folder, conv_batchnorm, "cbn", (1, 3, 8, 8))
    run = snakemake(folder, "precision_bisect", "--configfile", "cbn.yaml")
    return folder, run


def test_an_answer_that_fails_in_the_deployable_model_is_searched_again_there(folded):
    """The compiled graph passes with nothing kept; carried to the user's graph that fails, so the search runs
    again over the user's nodes and keeps the BatchNorm: result.json, keep_dtype.txt, finalize.json and the
    summary all tell that one answer, and none says the model passes as it is."""
    folder, run = folded
    base = folder / "results/cbn/precision_bisect"
    result = json.loads((base / "result.json").read_text())
    assert result["assigned"]["culprits"] == [] and result["deployed"]["how"] == "searched again"
    assert not result["deployed"]["carried_verdict"]["passed"]
    assert result["status"] == "fixed" and result["culprits"] == ["bn"] and result["final_verdict"]["passed"]
    assert (base / "keep_dtype.txt").read_text() == "bn\n"
    assert json.loads((base / "finalize.json").read_text())["passed"]
    summary = (base / "summary.txt").read_text()
    assert "nothing to fix" not in summary and "passes the accuracy check" not in summary
    assert "keep 1 of 2 nodes in fp32 (bn;" in summary and "FAILS the check" in summary
    assert "nothing to fix" not in run.stdout + run.stderr


def test_the_published_model_keeps_the_variance_exact_and_passes_at_every_level(folded):
    folder, _ = folded
    model = onnx.load(folder / "results/cbn/precision_bisect/model.onnx")
    types = {init.name: init.data_type for init in model.graph.initializer}
    assert types["var"] == TensorProto.FLOAT and types["w/as_float16"] == TensorProto.FLOAT16
    x = np.load(folder / "cbn_samples/sample0_inputs.npz")["x"]
    expected = ort.InferenceSession(str(folder / "cbn.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(str(folder / "results/cbn/precision_bisect/model.onnx"), options,
                                       providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, {"x": x})[0], expected[0], rtol=1e-2, atol=1e-2)
