"""Storage emulation numerics, and why it exists: ORT's CPU fp16 path hides an overflow it reveals."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import layer_norm_model, save_model
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers.float16 import convert_float_to_float16

from accubisect.core.emulate import emulate
from accubisect.core.onnx_graph import graph_nodes


def emulated_constant(values: np.ndarray, dtype: str) -> np.ndarray:
    """c ─ Identity ─ y, the Identity reduced: `values` as the emulation stores the constant c in `dtype`."""
    graph = helper.make_graph([helper.make_node("Identity", ["c"], ["y"], name="id")], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(values.shape))],
                              [numpy_helper.from_array(values, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    emulated = emulate(model, {"id"}, dtype, {"c": "float32", "y": "float32"})
    assert not any(init.name != "c" for init in emulated.graph.initializer)  # rounded in the graph, not copied
    return ort.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]


def test_fp16_rounding_overflows_and_flushes():
    values = np.array([70000.0, -70000.0, 1e-8, 65504.0, 1.0009765625, np.nan], np.float32)
    out = emulated_constant(values, "fp16")
    assert out[0] == np.inf and out[1] == -np.inf and out[2] == 0.0 and out[3] == 65504.0
    assert out[4] == np.float32(1.0009765625) and np.isnan(out[5])


def test_bf16_rounding_is_nearest_even():
    values = np.array([3.14159265, 1.00390625, 1.01171875, 1e-8, 3.4e38, np.inf, np.nan], np.float32)
    out = emulated_constant(values, "bf16")
    assert out[0] == np.float32(3.140625)
    assert out[1] == 1.0 and out[2] == np.float32(1.015625)  # ties to the even mantissa
    assert out[3] == np.float32(1.0011717677116394e-08)  # bf16 keeps fp32's exponent range
    assert out[4] == np.inf and out[5] == np.inf and np.isnan(out[6])


def test_ort_cpu_fp16_hides_the_overflow_that_emulation_shows(tmp_path):
    path = layer_norm_model(tmp_path / "ln.onnx")
    x = np.random.default_rng(0).normal(0, 1000, (2, 64)).astype(np.float32)
    exact = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    fp16_model = convert_float_to_float16(onnx.load(path), keep_io_types=True)
    native = ort.InferenceSession(fp16_model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(native.run(None, {"x": x})[0], exact, atol=1e-2)  # looks perfect on CPU
    model = onnx.load(path)
    dtypes = {t: "float32" for node in model.graph.node for t in [*node.input, *node.output]}
    everything = {node.name for node in graph_nodes(model.graph)}
    emulated = emulate(model, everything, "fp16", dtypes)
    got = ort.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - exact).max() > 0.5  # the variance became inf: every output collapses to 0
    kept = emulate(model, everything - {"ln/pow", "ln/var", "ln/add_eps", "ln/sqrt"}, "fp16", dtypes)
    fixed = ort.InferenceSession(kept.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(fixed, exact, atol=1e-2)


def test_constants_of_reduced_nodes_are_rounded_and_of_fp32_nodes_kept(tmp_path):
    """x ─ Mul(c) ─ a ;  x ─ Add(c) ─ b : c = 1e5 is shared by a reduced Mul and an fp32 Add."""
    nodes = [helper.make_node("Mul", ["x", "c"], ["a"], name="mul"),
             helper.make_node("Add", ["x", "c"], ["b"], name="add")]
    path = save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                      [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1]),
                       helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])],
                      [numpy_helper.from_array(np.array([1e5], np.float32), "c")], tmp_path / "c.onnx")
    model = onnx.load(path)
    emulated = emulate(model, {"mul"}, "fp16", {"x": "float32", "c": "float32", "a": "float32", "b": "float32"})
    session = ort.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"])
    a, b = session.run(None, {"x": np.array([1.0], np.float32)})
    assert a[0] == np.inf and b[0] == np.float32(100001.0)
    assert [o.name for o in emulated.graph.output] == ["a", "b"]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_emulated_model_runs_in_ort_for_both_types(ffn_model, dtype):
    model = onnx.load(ffn_model)
    dtypes = {t: "float32" for node in model.graph.node for t in [*node.input, *node.output]}
    emulated = emulate(model, {node.name for node in graph_nodes(model.graph)}, dtype, dtypes)
    session = ort.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)
    reference = ort.InferenceSession(str(ffn_model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = session.run(None, {"x": x})[0]
    assert 0 < np.abs(got - reference).max() < (2e-2 if dtype == "bf16" else 5e-3)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_finalized_model_has_real_low_precision_tensors(ffn_model, dtype):
    from accubisect.runtime.finalize import finalize

    model = onnx.load(ffn_model)
    dtypes = {t: "float32" for node in model.graph.node for t in [*node.input, *node.output]}
    reduced = {node.name for node in graph_nodes(model.graph)} - {"relu"}
    final = finalize(model, reduced, dtype, dtypes)
    onnx.checker.check_model(final, full_check=True)
    low = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}[dtype]
    assert {init.data_type for init in final.graph.initializer} == {low}  # relu reads no constant
    assert [o.name for o in final.graph.output] == ["y"] and final.graph.input[0].type.tensor_type.elem_type == 1
    if dtype == "bf16":
        with pytest.raises(Exception, match="NOT_IMPLEMENTED"):  # ORT's CPU provider has no bf16 Div
            ort.InferenceSession(final.SerializeToString(), providers=["CPUExecutionProvider"])
        return
    x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)
    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    np.testing.assert_allclose(run(final), run(emulate(model, reduced, dtype, dtypes)), atol=5e-3)
