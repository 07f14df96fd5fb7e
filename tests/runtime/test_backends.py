"""Backends: the CUDA backend's failures a user meets on a machine that cannot run it, and the native
precision path (the finalized model with real fp16 tensors) that the CUDA backend takes."""


import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import REPO, copy_workflow, run_expecting_error, save_model
from onnx import TensorProto, helper

from accubisect.core.errors import BackendError
from accubisect.formats.graph_record import GraphRecord
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU, CUDA, CpuBackend
from accubisect.runtime.finalize import finalize
from accubisect.runtime.ort_exposed import run_exposed
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.dump import DumpStep, dump_sample
from accubisect.stages.graph import GraphStep, write_graph
from accubisect.stages.local_error import LocalRun
from accubisect.stages.precision_stage import tensor_dtypes
from accubisect.workflow.resources import stage_resources

PRECISION_EXAMPLE = REPO / "examples" / "precision"
# What onnxruntime-gpu 1.31.1 (with pip's CUDA 13 and cuDNN 9 libraries preloaded) logs on a machine without
# an NVIDIA driver, before it builds the session on the CPU provider anyway.
FALLBACK_LOG = (
    "\x1b[1;31m2026-11-21 22:05:11.401014324 [E:onnxruntime:Default, provider_bridge_ort.cc:2458 operator()] "
    "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 onnxruntime::Provider& "
    "onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library "
    "/venv/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime_providers_cuda.so with error: "
    "libcuda.so.1: cannot open shared object file: No such file or directory\n\x1b[m\n"
    "\x1b[0;93m2026-11-21 22:05:11.401068235 [W:onnxruntime:Default, onnxruntime_pybind_state.cc:1295 "
    "CreateExecutionProviderFactoryInstance] Failed to create CUDAExecutionProvider. Require cuDNN 9.* and "
    "CUDA 13.*.\x1b[m\n"
)


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="onnxruntime-gpu is installed: the CPU-only install's error cannot happen here")
@pytest.mark.e2e  # runs the real snakemake command
def test_cuda_backend_on_a_cpu_only_install_fails_in_one_line(tmp_path):
    folder = copy_workflow(tmp_path)
    line = run_expecting_error(folder, "backend=ort-cuda")
    assert "backend: ort-cuda needs ONNX Runtime's CUDAExecutionProvider" in line
    assert "pip install 'onnxruntime-gpu[cuda,cudnn]~=1.31.0'" in line
    assert not (folder / "workspace").exists()


def test_a_session_onnx_runtime_moved_to_the_cpu_is_refused(ffn_model):
    """ORT builds the session on the CPU without raising when the CUDA provider cannot load; a CPU run must
    never be reported as the GPU's."""
    session = ort.InferenceSession(str(ffn_model), providers=["CPUExecutionProvider"])
    CPU.check_session(session, "")
    with pytest.raises(BackendError) as caught:
        CUDA.check_session(session, FALLBACK_LOG)
    message = str(caught.value)
    assert "ort-cuda: ONNX Runtime could not use CUDAExecutionProvider and fell back to CPUExecutionProvider" in message
    assert "(libcuda.so.1: cannot open shared object file: No such file or directory)" in message
    assert "\n" not in message and "\x1b" not in message


def test_model_running_stages_ask_a_cluster_for_the_backends_gpus():
    for gpus in (CPU.gpus, CUDA.gpus):
        asked = stage_resources(50 * 2**20, 2**20, gpus)
        assert {asked[stage]["gpu"] for stage in ("compile", "graph", "dump", "probe")} == {gpus}
        assert asked["compare"]["gpu"] == asked["bundle"]["gpu"] == 0
    assert (CPU.gpus, CUDA.gpus) == (0, 1)


@pytest.fixture(scope="module")
def compiled_example(tmp_path_factory):
    """The precision example compiled at level all, its graph JSON and an fp32 dump of its first sample."""
    folder = tmp_path_factory.mktemp("native")
    model, inputs = PRECISION_EXAMPLE / "extractor.onnx", PRECISION_EXAMPLE / "samples" / "sample0_inputs.npz"
    spec = {"name": "fusion_on", "level": "all", "session_config": {}, "rules_off": []}
    compile_variant(CompileStep(model, spec, "ort-cpu", folder / "model.onnx", folder / "compile.json"))
    write_graph(GraphStep(model, folder / "model.onnx", folder / "compile.json", folder / "graph.json"))
    dump_sample(DumpStep(model, folder / "model.onnx", inputs, folder / "dump.h5", "fusion_on", "sample0", "ort-cpu"))
    return folder, inputs


class NativeOnCpu(CpuBackend):
    """The CUDA backend's way with reduced nodes (the finalized model), on the CPU provider."""

    def reduced_model(self, model, reduced, dtype, dtypes, weights=None):
        return finalize(model, reduced, dtype, dtypes, weights)


NATIVE_ON_CPU = NativeOnCpu("ort-cpu", gpus=0, providers=("CPUExecutionProvider",))


def test_native_precision_runs_the_finalized_model(compiled_example):
    """The path the CUDA backend takes, on the CPU provider: reduced nodes are real fp16 nodes whose
    outputs keep their names, so the fp16 run's tensors join the fp32 run's."""
    folder, inputs = compiled_example
    native = NATIVE_ON_CPU
    compiled = onnx.load(folder / "model.onnx")
    dtypes = tensor_dtypes(compiled, inputs, native)
    nodes = GraphRecord.read(folder / "graph.json").by_name
    reduced = native.reduced_model(compiled, set(nodes), "fp16", dtypes)
    feeds = dict(np.load(inputs))
    names = [out for name in nodes for out in nodes[name].outputs]
    exact, _ = run_exposed(compiled, names, feeds, CPU)
    low, _ = run_exposed(reduced, names, feeds, native)
    assert low["y"].dtype == np.float32  # graph outputs stay fp32 behind a Cast
    inner = [name for name in names if name != "y"]
    assert inner and all(low[name].dtype == np.float16 and low[name].shape == exact[name].shape for name in inner)
    session = ort_compile.Runner(reduced.SerializeToString(), ort_compile.CompileOptions("off"), native).activate()
    assert session.providers() == ["CPUExecutionProvider"]


def test_native_local_error_runs_each_node_alone_in_real_fp16(compiled_example):
    """The BatchNorm's variance (up to 1e6) becomes inf as an fp16 constant: run alone on exact inputs the
    node wipes out its output natively, as under emulation; the gain after it makes no error of its own."""
    folder, inputs = compiled_example
    native = NATIVE_ON_CPU
    compiled = onnx.load(folder / "model.onnx")
    dtypes = tensor_dtypes(compiled, inputs, native)
    nodes = [node.name for node in GraphRecord.read(folder / "graph.json").nodes]
    local = LocalRun(compiled, native, ("fp16", dtypes)).measure(nodes, (folder / "dump.h5",), (inputs,)).nodes
    assert local["bn"]["rel_euclidean"] > 0.5
    assert local["gain"]["rel_euclidean"] < 1e-2


def test_host_device_copies_in_a_saved_graph_are_dropped(tmp_path):
    """A graph saved from a CUDA session holds ORT's MemcpyFromHost/MemcpyToHost nodes, which ORT's CUDA
    provider fails to load again (onnxruntime issues 11348 and 17837: no kernel for MemcpyToHost; a
    duplicate name when it places the copies anew). Without them the graph computes the same values."""
    nodes = [helper.make_node("MemcpyFromHost", ["x"], ["x_CUDAExecutionProvider"], name="Memcpy"),
             helper.make_node("Relu", ["x_CUDAExecutionProvider"], ["r"], name="relu"),
             helper.make_node("MemcpyToHost", ["r"], ["r_host"], name="Memcpy_token_1"),
             helper.make_node("Neg", ["r_host"], ["n"], name="neg"),
             helper.make_node("MemcpyToHost", ["n"], ["y"], name="Memcpy_token_2")]
    path = save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [], tmp_path / "saved.onnx")
    x = np.array([-2.0, -1.0, 1.0, 2.0], np.float32)
    with_copies = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    ort_compile.drop_copies(path)
    model = onnx.load(path)
    assert [(node.op_type, list(node.input), list(node.output)) for node in model.graph.node] == [
        ("Relu", ["x"], ["r"]), ("Neg", ["r"], ["y"])]
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    np.testing.assert_array_equal(got, with_copies)
    np.testing.assert_array_equal(got, -np.maximum(x, 0))
