"""Reading what ONNX Runtime says: which graph transformers changed the graph (its verbose log, the source of
"rules fired"), and its error messages condensed to the one line a user is shown."""

import numpy as np
import pytest
from conftest import EXAMPLE_MODEL, GELU_APPROXIMATION, save_model
from onnx import TensorProto, helper

from accubisect.core.errors import ModelError
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU
from accubisect.runtime.ort_compile import CompileOptions, TransformerLog

LINE = ("2026-11-23 22:02:02.913960532 [I:onnxruntime:, graph_transformer.cc:15 Apply] GraphTransformer {} "
        "modified: {} with status: OK")


def test_transformers_are_listed_once_in_the_order_they_first_appear():
    text = "\n".join([LINE.format("ConstantSharing", 0), "2026-11-23 [I:onnxruntime:, inference_session.cc:1 Init] x",
                      LINE.format("GeluFusionL1", 0), LINE.format("ConstantSharing", 1), LINE.format("GeluFusionL2", 1),
                      LINE.format("GeluFusionL1", 0), LINE.format("MatMulAddFusion", 1)])
    log = TransformerLog.parse(text)
    assert log.ran == ("ConstantSharing", "GeluFusionL1", "GeluFusionL2", "MatMulAddFusion")
    assert log.modified == ("ConstantSharing", "GeluFusionL2", "MatMulAddFusion")  # a later pass that modified counts


def test_a_log_without_transformer_lines_says_nothing_ran():
    assert TransformerLog.parse("\x1b[0;93m2026-11-23 [W:onnxruntime:, session_state.cc:1] warning\x1b[m\n") == \
        TransformerLog((), ())


def test_the_real_verbose_log_names_the_fusions_that_fired_on_the_example():
    fired = ort_compile.compile_model(EXAMPLE_MODEL, CompileOptions("all", GELU_APPROXIMATION), CPU)
    for transformer in ("MatMulAddFusion", "ConvActivationFusion", "SkipLayerNormFusion", "GeluApproximation"):
        assert transformer in fired.modified
    assert set(fired.modified) <= set(fired.ran) and len(set(fired.ran)) == len(fired.ran)
    exact = ort_compile.compile_model(EXAMPLE_MODEL, CompileOptions("all"), CPU)
    assert "GeluFusionL2" in exact.modified and "GeluApproximation" not in exact.modified  # not asked for
    assert ort_compile.compile_model(EXAMPLE_MODEL, CompileOptions("off"), CPU).modified == ()


def test_what_onnx_runtime_prints_while_building_a_session_goes_to_the_job_log(caplog):
    """ORT prints from C++ to file descriptor 2, which a job's log file never sees: here its own logger set to
    verbose (as a user debugging ORT would) prints while the session is built, and that text is logged."""
    import onnxruntime as ort

    ort.set_default_logger_severity(0)
    try:
        with caplog.at_level("WARNING", logger="accubisect.runtime.ort_compile"):
            ort_compile.Runner(EXAMPLE_MODEL, CompileOptions("off"), CPU).activate()
    finally:
        ort.set_default_logger_severity(2)  # ORT's default: warnings
    [record] = caplog.records
    assert record.getMessage().startswith("ONNX Runtime: ") and "[I:onnxruntime:" in record.getMessage()


def test_a_model_onnx_runtime_cannot_load_is_one_line_naming_the_node(tmp_path):
    path = save_model([helper.make_node("Frobnicate", ["x"], ["y"], name="my/node")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [], tmp_path / "bad.onnx")
    with pytest.raises(ModelError) as error:
        ort_compile.Runner(path, CompileOptions("off"), CPU).activate()
    message = str(error.value)
    assert message.startswith(f"{path}: ONNX Runtime ")
    assert "cannot load it: node 'my/node' (Frobnicate): No Op registered for Frobnicate" in message
    assert "\n" not in message and "[ONNXRuntimeError]" not in message and ".cc:" not in message
    assert message.endswith(ort_compile.LOAD_ADVICE)


def test_an_error_while_running_is_one_line_without_the_cpp_source(tmp_path):
    path = save_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None]),
                       helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])], [], tmp_path / "reshape.onnx")
    session = ort_compile.Runner(path, CompileOptions("off"), CPU).activate()
    with pytest.raises(ModelError) as error:
        session.infer({"x": np.zeros(6, np.float32), "shape": np.array([4], np.int64)})
    message = str(error.value)
    assert message.startswith("ONNX Runtime failed to run the model: ")
    assert "\n" not in message and "[ONNXRuntimeError]" not in message and "onnxruntime::" not in message
    assert "Name:'reshape' Status Message: input_shape_size == requested_shape_size was false." in message
    assert message.endswith("Input shape:{6}, requested shape:{4}")


def test_a_long_message_is_cut_to_its_limit():
    message = ort_compile.condensed(RuntimeError("[ONNXRuntimeError] : 1 : FAIL : " + "x" * 1000))
    assert len(message) == ort_compile.MESSAGE_LIMIT and message.endswith("…") and message.startswith("xxx")
