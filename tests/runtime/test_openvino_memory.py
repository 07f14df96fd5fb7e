"""How many copies of the weights an OpenVINO job holds, measured on real compiles of a model whose 256 MiB of
weights are external data: the pages OpenVINO maps are handed back once its plugin has its own copy, a dump
holds one compiled model at a time, and the precision search's IR leaves its weights in its `.bin`. Each
measure is the growth of this process's peak RSS over the call (the peak reset by /proc/self/clear_refs); a
job's is held to one compile's plus half the weights (issue 22's target allows 1.5 x the model; before, a dump
and the IR grew by one compile's plus twice the weights)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from accubisect.runtime.openvino_backend import OPENVINO_CPU, compiled_on_cpu, read_openvino, run_outputs
from accubisect.runtime.openvino_keep import MarkedIR
from accubisect.runtime.ort_compile import CompileOptions

F32 = CompileOptions("all", {"INFERENCE_PRECISION_HINT": "f32"})
WIDTH, HIDDEN = 4096, 8192  # two weights of 128 MiB each: well above the plugin's own 30-70 MiB a compile
WEIGHTS_MIB = 2 * WIDTH * HIDDEN * 4 / 2**20


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """x ─ MatMul(w1) ─ Relu ─ MatMul(w2) ─ y, its weights written straight into `wide.onnx.data` beside it."""
    folder = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(0)
    weights = []
    with open(folder / "wide.onnx.data", "wb") as data:
        for name, shape in (("w1", (WIDTH, HIDDEN)), ("w2", (HIDDEN, WIDTH))):
            tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
            offset = data.tell()
            (rng.random(shape, np.float32) - np.float32(0.5)).tofile(data)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", "wide.onnx.data"), ("offset", offset), ("length", data.tell() - offset)):
                tensor.external_data.add(key=key, value=str(value))
            weights.append(tensor)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, folder / "wide.onnx")
    return folder / "wide.onnx", {"x": rng.standard_normal((4, WIDTH)).astype(np.float32)}


@pytest.fixture(scope="module")
def one_compile_mib(wide) -> float:
    """The peak growth of one compile of the model (f32, one thread), the plugin already loaded."""
    core, read = read_openvino(wide[0])
    compiled_on_cpu(core, read, wide[0], {"INFERENCE_PRECISION_HINT": "f32"}, 1)
    return peak_growth_mib(lambda: compiled_on_cpu(core, read, wide[0], {"INFERENCE_PRECISION_HINT": "f32"}, 1))


def peak_growth_mib(work: Callable[[], object]) -> float:
    """How far this process's RSS peaks above where it stood, while `work` runs."""
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from the RSS now
    before = status_kib("VmRSS")
    work()
    return (status_kib("VmHWM") - before) / 1024


def status_kib(key: str) -> int:
    return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith(f"{key}:"))


def resident_kib(path: Path) -> int:
    """KiB of `path`'s mapped pages resident in this process (/proc/self/smaps)."""
    resident, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0]:
            inside = line.endswith(str(path.resolve()))
        elif inside and line.startswith("Rss:"):
            resident += int(line.split()[1])
    return resident


def test_a_compile_hands_the_mapped_weights_back_and_runs_as_a_compile_that_keeps_them(wide):
    model, feeds = wide
    data = model.with_name("wide.onnx.data")
    core, read = read_openvino(model)
    kept = core.compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
    assert resident_kib(data) > 0.9 * WEIGHTS_MIB * 1024  # the plugin read every page, and holds them
    expected = run_outputs(kept, feeds)["y"]
    del kept

    compiled = compiled_on_cpu(core, read, model, {"INFERENCE_PRECISION_HINT": "f32"}, 1)
    assert resident_kib(data) == 0
    assert run_outputs(compiled, feeds)["y"].tobytes() == expected.tobytes()
    assert resident_kib(data) == 0  # a run reads the plugin's own copy


def test_a_dump_holds_one_compiled_copy_of_the_weights(wide, one_compile_mib, tmp_path):
    model, feeds = wide
    OPENVINO_CPU.compile(model, F32, tmp_path / "compiled.onnx", threads=1)
    names = ["h", "r", "y"]

    grown = peak_growth_mib(lambda: OPENVINO_CPU.run_exposed(model, tmp_path / "compiled.onnx", F32, names, feeds, 1))

    assert grown <= one_compile_mib + 0.5 * WEIGHTS_MIB, f"{grown:.0f} MiB, one compile {one_compile_mib:.0f} MiB"


def test_the_precision_searchs_ir_leaves_its_weights_in_its_bin(wide, one_compile_mib, tmp_path):
    model, _ = wide

    def search_and_answer() -> None:
        ir = MarkedIR(model)
        ir.compile({"mm1": ("mm1",)}, "f32", 1)
        ir.save(["mm1"], tmp_path)

    grown = peak_growth_mib(search_and_answer)

    assert grown <= one_compile_mib + 0.5 * WEIGHTS_MIB, f"{grown:.0f} MiB, one compile {one_compile_mib:.0f} MiB"
    assert (tmp_path / "model.bin").stat().st_size >= WEIGHTS_MIB * 2**20
    assert 'name="precise"' in (tmp_path / "model.xml").read_text()
