"""The real `snakemake precision` and `precision_bisect` on models with genuine fp16 problems."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from conftest import copy_workflow, save_model, snakemake
from onnx import TensorProto, helper, numpy_helper

from accubisect.bisection.deployable import mixlist_suggestion
from accubisect.formats.bisect_result import PrecisionResult

pytestmark = pytest.mark.e2e
KEPT = {"bn", "energy/square", "energy/sum", "energy/sqrt"}


def results(folder, name="results/precision_example"):
    return folder / name / "precision_bisect"


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("precision"))
    run = snakemake(folder, "precision_bisect", "--configfile", "examples/precision/config.yaml")
    return folder, run


def test_example_keeps_the_batchnorm_and_the_energy_in_fp32(example):
    folder, run = example
    base = results(folder)
    assert set(base.joinpath("keep_dtype.txt").read_text().split()) == KEPT
    result = PrecisionResult.read(base / "result.json")
    assert result.kept_fp32 == "4 of 13 nodes" and result.final_verdict.passed
    assert result.status == "fixed" and "keep 4 of 13 nodes in fp32" in run.stdout
    assert json.loads(base.joinpath("finalize.json").read_text())["passed"]
    assert json.loads(base.joinpath("modify_mixlist.json").read_text()) == {"black-list": {"to-add": []}}
    ranking = [entry["name"] for entry in result.ranking]
    assert set(ranking[:4]) == KEPT  # the largest local errors: guidance put the culprits first


def test_finalized_model_is_real_fp16_and_loads_in_ort(example):
    folder, _ = example
    model = onnx.load(results(folder) / "model.onnx")
    types = {init.name: init.data_type for init in model.graph.initializer}
    assert types["bn/var"] == TensorProto.FLOAT  # the node kept in fp32 keeps its constant exact
    assert TensorProto.FLOAT16 in types.values()
    session = ort.InferenceSession(str(results(folder) / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.load(folder / "examples/precision/samples/sample0_inputs.npz")["x"]
    golden = np.load(folder / "examples/precision/samples/sample0_outputs.npz")["y"]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], golden, rtol=1e-2, atol=1e-2)


def test_keep_dtype_fed_back_makes_the_precision_comparison_pass(example):
    folder, _ = example
    config = yaml.safe_load((folder / "examples/precision/config.yaml").read_text())
    kept = results(folder).joinpath("keep_dtype.txt").read_text().split()
    config["precision"]["keep_dtype"] = kept
    config["results"] = "fixed"
    (folder / "fixed.yaml").write_text(yaml.safe_dump(config))
    snakemake(folder, "precision", "--configfile", "fixed.yaml")
    assert json.loads((folder / "fixed/precision/report.json").read_text())["passed"]


def test_precision_comparison_reports_local_errors_and_statistics(example):
    folder, _ = example
    report = json.loads((folder / "results/precision_example/precision/report.json").read_text())
    bn = next(row for row in report["tensors"] if row["node"] == "bn")
    assert bn["local"]["rel_euclidean"] == pytest.approx(1.0)  # on exact inputs its output is wiped out
    assert {"overflow_ref", "overflow_cand", "underflow_cand", "nan_cand", "inf_cand"} <= set(bn["worst"])
    gain = next(row for row in report["tensors"] if row["node"] == "gain")
    assert gain["local"]["rel_euclidean"] < 1e-3 and gain["worst"]["mismatch"] > 0.5  # inherited


def layer_norm_without_eps(path):
    """x ─ ReduceMean ─ Sub ─ Mul(itself) ─ ReduceMean ─ Sqrt ─ Div ─ y: squares near 1e6 overflow fp16."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], name="ln/mean"),
             helper.make_node("Sub", ["x", "mean"], ["centered"], name="ln/sub"),
             helper.make_node("Mul", ["centered", "centered"], ["square"], name="ln/square"),
             helper.make_node("ReduceMean", ["square"], ["var"], axes=[-1], name="ln/var"),
             helper.make_node("Sqrt", ["var"], ["std"], name="ln/sqrt"),
             helper.make_node("Div", ["centered", "std"], ["y"], name="ln/div")]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], [], path)


def test_layer_norm_overflow_needs_at_most_three_fp32_nodes(tmp_path):
    folder = copy_workflow(tmp_path)
    layer_norm_without_eps(folder / "ln.onnx")
    (folder / "ln_samples").mkdir()
    for index in range(2):
        np.savez(folder / "ln_samples" / f"sample{index}_inputs.npz",
                 x=np.random.default_rng(index).normal(0, 1000, (2, 64)).astype(np.float32))
    config = {"model": "ln.onnx", "samples": "ln_samples", "precision": {"mode": "force_fp16"},
              "accuracy": {"rtol": 1e-2, "atol": 1e-2}}
    (folder / "mine.yaml").write_text(yaml.safe_dump(config))
    snakemake(folder, "precision_bisect", "--configfile", "mine.yaml")
    result = PrecisionResult.read(folder / "results/precision_bisect/result.json")
    assert 1 <= len(result.culprits) <= 3 and result.final_verdict.passed
    assert set(result.culprits) <= {"ln/square", "ln/var", "ln/sqrt"}


def test_whole_op_types_are_suggested_for_the_black_list():
    op_types = {"a": "Exp", "b": "Exp", "c": "Mul", "d": "Pow", "e": "Pow"}
    assert mixlist_suggestion(["a", "b", "d"], ["a", "b", "c", "d", "e"], op_types) == ["Exp"]
    assert mixlist_suggestion(["c"], ["a", "b", "c", "d", "e"], op_types) == []  # one node: keep_dtype is enough


def test_exporter_quirks_unnamed_duplicate_and_constant_nodes(tmp_path):
    """Nodes without names, two nodes sharing a name, and a constant as a Constant node, not an initializer:
        x ─ Mul(Constant 300) ─ Mul(itself) ─ ReduceSum ─ Sqrt ─ y"""
    big = numpy_helper.from_array(np.array(300.0, np.float32), "big_value")
    nodes = [helper.make_node("Constant", [], ["big"], value=big),
             helper.make_node("Mul", ["x", "big"], ["g"], name="same"),
             helper.make_node("Mul", ["g", "g"], ["sq"], name="same"),
             helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
             helper.make_node("Sqrt", ["s"], ["y"])]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    folder = copy_workflow(tmp_path)
    save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], [axes], folder / "quirks.onnx")
    (folder / "q").mkdir()
    np.savez(folder / "q" / "sample0_inputs.npz", x=np.random.default_rng(0).normal(0, 3, (1, 16)).astype(np.float32))
    config = {"model": "quirks.onnx", "samples": "q", "compile": {"level": "basic"},
              "precision": {"mode": "force_fp16"}, "accuracy": {"rtol": 1e-2, "atol": 1e-2}}
    (folder / "mine.yaml").write_text(yaml.safe_dump(config))
    snakemake(folder, "precision_bisect", "--configfile", "mine.yaml")
    result = PrecisionResult.read(folder / "results/precision_bisect/result.json")
    assert result.final_verdict.passed and result.culprits
    assert len(set(result.candidates)) == len(result.candidates)  # duplicate names made unique


def test_a_model_that_already_passes_is_a_result_not_a_crash(example):
    """With the four nodes the example needs already kept, force_fp16 passes: nothing to fix, exit 0."""
    folder, _ = example
    config = yaml.safe_load((folder / "examples/precision/config.yaml").read_text())
    config["precision"]["keep_dtype"] = sorted(KEPT)
    config["results"] = "healthy"
    (folder / "healthy.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(folder, "precision_bisect", "--configfile", "healthy.yaml")
    base = folder / "healthy/precision_bisect"
    assert PrecisionResult.read(base / "result.json").status == "nothing to fix"
    assert base.joinpath("keep_dtype.txt").read_text() == "" and "nothing to fix" in run.stdout
    assert json.loads(base.joinpath("finalize.json").read_text())["passed"]


def test_precision_on_the_original_graph_is_said_and_its_keep_dtype_fed_back_passes(example):
    """precision.graph: original assigns precision before fusion: ConvBNFusion cannot fold the BatchNorm
    whose variance overflows fp16, and keep_dtype names the model's own nodes."""
    folder, _ = example
    config = yaml.safe_load((folder / "examples/precision/config.yaml").read_text())
    config["precision"]["graph"] = "original"
    config["results"] = "unfused"
    (folder / "unfused.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(folder, "precision_bisect", "--configfile", "unfused.yaml")
    assert "precision assigned on the original graph" in run.stdout
    kept = folder.joinpath("unfused/precision_bisect/keep_dtype.txt").read_text().split()
    assert "bn" in kept
    config["precision"]["keep_dtype"] = kept
    config["results"] = "unfused_fed_back"
    (folder / "unfused_fed_back.yaml").write_text(yaml.safe_dump(config))
    snakemake(folder, "precision", "--configfile", "unfused_fed_back.yaml")
    assert json.loads((folder / "unfused_fed_back/precision/report.json").read_text())["passed"]
