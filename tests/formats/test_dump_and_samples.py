from pathlib import Path

import h5py
import numpy as np
import onnxruntime as ort
import pytest
from conftest import EXAMPLE_MODEL, EXAMPLE_SAMPLES, GELU_APPROXIMATION, save_model
from onnx import TensorProto, helper

from accubisect.core.errors import DumpError, ModelError, SampleError
from accubisect.formats.config import validate_config
from accubisect.formats.dump_file import DumpReader, escape, unescape, write_index, write_tensor
from accubisect.formats.model import input_specs, load_model, output_specs
from accubisect.formats.samples import check_samples, discover_samples, load_golden
from accubisect.runtime.ort_compile import ort_version
from accubisect.stages import dump as dump_module
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.dump import DumpStep, dump_sample, tensor_batches
from accubisect.workflow.plan import Plan

AWKWARD = ["a/b", ".", "..", "x.y%2F", "名前", " space ", "/lead", "trail/", "%"]


@pytest.mark.parametrize("name", AWKWARD)
def test_escape_round_trips(name):
    assert unescape(escape(name)) == name and "/" not in escape(name) and escape(name) not in (".", "..")


@pytest.fixture
def awkward_model(tmp_path):
    """x ─ Relu ─ "a/b" ─ Neg ─ "." ─ Abs ─ "名前 %2F" ─ Identity ─ y"""
    nodes = [helper.make_node("Relu", ["x"], ["a/b"], name="relu/0"), helper.make_node("Neg", ["a/b"], ["."]),
             helper.make_node("Abs", ["."], ["名前 %2F"], name="abs"),
             helper.make_node("Identity", ["名前 %2F"], ["y"], name="id")]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [], tmp_path / "awkward.onnx")


def compile_off(model, tmp_path):
    variant = {"name": "fusion_off", "level": "off", "session_config": {}, "rules_off": []}
    compile_variant(CompileStep(model, variant, "ort-cpu", tmp_path / "c" / "model.onnx",
                                tmp_path / "c" / "compile.json"))
    return tmp_path / "c" / "model.onnx"


def test_hdf5_round_trip_with_awkward_tensor_names(awkward_model, tmp_path):
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.savez(tmp_path / "sample0_inputs.npz", x=x)
    compiled = compile_off(awkward_model, tmp_path)
    dump_sample(DumpStep(awkward_model, compiled, tmp_path / "sample0_inputs.npz", tmp_path / "d.h5", "fusion_off",
                         "sample0", "ort-cpu"))
    with DumpReader(tmp_path / "d.h5") as dump:
        assert sorted(dump.names()) == sorted(["a/b", ".", "名前 %2F", "y"])
        np.testing.assert_array_equal(dump.read("名前 %2F"), np.abs(-np.maximum(x, 0)))
        info = dump.info(".")
        assert (info["name"], info["op_type"], info["topo_index"], info["dtype"]) == (".", "Neg", 1, "float32")
        assert list(info["shape"]) == [2, 3]
        assert dump.attrs["variant"] == "fusion_off" and dump.attrs["onnxruntime"] == ort.__version__


def test_dump_holds_fused_kernels_and_reproduces_the_fused_run(ffn_model, tmp_path):
    variant = {"name": "fusion_on", "level": "all", "session_config": GELU_APPROXIMATION, "rules_off": []}
    compile_variant(CompileStep(ffn_model, variant, "ort-cpu", tmp_path / "on" / "model.onnx",
                                tmp_path / "on" / "compile.json"))
    x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)
    np.savez(tmp_path / "sample0_inputs.npz", x=x)
    dump_sample(DumpStep(ffn_model, tmp_path / "on" / "model.onnx", tmp_path / "sample0_inputs.npz", tmp_path / "d.h5",
                         "fusion_on", "sample0", "ort-cpu"))
    options = ort.SessionOptions()
    options.add_session_config_entry("optimization.enable_gelu_approximation", "1")
    fused = ort.InferenceSession(str(ffn_model), options, providers=["CPUExecutionProvider"])
    with DumpReader(tmp_path / "d.h5") as dump:
        op_types = {dump.info(name)["op_type"] for name in dump.names()}
        assert {"Gemm", "FastGelu"} <= op_types
        np.testing.assert_array_equal(dump.read("y"), fused.run(None, {"x": x})[0])  # bit for bit


def test_a_candidate_only_dump_keeps_what_its_reference_also_has(ffn_model, tmp_path):
    variant = {"name": "fusion_on", "level": "all", "session_config": GELU_APPROXIMATION, "rules_off": []}
    compile_variant(CompileStep(ffn_model, variant, "ort-cpu", tmp_path / "on" / "model.onnx",
                                tmp_path / "on" / "compile.json"))
    off = compile_off(ffn_model, tmp_path)
    np.savez(tmp_path / "sample0_inputs.npz", x=np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32))
    args = (ffn_model, tmp_path / "on" / "model.onnx", tmp_path / "sample0_inputs.npz")
    dump_sample(DumpStep(*args, tmp_path / "all.h5", "fusion_on", "sample0", "ort-cpu"))
    dump_sample(DumpStep(*args, tmp_path / "kept.h5", "fusion_on", "sample0", "ort-cpu", compared_with=(off,)))
    dump_sample(DumpStep(off, off, tmp_path / "sample0_inputs.npz", tmp_path / "off.h5", "fusion_off", "sample0",
                         "ort-cpu"))
    with DumpReader(tmp_path / "all.h5") as every, DumpReader(tmp_path / "kept.h5") as kept, \
            DumpReader(tmp_path / "off.h5") as reference:
        shared = [name for name in every.names() if name in reference]
        assert list(kept.names()) == shared and len(shared) < len(list(every.names()))
        assert kept.output_names() == every.output_names() == ["y"]
        np.testing.assert_array_equal(kept.read_output("y"), every.read_output("y"))


def test_unreadable_dump_fails_with_the_path(tmp_path):
    (tmp_path / "bad.h5").write_bytes(b"not hdf5")
    with pytest.raises(DumpError, match="bad.h5: not a readable dump"):
        DumpReader(tmp_path / "bad.h5")


def format_1_dump(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as h5:  # format 1: attributes per dataset, no index
        h5.create_group("tensors").create_dataset("x", data=np.ones(3, np.float32)).attrs["node"] = "n"
    return path


def test_a_dump_of_another_format_says_delete_and_rerun(tmp_path):
    folder = format_1_dump(tmp_path / "workspace" / "dump" / "0123456789abcdef" / "dump.h5").parent
    with pytest.raises(DumpError) as error:
        DumpReader(folder / "dump.h5")
    message = str(error.value)
    assert f"delete {folder} and rerun the dump stage (snakemake dump" in message and "no dump format" in message
    assert "\n" not in message


def test_a_dump_of_another_format_given_from_its_folder_names_the_folder(tmp_path, monkeypatch):
    """`accubisect show dump.h5` inside the folder: the advice names the folder, not '.'."""
    folder = format_1_dump(tmp_path / "workspace" / "dump" / "0123456789abcdef" / "dump.h5").parent
    monkeypatch.chdir(folder)
    with pytest.raises(DumpError, match=f"dump.h5: no dump format.*; delete {folder} and rerun the dump stage"):
        DumpReader(Path("dump.h5"))


def test_a_dump_of_another_format_outside_a_workspace_is_made_again(tmp_path):
    with pytest.raises(DumpError, match=r"old.h5: no dump format, .*; dump the model again with this version "
                                        r"\(snakemake dump"):
        DumpReader(format_1_dump(tmp_path / "old.h5"))


SIXTEEN_BIT = [
    ("float16", np.random.default_rng(0).normal(size=(3, 70, 50_000)).astype(np.float16).astype(np.float32)),
    ("float16", np.array([-0.0, np.inf, -np.inf, np.nan, 2.0**-24, 65504.0, 0.0], np.float32)),
    ("bfloat16", (np.random.default_rng(1).normal(size=(2, 5000, 1000)).astype(np.float32).view(np.uint32)
                  & 0xFFFF0000).view(np.float32)),
    ("float32", np.array([1e-7, 1.0], np.float32)),  # 1e-7: neither 16-bit type holds it
    ("float32", np.array([2.0**-25 * (1 + 2.0**-20)], np.float32)),  # below float16's subnormals, bf16's bits
    ("float32", np.float32(1.1).reshape(())),
    ("float32", np.zeros((0, 3), np.float32)),
    ("float64", np.ones(4)),
    ("int64", np.arange(5)),
    ("float16", np.array([1.5, -2.0], np.float16)),  # the model's own fp16 tensor: read back as fp16
]


@pytest.mark.parametrize(("stored", "array"), SIXTEEN_BIT, ids=[f"{s}-{a.shape}" for s, a in SIXTEEN_BIT])
def test_a_tensor_16_bits_hold_is_stored_in_them_and_read_back_bit_for_bit(tmp_path, stored, array):
    with h5py.File(tmp_path / "d.h5", "w") as h5:
        entry = write_tensor(h5.create_group("tensors"), "t", array)
        write_index(h5, [{"name": "t", "dtype": str(array.dtype), "shape": list(array.shape), **entry}])
    assert entry == {"stored": stored}
    with DumpReader(tmp_path / "d.h5") as dump:
        back = dump.read("t")
        assert dump.layout("t") == (array.dtype, array.shape)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()  # bits: -0, NaN and infinities included


def test_tensor_batches_keep_order_and_bound_bytes():
    sizes = {"a": 40, "b": 40, "c": 100, "d": 10, "y": 5}
    assert tensor_batches(["a", "b", "c", "d", "y"], ["y"], sizes, limit=90) == [["a", "b"], ["c"], ["d", "y"]]
    assert tensor_batches(["a", "b", "c", "d", "y"], ["y"], sizes, limit=10**9) == [["a", "b", "c", "d", "y"]]
    assert tensor_batches([], ["y"], sizes) == [[]]  # the model still runs once, for its outputs
    assert tensor_batches(["a", "unsized"], [], {"a": 40}, limit=60) == [["a"], ["unsized"]]  # counted as the largest


def test_a_dump_written_in_batches_equals_one_written_at_once(awkward_model, tmp_path, monkeypatch):
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3) / 3  # thirds: float32, not 16-bit exact
    np.savez(tmp_path / "sample0_inputs.npz", x=x)
    compiled = compile_off(awkward_model, tmp_path)
    args = (compiled, tmp_path / "sample0_inputs.npz")
    dump_sample(DumpStep(awkward_model, *args, tmp_path / "whole.h5", "fusion_off", "sample0", "ort-cpu"))
    monkeypatch.setattr(dump_module, "BATCH_BYTES", 1)  # every tensor alone
    dump_sample(DumpStep(awkward_model, *args, tmp_path / "batched.h5", "fusion_off", "sample0", "ort-cpu"))
    with DumpReader(tmp_path / "whole.h5") as whole, DumpReader(tmp_path / "batched.h5") as batched:
        assert list(whole.names()) == list(batched.names()) == sorted(["a/b", ".", "名前 %2F", "y"], key=escape)
        for name in whole.names():
            assert whole.info(name) == batched.info(name) and whole.info(name)["stored"] == "float32"
            np.testing.assert_array_equal(whole.read(name), batched.read(name))
        assert whole.output_names() == ["y"]
        np.testing.assert_array_equal(whole.read_output("y"), whole.read("y"))
    with h5py.File(tmp_path / "whole.h5", "r") as h5:  # the model output is stored once, linked twice
        assert h5["outputs/y"].id == h5["tensors/y"].id


def test_missing_and_corrupt_models_fail_in_one_line(tmp_path):
    with pytest.raises(ModelError, match="model file not found"):
        load_model(tmp_path / "none.onnx")
    (tmp_path / "corrupt.onnx").write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(ModelError, match="corrupt.onnx: not a readable ONNX model"):
        load_model(tmp_path / "corrupt.onnx")


def test_an_unknown_op_fails_to_load_in_one_short_line(tmp_path):
    """x ─ NoSuchOp ─ y, and x ─ Relu (custom domain my.ops) ─ y: models ONNX Runtime cannot load."""
    variant = {"name": "fusion_off", "level": "off", "session_config": {}, "rules_off": []}
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [])
    for op, domain, expected in [("NoSuchOp", "", "node 'n' (NoSuchOp): No Op registered for NoSuchOp"),
                                 ("Relu", "my.ops", "node 'n' (my.ops:Relu): No opset import for domain 'my.ops'")]:
        model = save_model([helper.make_node(op, ["x"], ["y"], name="n", domain=domain)], *io,
                           tmp_path / f"{op}.onnx")
        with pytest.raises(ModelError) as error:
            compile_variant(CompileStep(model, variant, "ort-cpu", tmp_path / "c" / "model.onnx",
                                        tmp_path / "c" / "compile.json"))
        message = str(error.value)
        assert message.startswith(f"{model}: ONNX Runtime {ort_version()} cannot load it: {expected}")
        assert message.endswith("check the model's opset and custom-op domains against what this ONNX Runtime "
                                "implements, or `backend`")
        assert "\n" not in message and "onnxruntime::" not in message and len(message) < 400


@pytest.fixture
def specs(ffn_model):
    model = load_model(ffn_model)
    return input_specs(model), output_specs(model)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"input": np.zeros((1, 4, 8), np.float32)}, r"keys must be the model's input names \['x'\]; missing \['x'\]"),
        ({"x": np.zeros((1, 4, 8))}, "input 'x' has dtype float64, the model expects float32"),
        ({"x": np.zeros((4, 8), np.float32)}, "input 'x' has rank 2"),
        ({"x": np.zeros((1, 4, 9), np.float32)}, "input 'x' has size 9 on axis 2, the model expects 8"),
    ],
)
def test_samples_that_do_not_match_the_model_fail_before_running(specs, tmp_path, arrays, message):
    np.savez(tmp_path / "sample0_inputs.npz", **arrays)
    with pytest.raises(SampleError, match=message):
        check_samples(discover_samples(tmp_path), *specs)


def test_golden_outputs_are_checked_and_nan_refused(specs, tmp_path):
    np.savez(tmp_path / "sample0_inputs.npz", x=np.zeros((1, 4, 8), np.float32))
    np.savez(tmp_path / "sample0_outputs.npz", y=np.full((1, 4, 8), np.nan, np.float32))
    check_samples(discover_samples(tmp_path), *specs)
    with pytest.raises(SampleError, match="golden output 'y' holds 32 NaN values"):
        load_golden(tmp_path / "sample0_outputs.npz")


def test_golden_outputs_shaped_otherwise_than_declared_are_a_warning_and_other_dtypes_an_error(specs, tmp_path):
    np.savez(tmp_path / "sample0_inputs.npz", x=np.zeros((1, 4, 8), np.float32))
    np.savez(tmp_path / "sample1_inputs.npz", x=np.ones((1, 4, 8), np.float32))
    for index in (0, 1):
        np.savez(tmp_path / f"sample{index}_outputs.npz", y=np.zeros((2, 1, 4, 8), np.float32))
    warning = check_samples(discover_samples(tmp_path), *specs)
    assert warning == (f"{tmp_path / 'sample0_outputs.npz'}: output 'y' has rank 4, the model expects rank 3 "
                       "(shape [2, 1, 4, 8], the model's [1, 4, 8]) (and 1 more like it); declared output shapes are "
                       "only hints: the golden outputs are checked against the outputs the model really produces "
                       "when they are compared")
    np.savez(tmp_path / "sample1_outputs.npz", y=np.zeros((2, 1, 4, 8), np.float64))
    with pytest.raises(SampleError, match="sample1_outputs.npz: output .y. has dtype float64, the model expects"):
        check_samples(discover_samples(tmp_path), *specs)
    np.savez(tmp_path / "sample1_outputs.npz", y=np.zeros((1, 4, 8), np.float32))
    np.savez(tmp_path / "sample0_outputs.npz", y=np.zeros((1, 4, 8), np.float32))
    assert check_samples(discover_samples(tmp_path), *specs) == ""


def test_sample_folder_problems(tmp_path):
    with pytest.raises(SampleError, match="samples folder not found"):
        discover_samples(tmp_path / "nope")
    with pytest.raises(SampleError, match="no sample"):
        discover_samples(tmp_path)
    (tmp_path / "sample3_inputs.npz").write_bytes(b"junk")
    with pytest.raises(SampleError, match="sample3_inputs.npz: not a readable .npz file"):
        check_samples(discover_samples(tmp_path), [], [])


def test_pickled_arrays_are_refused(specs, tmp_path):
    np.savez(tmp_path / "sample0_inputs.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(SampleError, match="dtype object"):
        check_samples(discover_samples(tmp_path), *specs)


@pytest.mark.parametrize(("graph", "trimmed"), [("compiled", {"reduced": "fusion_on"}),
                                                ("original", {"fusion_on": "fusion_off", "reduced": "fusion_off"})])
def test_only_dumps_that_are_only_ever_a_candidate_are_trimmed_to_their_reference(tmp_path, graph, trimmed):
    """Local errors read the precision base's dumps whole, and every reference's: those keep every tensor."""
    plan = Plan.from_config(validate_config({"model": str(EXAMPLE_MODEL), "samples": str(EXAMPLE_SAMPLES),
                                             "workspace": str(tmp_path / "ws"), "precision": {"graph": graph}}))
    for key, job in plan.dumps.items():
        expected = [str(plan.compile_dir(trimmed[job.variant]) / "model.onnx")] if job.variant in trimmed else []
        assert plan.compared_with(key) == expected, job.variant
