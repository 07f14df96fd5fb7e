"""The graph stage's map from compiled nodes to original nodes: bounded on layout chains, one compiled node
per original node's work, names that exist in the model file.

The synthetic graphs are what ORT writes, built by hand (the map reads graphs, it runs nothing); the real
models are compiled at level `all` on this CPU, where NchwcTransformer rewrites their convolutions."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import onnx
import pytest
from corpus import CORPUS
from onnx import TensorProto, helper

from accubisect.core.graph_map import BoundaryMap, nested_nodes
from accubisect.core.onnx_graph import graph_nodes
from accubisect.formats.graph_record import GraphRecord
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.graph import GraphStep, describe, write_graph

NCHWC = "com.microsoft.nchwc"
FUSION_ON = {"name": "fusion_on", "level": "all", "session_config": {}, "rules_off": []}


def graph(nodes, inputs, outputs, initializers=()):
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])  # noqa: E731
    weights = [helper.make_tensor(name, TensorProto.FLOAT, [1], [1.0]) for name in initializers]
    return helper.make_graph(nodes, "g", [value(n) for n in inputs], [value(n) for n in outputs], weights)


def mapped(original, compiled):
    body = describe("fusion_on", original, compiled, [], {})
    return {node.name: list(node.original_nodes) for node in body.nodes}, list(body.eliminated_nodes)


def test_a_layout_chain_keeps_each_conv_to_its_own_nodes_and_pulls_in_no_joining_branch():
    """Original:  x ─ Conv c1 ─ BatchNormalization bn ─ Relu r1 ─ Conv c2 ─ Add(s) ─ Conv c3 ─ y
                  x ─ Neg n1 ─ s ───────────────────────────────────────────┘
    Compiled:     x ─ ReorderInput ─ Conv c1+bn+r1 ─ Conv c2+Sum ─ Conv c3 ─ ReorderOutput ─ y   (NCHWc)
                  x ─ Neg ─ s ─ ReorderInput ──────────────┘
    Every tensor inside the chain is new, so every node of it sees the far surviving output y; the Neg that
    joins it is another compiled node's work."""
    original = graph([
        helper.make_node("Conv", ["x", "w1"], ["t1"], name="c1"),
        helper.make_node("BatchNormalization", ["t1", "g", "b", "m", "v"], ["t2"], name="bn"),
        helper.make_node("Relu", ["t2"], ["t3"], name="r1"),
        helper.make_node("Conv", ["t3", "w2"], ["t4"], name="c2"),
        helper.make_node("Neg", ["x"], ["s"], name="n1"),
        helper.make_node("Add", ["t4", "s"], ["t5"], name="add"),
        helper.make_node("Conv", ["t5", "w3", "b3"], ["y"], name="c3"),
    ], ["x"], ["y"], ["w1", "w2", "w3", "b3", "g", "b", "m", "v"])
    compiled = graph([
        helper.make_node("ReorderInput", ["x"], ["x_b"], name="reorder_x", domain=NCHWC),
        helper.make_node("Conv", ["x_b", "w1_b", "bias1"], ["u1"], name="t3_nchwc", domain=NCHWC),
        helper.make_node("Neg", ["x"], ["s"], name="n1"),
        helper.make_node("ReorderInput", ["s"], ["s_b"], name="reorder_s", domain=NCHWC),
        helper.make_node("Conv", ["u1", "w2_b", "", "s_b"], ["u2"], name="t5_nchwc", domain=NCHWC),
        helper.make_node("Conv", ["u2", "w3_b", "b3"], ["u3"], name="y_nchwc", domain=NCHWC),
        helper.make_node("ReorderOutput", ["u3"], ["y"], name="reorder_y", domain=NCHWC),
    ], ["x"], ["y"], ["w1_b", "bias1", "w2_b", "w3_b", "b3"])
    nodes, eliminated = mapped(original, compiled)
    assert nodes == {"reorder_x": ["c1", "bn", "r1"], "t3_nchwc": ["c1", "bn", "r1"], "n1": ["n1"],
                     "reorder_s": ["c2", "add"], "t5_nchwc": ["c2", "add"], "y_nchwc": ["c3"], "reorder_y": ["c3"]}
    assert eliminated == []


def test_parallel_branches_pair_by_the_outputs_they_lead_to_not_by_file_order():
    """Original:  x ─ Conv a1 ─ Conv a2 ─ ya        Compiled (ORT interleaves the branches):
                  x ─ Conv b1 ─ Conv b2 ─ yb        b1, a1, b2, a2 in NCHWc between one ReorderInput and two
                                                    ReorderOutputs."""
    original = graph([
        helper.make_node("Conv", ["x", "wa1"], ["ta"], name="a1"),
        helper.make_node("Conv", ["ta", "wa2"], ["ya"], name="a2"),
        helper.make_node("Conv", ["x", "wb1"], ["tb"], name="b1"),
        helper.make_node("Conv", ["tb", "wb2"], ["yb"], name="b2"),
    ], ["x"], ["ya", "yb"], ["wa1", "wa2", "wb1", "wb2"])
    compiled = graph([
        helper.make_node("ReorderInput", ["x"], ["xb"], name="in", domain=NCHWC),
        helper.make_node("Conv", ["xb", "k1"], ["ub1"], name="B1", domain=NCHWC),
        helper.make_node("Conv", ["xb", "k2"], ["ua1"], name="A1", domain=NCHWC),
        helper.make_node("Conv", ["ub1", "k3"], ["ub2"], name="B2", domain=NCHWC),
        helper.make_node("Conv", ["ua1", "k4"], ["ua2"], name="A2", domain=NCHWC),
        helper.make_node("ReorderOutput", ["ub2"], ["yb"], name="out_b", domain=NCHWC),
        helper.make_node("ReorderOutput", ["ua2"], ["ya"], name="out_a", domain=NCHWC),
    ], ["x"], ["ya", "yb"], ["k1", "k2", "k3", "k4"])
    nodes, _ = mapped(original, compiled)
    assert {name: nodes[name] for name in ("A1", "A2", "B1", "B2", "out_a", "out_b")} == {
        "A1": ["a1"], "A2": ["a2"], "B1": ["b1"], "B2": ["b2"], "out_a": ["a2"], "out_b": ["b2"]}


def test_a_fused_activation_beside_the_conv_takes_the_ops_it_is_built_from():
    """Original:  x ─ Conv ─ BatchNormalization ─ Sigmoid ─ Mul ─ y (the Mul also reads the BN output)
    Compiled:     x ─ Conv(nchwc, BN folded) ─ QuickGelu ─ ReorderOutput ─ y"""
    original = graph([
        helper.make_node("Conv", ["x", "w"], ["t"], name="conv"),
        helper.make_node("BatchNormalization", ["t", "g", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Sigmoid", ["n"], ["s"], name="sig"),
        helper.make_node("Mul", ["n", "s"], ["y"], name="mul"),
    ], ["x"], ["y"], ["w", "g", "b", "m", "v"])
    compiled = graph([
        helper.make_node("Conv", ["x", "wb", "bb"], ["u"], name="n_nchwc", domain=NCHWC),
        helper.make_node("QuickGelu", ["u"], ["q"], name="mul/QuickGeluFusion", domain="com.microsoft"),
        helper.make_node("ReorderOutput", ["q"], ["y"], name="out", domain=NCHWC),
    ], ["x"], ["y"], ["wb", "bb"])
    nodes, _ = mapped(original, compiled)
    assert nodes == {"n_nchwc": ["conv", "bn"], "mul/QuickGeluFusion": ["sig", "mul"], "out": ["sig", "mul"]}


def test_constants_are_eliminated_and_unnamed_nodes_are_called_by_their_output():
    """Original (paddle2onnx style, Constant nodes unnamed):  Constant ─ k;  x ─ Mul(k) ─ m ─ Add(k2) ─ y
    Compiled:  x ─ Mul(k) ─ m ─ Add(k2) ─ y, with k and k2 initializers; the Add folded the second Constant."""
    const = lambda out: helper.make_node("Constant", [], [out], value=helper.make_tensor(  # noqa: E731
        "v", TensorProto.FLOAT, [1], [2.0]))
    original = graph([const("k"), const("k2"), helper.make_node("Mul", ["x", "k"], ["m"]),
                      helper.make_node("Add", ["m", "k2"], ["y"], name="add")], ["x"], ["y"])
    compiled = graph([helper.make_node("Mul", ["x", "k"], ["m"], name="m"),
                      helper.make_node("Add", ["m", "k3"], ["y"], name="add")], ["x"], ["y"], ["k", "k3"])
    nodes, eliminated = mapped(original, compiled)
    assert nodes == {"m": ["m"], "add": ["add"]}
    assert eliminated == ["k", "k2"]


# ---------------------------------------------------------------- real models, compiled at level all


@pytest.fixture(scope="module", params=["ppocr_rec", "ppocr_det", "yolov8n"])
def real(request, tmp_path_factory):
    """(model path, graph.json body) of a corpus model's fusion-on variant, compiled and mapped once."""
    model = CORPUS[request.param].model_path()
    folder = tmp_path_factory.mktemp(request.param)
    compile_variant(CompileStep(model, FUSION_ON, "ort-cpu", folder / "model.onnx", folder / "compile.json"))
    write_graph(GraphStep(model, folder / "model.onnx", folder / "compile.json", folder / "graph.json"))
    return model, GraphRecord.read(folder / "graph.json")


def original_nodes(model: Path):
    return {node.name: node for node in graph_nodes(onnx.load(str(model), load_external_data=False).graph)}


@pytest.mark.integration
def test_real_nchwc_convs_map_to_one_original_conv_each(real):
    model, body = real
    originals = original_nodes(model)
    convs = [node for node in body.nodes if node.domain == NCHWC and node.op_type == "Conv"]
    assert len(convs) >= 30  # NchwcTransformer fired on this CPU
    for conv in convs:
        absorbed = [originals[name].op_type for name in conv.original_nodes]
        assert absorbed.count("Conv") == 1 and len(absorbed) <= 4, (conv.name, conv.original_nodes)
        # ORT names an NCHWc node after the output of the (already fused) node it replaced
        outputs = {out for name in conv.original_nodes for out in originals[name].outputs}
        assert conv.name.removesuffix("_nchwc") in outputs, (conv.name, conv.original_nodes)


@pytest.mark.integration
def test_real_maps_are_bounded(real):
    model, body = real
    nodes = body.nodes
    assert max(len(node.original_nodes) for node in nodes) <= 9  # a LayerNormFusion's nine nodes at most
    claims = Counter(name for node in nodes for name in node.original_nodes)
    assert max(claims.values()) <= 3  # ReorderInput, the NCHWc node, ReorderOutput
    union = lambda chosen: len({name for node in chosen for name in node.original_nodes})  # noqa: E731
    for k in (16, 48):  # k compiled nodes, as a precision answer lists them, stand for about k original nodes
        assert all(union(nodes[start:start + k]) <= 3 * k for start in range(len(nodes) - k + 1))
    rng = random.Random(0)
    assert all(union(rng.sample(nodes, 48)) <= 3 * 48 for _ in range(100))


@pytest.mark.integration
def test_real_names_are_nodes_of_the_model_file(real):
    model, body = real
    proto = onnx.load(str(model), load_external_data=False).graph
    in_file = {node.name for node in proto.node if node.name}
    unnamed_outputs = {node.output[0] for node in proto.node if not node.name}
    constants = {name for name, node in original_nodes(model).items() if node.op_type == "Constant"}
    listed = {name for node in body.nodes for name in node.original_nodes}
    assert listed <= in_file | unnamed_outputs
    assert not listed & constants and constants <= set(body.eliminated_nodes)
    assert not any(name.startswith("Constant_") for name in listed | set(body.eliminated_nodes))
    # every original node is either some compiled node's work or eliminated, never both
    assert listed.isdisjoint(body.eliminated_nodes)
    assert listed | set(body.eliminated_nodes) == set(original_nodes(model))


@pytest.mark.integration
@pytest.mark.parametrize("name", ["ppocr_rec", "ppocr_det", "yolov8n"])
def test_real_model_against_itself_maps_each_node_to_itself(name):
    original = onnx.load(str(CORPUS[name].model_path()), load_external_data=False).graph
    mapper = BoundaryMap(original, original)
    for node in graph_nodes(original):
        assert mapper.original_nodes(node) == ([] if node.op_type == "Constant" else [node.name])


def test_nested_nodes_name_their_top_level_owner_and_the_path_down_to_them():
    """x ─ Loop(body: If(then: Relu, else: Neg)) ─ y, and a top-level Sigmoid: the nodes inside, at any depth."""
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])  # noqa: E731
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="relu")], "then", [], [value("t")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")], "else", [], [value("e")])
    body = helper.make_graph([helper.make_node("If", ["c"], ["b"], then_branch=then, else_branch=other, name="pick"),
                              helper.make_node("Identity", ["c"], ["c_out"], name="keep")], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), value("b")])
    nodes = [helper.make_node("Loop", ["", "cond"], ["y"], body=body, name="loop"),
             helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid")]
    top = helper.make_graph(nodes, "m", [value("x"), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                            [value("y"), value("s")])
    found = [(n.owner.name, n.subgraph, n.node.name) for n in nested_nodes(top)]
    assert sorted(found) == [("loop", "body", "keep"), ("loop", "body", "pick"),
                             ("loop", "body/pick/else_branch", "neg"), ("loop", "body/pick/then_branch", "relu")]
