import dataclasses
import json
import random

import pytest
from conftest import EXAMPLE_MODEL, GELU_APPROXIMATION
from onnx import TensorProto, helper

from accubisect.core.errors import WorkspaceError
from accubisect.core.onnx_graph import graph_nodes, name_nodes_uniquely, topological_order
from accubisect.formats.compile_record import CompileRecord
from accubisect.formats.graph_record import GraphRecord
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.graph import GraphStep, write_graph

FUSION_ON = {"name": "fusion_on", "level": "all", "session_config": GELU_APPROXIMATION, "rules_off": []}


def compile_and_map(model, tmp_path, variant=FUSION_ON):
    folder = tmp_path / variant["name"]
    compile_variant(CompileStep(model, variant, "ort-cpu", folder / "model.onnx", folder / "compile.json"))
    write_graph(GraphStep(model, folder / "model.onnx", folder / "compile.json", folder / "graph.json"))
    return CompileRecord.read(folder / "compile.json"), GraphRecord.read(folder / "graph.json")


def by_op(graph, op_type):
    return [node for node in graph.nodes if node.op_type == op_type]


def test_example_fires_the_fusions_it_was_built_for(tmp_path):
    record, _ = compile_and_map(EXAMPLE_MODEL, tmp_path)
    fired = record.fired_rules
    for rule in ("MatMulAddFusion", "LayerNormFusion", "GeluFusion", "ConvActivationFusion", "ConvBNFusion",
                 "GeluApproximation"):
        assert rule in fired
    assert fired.index("GeluFusion") < fired.index("GeluApproximation")  # the order ORT applied them


def test_fusion_off_fires_nothing_and_maps_each_node_to_itself(ffn_model, tmp_path):
    off = {"name": "fusion_off", "level": "off", "session_config": {}, "rules_off": []}
    record, graph = compile_and_map(ffn_model, tmp_path, off)
    assert record.fired_rules == ()
    assert [(n.name, n.original_nodes, n.rule) for n in graph.nodes] == [
        (name, (name,), None) for name in ("mm", "bias", "gelu/div", "gelu/erf", "gelu/add", "gelu/mul", "gelu/half",
                                          "relu")]


def test_fused_nodes_map_to_the_original_nodes_they_absorbed(ffn_model, tmp_path):
    _, graph = compile_and_map(ffn_model, tmp_path)
    (gemm,) = by_op(graph, "Gemm")
    assert gemm.original_nodes == ("mm", "bias") and gemm.rule == "MatMulAddFusion"
    for reshape in by_op(graph, "Reshape"):  # ORT's glue around the Gemm belongs to the same fusion
        assert reshape.original_nodes == ("mm", "bias")
    (gelu,) = by_op(graph, "FastGelu")
    assert gelu.original_nodes == ("gelu/div", "gelu/erf", "gelu/add", "gelu/mul", "gelu/half")
    assert gelu.rule == "GeluApproximation" and "GeluFusion" in gelu.rules
    (relu,) = by_op(graph, "Relu")
    assert relu.original_nodes == ("relu",) and relu.rule is None
    assert graph.eliminated_nodes == ()


def test_switching_a_rule_off_changes_the_rule_of_the_node(ffn_model, tmp_path):
    variant = {**FUSION_ON, "rules_off": ["GeluApproximation"]}
    record, graph = compile_and_map(ffn_model, tmp_path, variant)
    assert "GeluApproximation" not in record.fired_rules
    assert record.disabled_optimizers == ("GeluApproximation",)
    (gelu,) = by_op(graph, "Gelu")
    assert gelu.rule == "GeluFusion"


def test_topological_order_sorts_a_shuffled_graph():
    """a ─ Relu ─ b ─ Neg ─ c ─ Abs ─ d, stored in reverse order."""
    nodes = [helper.make_node("Abs", ["c"], ["d"], name="abs"), helper.make_node("Neg", ["b"], ["c"], name="neg"),
             helper.make_node("Relu", ["a"], ["b"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1])])
    assert [node.name for node in topological_order(graph)] == ["relu", "neg", "abs"]


def test_unnamed_and_duplicate_nodes_are_called_by_their_first_output():
    """a ─ Relu ─ b ─ Neg "x" ─ c ─ Abs "x" ─ d ─ Sqrt ─ e ─ Exp "e" ─ g: the unnamed Relu and the two "x" take
    their outputs' names; the unnamed Sqrt's output "e" is the Exp's name, so it is `<op_type>_<index>`."""
    nodes = [helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Neg", ["b"], ["c"], name="x"),
             helper.make_node("Abs", ["c"], ["d"], name="x"), helper.make_node("Sqrt", ["d"], ["e"]),
             helper.make_node("Exp", ["e"], ["g"], name="e")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("g", TensorProto.FLOAT, [1])])
    assert [node.name for node in graph_nodes(graph)] == ["b", "c", "d", "Sqrt_3", "e"]
    name_nodes_uniquely(graph)  # what ORT and the deployable model are given: the same names
    assert [node.name for node in graph.node] == ["", "c", "d", "", "e"]
    assert [node.name for node in graph_nodes(graph)] == ["b", "c", "d", "Sqrt_3", "e"]


def test_a_same_name_is_no_claim_on_an_unnamed_nodes_output_name():
    """a ─ Relu ─ x ─ Neg "x" ─ c ─ Abs "x" ─ d: the unnamed Relu writes "x", which the two Neg/Abs share as
    a name; they are renamed, so the Relu is "x" before and after `name_nodes_uniquely`."""
    nodes = [helper.make_node("Relu", ["a"], ["x"]), helper.make_node("Neg", ["x"], ["c"], name="x"),
             helper.make_node("Abs", ["c"], ["d"], name="x")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1])])
    assert [node.name for node in graph_nodes(graph)] == ["x", "c", "d"]
    name_nodes_uniquely(graph)
    assert [node.name for node in graph_nodes(graph)] == ["x", "c", "d"]


@pytest.mark.parametrize("seed", range(5))
def test_topological_order_is_valid_for_random_dags(seed):
    rng = random.Random(seed)
    nodes = []
    for i in range(30):
        sources = ["in"] + [f"t{j}" for j in range(i)]
        nodes.append(helper.make_node("Sum", rng.sample(sources, min(len(sources), rng.randint(1, 3))), [f"t{i}"]))
    rng.shuffle(nodes)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("in", TensorProto.FLOAT, [1])], [])
    done = {"in"}
    for node in topological_order(graph):
        assert set(node.input) <= done
        done |= set(node.output)


def test_the_graph_stage_reuses_the_compile_stages_single_rule_compiles(tmp_path):
    """A rewrite rule found by compiling without it is not compiled without again: the record keeps that
    graph's node signatures, and the graph JSON is the one fresh differential compiles give."""
    record, graph = compile_and_map(EXAMPLE_MODEL, tmp_path)
    assert "ConvBNFusion" in record.without_rules and set(record.without_rules) <= set(record.fired_rules)
    folder = tmp_path / "fusion_on"
    dataclasses.replace(record, without_rules={}).write(folder / "compile.json")
    write_graph(GraphStep(EXAMPLE_MODEL, folder / "model.onnx", folder / "compile.json", folder / "fresh.json"))
    assert GraphRecord.read(folder / "fresh.json") == graph


@pytest.mark.parametrize(("change", "why"), [
    ({"format": 2}, "format 2, this version reads format 1"),
    ({"format": None}, "no format, this version reads format 1"),
    ({"fired_rules": None}, "no field 'fired_rules'"),
])
def test_a_record_of_another_version_is_refused_in_one_line_naming_the_folder(ffn_model, tmp_path, change, why):
    record, _ = compile_and_map(ffn_model, tmp_path)
    path = tmp_path / "fusion_on" / "compile.json"
    written = {key: value for key, value in {**json.loads(path.read_text()), **change}.items() if value is not None}
    path.write_text(json.dumps(written))
    with pytest.raises(WorkspaceError) as error:
        CompileRecord.read(path)
    assert str(error.value) == (f"{path}: not a compile record of this accubisect version ({why}); "
                                f"delete {path.parent} and rerun to rebuild it")
