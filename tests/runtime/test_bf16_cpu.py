"""bf16 on the CPU: dumps of an emulated bf16 model hold the model's tensors, real bf16 tensors are read
widened, and the whole precision_bisect runs with `precision.dtype: bf16` on `ort-cpu`."""

import json

import numpy as np
import onnx
import pytest
from conftest import copy_workflow, save_model, snakemake
from onnx import TensorProto, helper, numpy_helper

from accubisect.core.emulate import emulate, unemulated
from accubisect.core.onnx_graph import graph_nodes
from accubisect.formats.dump_file import DumpReader
from accubisect.runtime.backends import CPU
from accubisect.stages.dump import DumpStep, dump_sample
from accubisect.stages.precision_stage import tensor_dtypes

X = np.array([[1.00390625, 3.14159265, -2.0, 1e-8]], np.float32)  # 1.00390625 is a tie: bf16 rounds it to 1.0


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """The oracle: `values` (float32) as bf16 stores them (nearest, ties to even), returned as float32."""
    assert dtype == "bf16"
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return np.where(np.isnan(values), values, rounded.view(np.float32))


def scale_shift_model(path):
    """x ─ Mul(w) "scale" ─ s ─ Add(w) "shift" ─ y ─ Relu "relu" ─ z

    One constant, w = 1.00390625, read by both "scale" and "shift"."""
    w = numpy_helper.from_array(np.array(1.00390625, np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["s"], name="scale"),
             helper.make_node("Add", ["s", "w"], ["y"], name="shift"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                      [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])], [w], path)


def emulated(path, reduced, dtype="bf16"):
    model = onnx.load(path)
    dtypes = {name: "float32" for name in ("x", "w", "s", "y", "z")}
    return emulate(model, reduced, dtype, dtypes)


def test_dump_of_an_emulated_bf16_model_holds_the_models_tensors_rounded(tmp_path):
    """"scale" stores in bf16 (x, w and s rounded), "shift" and "relu" in fp32 (w exact there)."""
    model = scale_shift_model(tmp_path / "m.onnx")
    onnx.save(emulated(model, {"scale"}), tmp_path / "reduced.onnx")
    np.savez(tmp_path / "sample0_inputs.npz", x=X)
    dump_sample(DumpStep(model, tmp_path / "reduced.onnx", tmp_path / "sample0_inputs.npz", tmp_path / "d.h5",
                         "reduced", "sample0", "ort-cpu", {"mode": "all"}))
    s = round_to(round_to(X, "bf16") * np.float32(1.0), "bf16")  # w = 1.00390625 is 1.0 in bf16
    with DumpReader(tmp_path / "d.h5") as dump:
        assert sorted(dump.names()) == ["s", "x", "y", "z"]  # none of the emulation's Casts or copies
        assert s[0, 0] == 1.0 and s[0, 1] == np.float32(3.140625)
        np.testing.assert_array_equal(dump.read("x"), X)  # the graph input, as fed
        np.testing.assert_array_equal(dump.read("s"), s)
        np.testing.assert_array_equal(dump.read("y"), s + np.float32(1.00390625))  # fp32 node: exact constant
        np.testing.assert_array_equal(dump.read("z"), np.maximum(s + np.float32(1.00390625), 0))
        np.testing.assert_array_equal(dump.read_output("z"), dump.read("z"))
        info = dump.info("s")
        assert (info["node"], info["op_type"], info["topo_index"]) == ("scale", "Mul", 0)  # not the Cast's
        assert info["dtype"] == info["model_dtype"] == "float32"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("reduced", [set(), {"scale"}, {"shift"}, {"scale", "shift", "relu"}])
def test_unemulated_gives_back_the_models_graph(tmp_path, dtype, reduced):
    model = scale_shift_model(tmp_path / "m.onnx")
    graph = unemulated(emulated(model, reduced, dtype))
    assert graph_nodes(graph) == graph_nodes(onnx.load(model).graph)
    assert [init.name for init in graph.initializer] == ["w"]
    plain = onnx.load(model)
    assert unemulated(plain) is plain.graph


def narrowing_model(path):
    """x ─ Cast(bf16) "narrow" ─ h ─ Cast(fp32) "widen" ─ y; h is also a (bf16) model output."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16, name="narrow"),
             helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT, name="widen")]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
                       helper.make_tensor_value_info("h", TensorProto.BFLOAT16, [1, 4])], [], path)


def test_real_bf16_tensors_are_dumped_widened_to_float32(tmp_path):
    """ORT cannot return a bf16 tensor to Python; a finalized bf16 model on ort-cuda holds them."""
    model = narrowing_model(tmp_path / "m.onnx")
    np.savez(tmp_path / "sample0_inputs.npz", x=X)
    dump_sample(DumpStep(model, model, tmp_path / "sample0_inputs.npz", tmp_path / "d.h5", "reduced", "sample0",
                         "ort-cpu"))
    with DumpReader(tmp_path / "d.h5") as dump:
        assert sorted(dump.names()) == ["h", "y"]
        np.testing.assert_array_equal(dump.read("h"), round_to(X, "bf16"))
        np.testing.assert_array_equal(dump.read_output("h"), round_to(X, "bf16"))
        assert (dump.info("h")["dtype"], dump.info("h")["model_dtype"]) == ("float32", "bfloat16")
        assert dump.info("y")["model_dtype"] == "float32"
    dtypes = tensor_dtypes(onnx.load(model), tmp_path / "sample0_inputs.npz", CPU)
    assert (dtypes["h"], dtypes["y"]) == ("bfloat16", "float32")


@pytest.mark.e2e
def test_precision_bisect_in_bf16_on_the_cpu(tmp_path):
    folder = copy_workflow(tmp_path)
    snakemake(folder, "precision_bisect", "--configfile", "examples/precision/config.yaml",
              "--config", "precision={mode: force_fp16, dtype: bf16}")
    base = folder / "results/precision_example/precision_bisect"
    result = json.loads(base.joinpath("result.json").read_text())
    assert result["dtype"] == "bf16" and not result["reduced_verdict"]["passed"]
    assert result["culprits"] and result["final_verdict"]["passed"]
    assert base.joinpath("keep_dtype.txt").read_text().split()
