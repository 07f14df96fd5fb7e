"""A rule that fires inside an If branch is counted among its instances, and the line that says why no
hybrid passes says where it is: instances inside a subgraph cannot be reverted alone today (issue 21, item 9).

    x ─┬─ MatMul(0.05·Q) ─ Gelu ─ y                 <- small inputs: the tanh form agrees, harmless
       └─ ReduceSum ─ Greater(-1e9) ─ If ─ z        <- always takes then_branch:
                                          then: MatMul(3·Q) ─ Gelu    (inputs up to ±15: breaks)
                                          else: Identity

With `optimization.enable_gelu_approximation`, GeluApproximation turns both Gelu into FastGelu, the one in the
branch inside the If's subgraph. The rule is the culprit; reverting the top-level instance still fails, and the
branch's instance cannot be reverted, so hybrid.onnx is the rule-level answer.
"""

import numpy as np
import onnx
import pytest
import yaml
from conftest import copy_workflow, snakemake
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.instances import InstancesRecord

pytestmark = pytest.mark.e2e


def _gelu(prefix: str, source: str, out: str) -> list[onnx.NodeProto]:
    return [helper.make_node("Div", [source, "sqrt2"], [f"{prefix}/g0"], name=f"{prefix}/div"),
            helper.make_node("Erf", [f"{prefix}/g0"], [f"{prefix}/g1"], name=f"{prefix}/erf"),
            helper.make_node("Add", [f"{prefix}/g1", "one"], [f"{prefix}/g2"], name=f"{prefix}/add"),
            helper.make_node("Mul", [source, f"{prefix}/g2"], [f"{prefix}/g3"], name=f"{prefix}/mul"),
            helper.make_node("Mul", [f"{prefix}/g3", "half"], [out], name=f"{prefix}/half")]


def gelu_in_branch_model(path):
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    rotation = np.linalg.qr(np.random.default_rng(0).normal(size=(16, 16)))[0]
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 8, 16])  # noqa: E731
    then = helper.make_graph([helper.make_node("MatMul", ["x", "wide"], ["then/h"], name="then/matmul"),
                              *_gelu("then/gelu", "then/h", "then/z")], "then", [], [value("then/z")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["else/z"], name="else/id")], "else", [],
                              [value("else/z")])
    nodes = [helper.make_node("MatMul", ["x", "narrow"], ["h"], name="matmul"), *_gelu("gelu", "h", "y"),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "low"], ["cond"], name="greater"),
             helper.make_node("If", ["cond"], ["z"], then_branch=then, else_branch=other, name="branch")]
    graph = helper.make_graph(nodes, "gelu_in_branch", [value("x")], [value("y"), value("z")],
                              [const("narrow", 0.05 * rotation), const("wide", 3.0 * rotation),
                               const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5), const("low", -1e9)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def branch_run(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("gelu_in_branch"))
    model = gelu_in_branch_model(folder / "branch.onnx")
    (folder / "branch_samples").mkdir()
    reference, rng = ReferenceEvaluator(str(model)), np.random.default_rng(3)
    for index in range(2):
        x = rng.normal(0, 1.5, (1, 8, 16)).astype(np.float32)
        np.savez(folder / "branch_samples" / f"sample{index}_inputs.npz", x=x)
        np.savez(folder / "branch_samples" / f"sample{index}_outputs.npz",
                 **dict(zip(["y", "z"], reference.run(None, {"x": x}), strict=True)))
    config = {"model": "branch.onnx", "samples": "branch_samples",
              "compile": {"session_config": {"optimization.enable_gelu_approximation": "1"}}}
    (folder / "branch.yaml").write_text(yaml.safe_dump(config))
    return folder, snakemake(folder, "fusion_bisect", "--configfile", "branch.yaml")


def test_the_graph_record_lists_the_fused_node_inside_the_branch(branch_run):
    folder, _ = branch_run
    graph = next(record for record in map(GraphRecord.read, (folder / "workspace/graph").glob("*/graph.json"))
                 if record.variant == "fusion_on")
    assert [(n.owner, n.subgraph, n.op_type, n.rules) for n in graph.nested] == [
        ("branch", "then_branch", "FastGelu", ("GeluFusion", "GeluApproximation"))]


def test_an_instance_inside_an_if_branch_counts_and_the_fallback_says_why_it_stays(branch_run):
    folder, run = branch_run
    record = InstancesRecord.read(folder / "results/fusion_bisect/instances.json")
    assert record.culprit_rules == ("GeluApproximation",)
    instances = record.of_rule("GeluApproximation")
    assert len(instances) == 2 == record.rules_view()["GeluApproximation"]["instances"]
    inside = [i for i in instances if i.name.startswith("branch/then_branch/")]
    assert len(inside) == 1 and "inside the then_branch of branch" in inside[0].not_revertable
    assert "cannot be reverted alone today" in inside[0].not_revertable
    text = (folder / "results/fusion_bisect/instances.txt").read_text()
    assert ("reverting all 1 revertable instance(s) still fails; 1 cannot be reverted alone, 1 of them inside "
            "subgraphs (If, Loop, Scan), where reverting is not supported yet") in text
    assert "Traceback" not in run.stdout + run.stderr
