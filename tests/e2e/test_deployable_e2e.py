"""The precision answer holds where it is deployed: the real `snakemake precision_bisect` on a model whose
compiled graph passes in fp16 while the user's own graph, which the deployable model is made from, does not."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import copy_workflow, snakemake
from deploy_models import conv_batchnorm, project
from onnx import TensorProto

pytestmark = pytest.mark.e2e


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
