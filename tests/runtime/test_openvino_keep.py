"""Keeping an executed node in f32 on OpenVINO's CPU plugin (runtime/openvino_keep.py), on real bf16 compiles:
a node a fusion rebuilds under a name of the plugin's own is kept by marking the ONNX nodes it stands for,
where its `originalLayersNames` name nothing the IR holds; what ran is read back from the runtime graph."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import save_float_model
from onnx import helper

from accubisect.runtime.openvino_backend import cpu_capabilities, onnx_graph_of
from accubisect.runtime.openvino_graph import executed_graph, original_nodes, rt_text
from accubisect.runtime.openvino_keep import MarkedIR, marked_layers, reduced_nodes

CAPABILITIES = cpu_capabilities()
pytestmark = pytest.mark.skipif("BF16" not in CAPABILITIES,
                                reason=f"this CPU's OpenVINO capabilities lack BF16: {CAPABILITIES}")


def depthwise_block(path):
    """A pointwise Convolution, then a depthwise one scaled, shifted and rectified (a BatchNormalization as
    paddle2onnx writes it), then another pointwise one: the plugin folds the scale into the depthwise weights,
    building a Convolution named after an invented `Multiply_N`, as in ppocr_rec.

        x ─ Conv "pw" ─ Conv "dw" (group 32) ─ Mul "bn_scale" ─ Add "bn_shift" ─ Relu ─ Conv "pw2" ─ y
    """
    rng = np.random.default_rng(0)
    weights = {"pw_w": rng.normal(0, 0.2, (32, 32, 1, 1)), "pw_b": rng.normal(0, 0.1, 32),
               "dw_w": rng.normal(0, 0.3, (32, 1, 3, 3)), "dw_b": rng.normal(0, 0.1, 32),
               "scale": rng.uniform(0.5, 2, (1, 32, 1, 1)), "shift": rng.normal(0, 0.1, (1, 32, 1, 1)),
               "pw2_w": rng.normal(0, 0.2, (32, 32, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "pw_w", "pw_b"], ["a"], name="pw"),
             helper.make_node("Conv", ["a", "dw_w", "dw_b"], ["b"], name="dw", group=32, pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["b", "scale"], ["c"], name="bn_scale"),
             helper.make_node("Add", ["c", "shift"], ["d"], name="bn_shift"),
             helper.make_node("Relu", ["d"], ["e"], name="relu"),
             helper.make_node("Conv", ["e", "pw2_w"], ["y"], name="pw2")]
    shape = [1, 32, 16, 16]
    return save_float_model(nodes, weights, shape, path)


def test_a_node_a_fusion_rebuilds_is_kept_by_marking_the_onnx_nodes_it_stands_for(tmp_path):
    model = depthwise_block(tmp_path / "block.onnx")
    ir = MarkedIR(model)
    read = ir.read()
    graph = executed_graph(read, ir.compile({}, "bf16", 1).compiled.get_runtime_model())
    onnx_graph, ops = onnx_graph_of(model).graph, read.get_ordered_ops()
    mapped = original_nodes(onnx_graph, ops, graph)
    folded = next(node for node in graph.nodes if "dw" in mapped[node.name])
    assert folded.name in reduced_nodes(graph) and folded.layer_type == "Convolution"
    in_ir = {op.get_friendly_name() for op in ops}
    assert "dw" not in folded.original_layers and set(folded.original_layers) - in_ir, folded  # an invented name

    layers = marked_layers(ops, onnx_graph, graph, mapped)[folded.name]
    assert {"dw", "bn_scale", "bn_shift", "relu"} <= set(layers) <= in_ir, layers
    assert {op.get_type_name() for op in ops if op.get_friendly_name() in layers}.isdisjoint(
        {"Constant", "Parameter", "Result"})
    assert ir.compile({folded.name: folded.original_layers}, "bf16", 1).dropped == (folded.name,)
    kept = ir.compile({folded.name: layers}, "bf16", 1)
    assert kept.dropped == ()
    ran = {rt_text(op, "originalLayersNames"): rt_text(op, "runtimePrecision")
           for op in kept.compiled.get_runtime_model().get_ordered_ops() if rt_text(op, "layerType") == "Convolution"}
    assert [precision for names, precision in ran.items() if "bn_shift" in names.split(",")] == ["f32"], ran
    assert sorted(ran.values()) == ["bf16", "bf16", "f32"], ran  # the pointwise Convolutions stay reduced
