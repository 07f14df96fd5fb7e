"""Finalizing follows each op's schema: tensors an op must read or write in fp32 stay fp32, so the
mixed-precision model passes onnx.checker with full inference and loads in ONNX Runtime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accubisect.bisection.deploy_probes import original_low_nodes
from accubisect.bisection.deploy_publish import verify
from accubisect.bisection.judging import SampleJudge
from accubisect.core.errors import FinalizeError
from accubisect.formats.config import validate_config
from accubisect.formats.graph_record import GraphNode, GraphRecord
from accubisect.runtime.backends import CPU
from accubisect.runtime.finalize import finalize
from accubisect.runtime.op_schema import low_slots
from accubisect.runtime.ort_compile import CompileOptions

ACCURACY = validate_config({"model": "m", "samples": "s"})["accuracy"]


def exporter_quirks_model() -> onnx.ModelProto:
    """What real exporters write and a naive converter breaks:

        x ─ Resize(scales: float only) ─ Mul(w) ─ r
        n (int64) ─ Cast(to=FLOAT) ─ Add(r) ─ y        Range(start, limit, delta: no fp16) ─ steps
    """
    const = lambda name, value, dtype=np.float32: numpy_helper.from_array(np.asarray(value, dtype), name)  # noqa: E731
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest", name="resize"),
        helper.make_node("Mul", ["up", "w"], ["r"], name="scale"),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Add", ["r", "nf"], ["y"], name="add"),
        helper.make_node("Range", ["start", "limit", "delta"], ["steps"], name="range"),
    ]
    graph = helper.make_graph(
        nodes, "quirks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4]),
         helper.make_tensor_value_info("steps", TensorProto.FLOAT, [3])],
        [const("scales", [1, 1, 2, 2]), const("w", 3.0), const("start", 0.0), const("limit", 3.0),
         const("delta", 1.0)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


DTYPES = {name: "float32" for name in ("x", "scales", "up", "w", "r", "nf", "y", "start", "limit", "delta", "steps")}
DTYPES["n"] = "int64"


def test_slots_follow_the_schema():
    model = exporter_quirks_model()
    resize, _, cast, _, range_ = model.graph.node
    opsets = {"": 17}
    assert low_slots(resize, opsets, DTYPES, "fp16").inputs == {0}  # scales: tensor(float) only
    assert low_slots(cast, opsets, DTYPES, "fp16").outputs == frozenset()  # `to` decides: stays fp32
    assert low_slots(range_, opsets, DTYPES, "fp16").outputs == frozenset()  # no fp16 Range
    unknown = helper.make_node("Conv", ["x", "w"], ["y"], domain="com.microsoft.nchwc")
    assert low_slots(unknown, opsets, DTYPES, "fp16").outputs == frozenset()  # fp32-only kernels


def test_every_node_reduced_still_gives_a_valid_model_that_runs():
    model = exporter_quirks_model()
    final = finalize(model, {node.name for node in model.graph.node}, "fp16", DTYPES)
    onnx.checker.check_model(final, full_check=True)
    types = {init.name: init.data_type for init in final.graph.initializer}
    assert types["scales"] == TensorProto.FLOAT and types["w/as_float16"] == TensorProto.FLOAT16
    session = ort.InferenceSession(final.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    y, steps = session.run(None, {"x": x, "n": np.array([2], np.int64)})
    assert y.dtype == np.float32 and y[0, 0, 0, 1] == 3 * x[0, 0, 0, 0] + 2
    np.testing.assert_array_equal(steps, [0, 1, 2])


def test_original_nodes_of_a_compiled_node_kept_in_fp32_stay_fp32():
    graph = GraphRecord("fusion_on", (), tuple(
        GraphNode(index, name, "Op", "ai.onnx", (), (), originals, None, ()) for index, (name, originals) in enumerate([
            ("FusedConv_0", ("conv1", "relu1")), ("ReorderInput_1", ("conv2",)), ("Conv_nchwc_2", ("conv2",)),
            ("Gemm_3", ("matmul", "add"))])))
    assert original_low_nodes(graph, {"FusedConv_0", "ReorderInput_1", "Gemm_3"}) == {"conv1", "relu1", "matmul",
                                                                                      "add"}


def test_a_model_ort_refuses_fails_in_one_line_naming_the_node_and_op_type(tmp_path):
    """What a converter that ignored the schema would write: fp16 scales for Resize."""
    model = exporter_quirks_model()
    scales = next(init for init in model.graph.initializer if init.name == "scales")
    scales.CopyFrom(numpy_helper.from_array(np.ones(4, np.float16), "scales"))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(FinalizeError) as caught:
        onnx.save(model, tmp_path / "model.onnx")
        verify(model, tmp_path / "model.onnx", "fp16", SampleJudge.load([], [], [], ACCURACY), CPU,
               CompileOptions("all"))
    message = str(caught.value)
    assert "\n" not in message and "at node 'resize' (Resize)" in message
    assert "Nothing is published" in message and "rerun precision_bisect" in message
