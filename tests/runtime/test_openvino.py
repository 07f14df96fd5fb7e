"""backend: openvino-cpu on real OpenVINO CPU compiles of small synthetic models: the preflight's refusals,
the executed graph named after the ONNX model, the bf16 run read from raw bits, and the faithfulness check
of a dump. Tests needing a reduced type this CPU lacks are skipped with the plugin's capabilities; one e2e test runs
`snakemake compare` on openvino-cpu."""

from __future__ import annotations

import sys

import h5py
import numpy as np
import onnx
import pytest
from conftest import copy_workflow, jobs_run, save_float_model, snakemake
from onnx import helper

from accubisect.core.errors import ConfigError, ModelError
from accubisect.formats.compile_record import Variant
from accubisect.formats.dump_file import DumpReader
from accubisect.formats.graph_record import GraphRecord
from accubisect.runtime.backends import backend_named
from accubisect.runtime.openvino_backend import CAPABILITY, COMPILE_ADVICE, OPENVINO_CPU, cpu_capabilities
from accubisect.runtime.openvino_graph import ExecutedGraph, ExecutedNode
from accubisect.runtime.ort_compile import CompileOptions
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.graph import GraphStep, write_graph

CAPABILITIES = cpu_capabilities()
needs_bf16 = pytest.mark.skipif("BF16" not in CAPABILITIES,
                                reason=f"this CPU's OpenVINO capabilities lack BF16: {CAPABILITIES}")
F32 = CompileOptions("all", {"INFERENCE_PRECISION_HINT": "f32"})
BF16 = CompileOptions("all", {"INFERENCE_PRECISION_HINT": "bf16"})


@pytest.fixture
def mlp(tmp_path):
    """Two dense layers, each a FullyConnected on OpenVINO (the first with its Add and Relu), large enough
    not to become one snippet Subgraph (which runs in f32 under a bf16 hint).

        x ─ MatMul(w1) ─ Add(b) ─ Relu ─ MatMul(w2) ─ Sigmoid ─ y
    """
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["m2"], name="mm2"),
             helper.make_node("Sigmoid", ["m2"], ["y"], name="sig")]
    weights = {name: rng.standard_normal(shape) for name, shape in (("w1", (64, 64)), ("b", (64,)), ("w2", (64, 64)))}
    model = save_float_model(nodes, weights, [16, 64], tmp_path / "mlp.onnx")
    return model, {"x": rng.standard_normal((16, 64)).astype(np.float32)}


def test_openvino_cpu_is_registered_and_lacks_the_capabilities_it_does_not_have():
    backend = backend_named("openvino-cpu")
    assert backend is OPENVINO_CPU and backend.gpus == 0
    with pytest.raises(ConfigError) as caught:
        backend.require("fusion rules switched off by name", "fusion_bisect")
    assert str(caught.value) == ("backend: openvino-cpu has no fusion rules switched off by name, which "
                                 "fusion_bisect needs; run it with backend: ort-cpu")


def test_without_openvino_the_backend_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # what importlib sees where the package is absent
    with pytest.raises(ConfigError) as caught:
        OPENVINO_CPU.check_installed()
    assert str(caught.value) == "backend: openvino-cpu needs OpenVINO, which is not installed: pip install .[openvino]"


@pytest.mark.parametrize("dtype", sorted(CAPABILITY))
def test_a_reduced_type_is_refused_in_one_line_exactly_where_the_cpu_lacks_it(dtype):
    if CAPABILITY[dtype] in CAPABILITIES:
        OPENVINO_CPU.check_dtype(dtype)  # runs: no refusal
        return
    with pytest.raises(ConfigError) as caught:
        OPENVINO_CPU.check_dtype(dtype)
    message = str(caught.value)
    assert message.startswith(f"precision.dtype: {dtype} on backend openvino-cpu needs a CPU whose OpenVINO "
                              f"OPTIMIZATION_CAPABILITIES include {CAPABILITY[dtype]}")
    assert ", ".join(CAPABILITIES) in message and "\n" not in message


def test_the_executed_graph_is_named_after_the_onnx_model(mlp, tmp_path):
    model, _ = mlp
    OPENVINO_CPU.compile(model, F32, tmp_path / "f32.onnx", threads=1)
    saved = onnx.load(str(tmp_path / "f32.onnx"))
    graph = ExecutedGraph.from_onnx(saved)
    assert graph.inputs == ("x",) and graph.outputs == ("y",)
    covered = {name.decode() for node in saved.graph.node for attribute in node.attribute
               if attribute.name == "original_nodes" for name in attribute.strings}
    assert covered == {"mm", "add", "relu", "mm2", "sig"}
    assert {node.precision for node in graph.nodes} == {"f32"}
    assert all(node.primitive for node in graph.nodes)
    OPENVINO_CPU.compile(model, F32, tmp_path / "again.onnx", threads=1)
    assert ExecutedGraph.from_onnx(onnx.load(str(tmp_path / "again.onnx"))) == graph  # no counter in a name


def test_a_compile_the_plugin_refuses_is_one_line_naming_the_model_file(mlp, tmp_path):
    """The model reads, the CPU plugin refuses to compile it (here a hint value it does not know): the line
    names the file, as a model OpenVINO cannot read does, with what to do."""
    model, _ = mlp
    with pytest.raises(ModelError) as caught:
        OPENVINO_CPU.compile(model, CompileOptions("all", {"INFERENCE_PRECISION_HINT": "f8"}), tmp_path / "f8.onnx")
    message = str(caught.value)
    assert message.startswith(f"{model}: OpenVINO cannot compile it for the CPU: ")
    assert "INFERENCE_PRECISION_HINT" in message and message.endswith(COMPILE_ADVICE) and "\n" not in message
    assert not (tmp_path / "f8.onnx").exists()


@needs_bf16
def test_a_bf16_run_exposes_tensors_in_bf16_read_from_raw_bits_and_faithful(mlp, tmp_path):
    model, feeds = mlp
    OPENVINO_CPU.compile(model, BF16, tmp_path / "bf16.onnx", threads=1)
    graph = ExecutedGraph.from_onnx(onnx.load(str(tmp_path / "bf16.onnx")))
    assert any("bf16" in node.primitive for node in graph.nodes), [node.primitive for node in graph.nodes]
    produced = [name for node in graph.nodes for name in node.outputs]
    inner = [name for name in produced if name in {"m", "a", "r", "m2"}]
    assert inner == ["r"] and graph.output_precisions()["r"] == "bf16"  # the first FullyConnected's output
    run = OPENVINO_CPU.run_exposed(model, tmp_path / "bf16.onnx", BF16, produced, feeds, threads=1)
    assert run.unfaithful == {}
    assert set(run.tensors) == {"r", "y"}  # the tensors OpenVINO invented have nothing to expose
    for name in inner:
        array = run.tensors[name]
        assert array.dtype == np.float32 and run.widened[name] == "bfloat16"
        assert not np.any(array.view(np.uint32) & 0xFFFF)  # bf16 values, widened exactly
    f32_run = OPENVINO_CPU.run_exposed(model, tmp_path / "bf16.onnx", F32, ["y"], feeds, threads=1)
    assert not np.array_equal(run.tensors["y"], f32_run.tensors["y"])  # bf16 really ran


@needs_bf16
def test_an_exposed_tensor_that_breaks_a_fusion_is_marked_unfaithful(mlp, tmp_path):
    """`m` lives inside the fused MatMul+Add+Relu: exposing it splits the fusion, so the dumping compile
    runs another program, and the tensors its changed nodes write are marked."""
    model, feeds = mlp
    OPENVINO_CPU.compile(model, BF16, tmp_path / "bf16.onnx", threads=1)
    run = OPENVINO_CPU.run_exposed(model, tmp_path / "bf16.onnx", BF16, ["m", "y"], feeds, threads=1)
    assert "m" in run.unfaithful and "only when dumped" in run.unfaithful["m"]


@needs_bf16
def test_the_graph_stage_records_each_executed_nodes_precision_and_kernel(mlp, tmp_path):
    model, _ = mlp
    variant = Variant("fusion_on", "all", {"INFERENCE_PRECISION_HINT": "bf16"})
    compile_variant(CompileStep(model=model, variant=variant.to_json(), backend="openvino-cpu",
                                compiled_model=tmp_path / "model.onnx", compile_record=tmp_path / "compile.json",
                                threads=1))
    write_graph(GraphStep(model=model, compiled_model=tmp_path / "model.onnx", compile_record=tmp_path / "compile.json",
                          graph_json=tmp_path / "graph.json", threads=1))
    record = GraphRecord.read(tmp_path / "graph.json")
    assert record.fired_rules == () and record.eliminated_nodes == ()
    dense = next(node for node in record.nodes if "relu" in node.original_nodes)
    assert dense.precision == "bf16" and "bf16" in dense.kernel
    assert {"mm", "add", "relu"} <= set(dense.original_nodes)


@needs_bf16
@pytest.mark.e2e
def test_snakemake_compare_on_openvino_runs_f32_against_real_bf16(mlp, tmp_path):
    """The workflow end to end on openvino-cpu: compare runs, names the bf16 kernels, dumps the first dense
    layer's bf16 output widened from its bits; reduce, which needs fusion rules switched off by name, stops
    before any job in one line."""
    model, feeds = mlp
    (tmp_path / "samples").mkdir()
    np.savez(tmp_path / "samples" / "sample0_inputs.npz", **feeds)
    folder = copy_workflow(tmp_path / "project")
    config = ("--config", f"model={model}", f"samples={tmp_path / 'samples'}", "backend=openvino-cpu",
              "precision={dtype: bf16}")
    result = snakemake(folder, "compare", *config)
    summary = (folder / "results" / "compare" / "summary.txt").read_text()
    assert "compare bf16 (OpenVINO) vs f32 on 1 sample(s)" in summary, summary
    assert "brgemm_avx512" in summary and "bf16" in summary.split("kernels: ")[1].splitlines()[0], summary
    assert "NOT FAITHFUL" not in summary
    page = (folder / "results" / "compare" / "report.html").read_text()
    assert "Each box says the precision its node ran in" in page and "no rule · bf16</text>" in page
    assert "fusion_local_errors" not in jobs_run(result)
    dumps = sorted((folder / "workspace" / "dump").glob("*/dump.h5"))
    with h5py.File(dumps[0]) as one, h5py.File(dumps[1]) as other:
        assert {one.attrs["backend"], other.attrs["backend"]} == {"openvino-cpu"}
        assert str(one.attrs["backend_version"]).startswith("openvino ")
    candidate = next(path for path in dumps if "bfloat16" in dump_index(path).get("r", {}).get("model_dtype", ""))
    assert dump_index(candidate)["r"]["dtype"] == "float32"

    refused = snakemake(folder, "reduce", *config, check=False)
    assert refused.returncode != 0
    lines = [line for line in refused.stderr.splitlines() if line.startswith("accubisect:")]
    assert len(lines) == 1 and "backend: openvino-cpu has no fusion rules switched off by name" in lines[0]
    assert "Traceback" not in refused.stderr


def dump_index(path) -> dict[str, dict]:
    with DumpReader(path) as dump:
        return {name: dump.info(name) for name in dump.names()}


def executed(name, layer_type, precision, inputs, outputs):
    return ExecutedNode(name, layer_type, precision, f"kernel_{precision}", tuple(inputs), tuple(outputs),
                        (precision,) * len(outputs), ())


def test_a_moved_conversion_is_the_same_program_and_a_changed_precision_is_not():
    """An exposed output moves a layout Reorder: the ONNX name `c` lands after it, the Convolution's own
    output becomes an invented name, and the program is unchanged. A node that ran in another precision
    is a difference.

        saved:   x ─ Conv ─ c ─ Reorder ─ Reorder<c:0 ─ Relu ─ y
        dumping: x ─ Conv ─ Conv:0 ─ Reorder ─ c ─ Relu ─ y
    """
    onnx_names = {"x", "c", "y"}
    saved = ExecutedGraph((executed("Conv", "Convolution", "bf16", ["x"], ["c"]),
                           executed("Reorder<c", "Reorder", "bf16", ["c"], ["Reorder<c:0"]),
                           executed("Relu", "Eltwise", "bf16", ["Reorder<c:0"], ["y"])), ("x",), ("y",), ())
    dumping = ExecutedGraph((executed("Conv", "Convolution", "bf16", ["x"], ["Conv:0"]),
                             executed("Reorder<Conv:0", "Reorder", "bf16", ["Conv:0"], ["c"]),
                             executed("Relu", "Eltwise", "bf16", ["c"], ["y"])), ("x",), ("y",), ())
    assert dumping.differences(saved, onnx_names) == []
    changed = ExecutedGraph((dumping.nodes[0], dumping.nodes[1], executed("Relu", "Eltwise", "f32", ["c"], ["y"])),
                            ("x",), ("y",), ())
    assert [node.name for node in changed.differences(saved, onnx_names)] == ["Relu"]
