"""Bad inputs that Plan.from_config (what Snakemake runs as it parses the workflow) refuses in one line naming
the file or config key, before any job runs."""

import shutil

import numpy as np
import pytest
from conftest import save_model
from onnx import TensorProto, helper

from accubisect.core.errors import AccubisectError, ConfigError
from accubisect.runtime.ort_compile import ort_version
from accubisect.runtime.session_config import check_session_config, known_keys
from accubisect.workflow.plan import Plan


def plan_error(tmp_path, model, samples, **config) -> str:
    with pytest.raises(AccubisectError) as error:
        Plan.from_config({"model": str(model), "samples": str(samples), "workspace": str(tmp_path / "ws"),
                          "results": str(tmp_path / "results"), **config})
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.fixture
def samples(tmp_path):
    folder = tmp_path / "samples"
    folder.mkdir()
    np.savez(folder / "sample0_inputs.npz", x=np.zeros((1, 4, 8), np.float32))
    return folder


def test_two_samples_with_identical_inputs_are_refused(ffn_model, samples):
    shutil.copy(samples / "sample0_inputs.npz", samples / "sample1_inputs.npz")
    np.savez(samples / "sample2_inputs.npz", x=np.ones((1, 4, 8), np.float32))
    assert plan_error(samples.parent, ffn_model, samples) == (
        f"{samples}/sample0_inputs.npz and {samples}/sample1_inputs.npz hold identical inputs; remove one")


def test_an_empty_model_is_named_before_the_samples(samples, tmp_path):
    """An empty file parses as an empty ModelProto with no inputs: the samples' keys would be blamed."""
    (tmp_path / "empty.onnx").write_bytes(b"")
    message = plan_error(tmp_path, tmp_path / "empty.onnx", samples)
    assert message == f"{tmp_path}/empty.onnx: empty file (0 bytes); set `model` to an exported .onnx file"


@pytest.mark.parametrize(
    ("where", "name"),
    [("node output", "a\x00b"), ("graph input", "x\x00"), ("graph output", "\x00y")],
)
def test_a_tensor_name_with_a_nul_byte_is_refused(tmp_path, samples, where, name):
    """x ─ Relu ─ a ─ Relu ─ y, one of the three names holding a NUL byte."""
    names = {"graph input": "x", "node output": "a", "graph output": "y"}
    names[where] = name
    model = save_model(
        [helper.make_node("Relu", [names["graph input"]], [names["node output"]], name="r0"),
         helper.make_node("Relu", [names["node output"]], [names["graph output"]], name="r1")],
        [helper.make_tensor_value_info(names["graph input"], TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info(names["graph output"], TensorProto.FLOAT, [1, 4, 8])], [], tmp_path / "nul.onnx")
    assert plan_error(tmp_path, model, samples) == (
        f"{model}: tensor or node name {name!r} holds a NUL byte; rename it in the model")


def test_a_golden_output_shaped_otherwise_than_declared_is_a_warning_and_of_another_dtype_refused(ffn_model, samples):
    """Declared shapes are hints (exporters get them wrong): the compare job checks the real ones."""
    np.savez(samples / "sample0_outputs.npz", y=np.zeros((1, 8, 4), np.float32))
    plan = Plan.from_config({"model": str(ffn_model), "samples": str(samples), "workspace": str(samples.parent / "ws")})
    assert plan.inputs.shape_warning.startswith(
        f"{samples}/sample0_outputs.npz: output 'y' has size 8 on axis 1, the model expects 4 "
        "(shape [1, 8, 4], the model's [1, 4, 8]); declared output shapes are only hints")
    np.savez(samples / "sample0_outputs.npz", y=np.zeros((1, 4, 8), np.float16))
    assert plan_error(samples.parent, ffn_model, samples) == (
        f"{samples}/sample0_outputs.npz: output 'y' has dtype float16, the model expects float32")


def test_an_unknown_session_config_key_lists_the_closest_known_keys_first(ffn_model, samples):
    message = plan_error(samples.parent, ffn_model, samples,
                         compile={"session_config": {"optimization.enable_gelu_aproximation": "1"}})
    assert message.startswith(
        "compile.session_config: 'optimization.enable_gelu_aproximation' is not a session config key of ONNX "
        f"Runtime {ort_version()}, which would ignore it; known keys: optimization.enable_gelu_approximation, ")
    assert "session.disable_prepacking" in message


def test_the_installed_runtime_knows_its_real_session_config_keys():
    """Keys of onnxruntime_session_options_config_keys.h that the CPU build reads, one of which the compiler
    stores in pieces (the stem "session.model_external_initializers_file_folder_")."""
    real = ["optimization.enable_gelu_approximation", "session.disable_prepacking", "session.intra_op.allow_spinning",
            "session.use_device_allocator_for_initializers", "session.model_external_initializers_file_folder_path"]
    known = known_keys(ort_version())
    assert all(key in known for key in real)
    assert "session.disable_prepacking_please" not in known and "optimization.enable_gelu" not in known
    check_session_config(dict.fromkeys(real, "1"))
    with pytest.raises(ConfigError, match="'session.intra_op.allow_spining' is not a session config key"):
        check_session_config({"session.intra_op.allow_spining": "0"})


def test_a_model_without_declared_output_shapes_takes_any_golden_shape(tmp_path, samples):
    """x ─ Relu ─ y (y declared with no shape) ─ and ─ Relu ─ z (z declared [n, 8])."""
    model = save_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r0"), helper.make_node("Relu", ["x"], ["z"], name="r1")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4, 8])], [], tmp_path / "loose.onnx")
    np.savez(samples / "sample0_outputs.npz", y=np.zeros(3, np.float32), z=np.zeros((1, 4, 8), np.float32))
    plan = Plan.from_config({"model": str(model), "samples": str(samples), "workspace": str(tmp_path / "ws")})
    assert plan.inputs.shape_warning == ""
    np.savez(samples / "sample0_outputs.npz", y=np.zeros(3, np.float32), z=np.zeros((4, 8), np.float32))
    plan = Plan.from_config({"model": str(model), "samples": str(samples), "workspace": str(tmp_path / "ws")})
    assert ("output 'z' has rank 2, the model expects rank 3 (shape [4, 8], the model's [?, 4, 8])"
            in plan.inputs.shape_warning)
