"""The ort-cuda backend on a real GPU: native fp16 shows what ORT's CPU fp16 path hides, and the whole
workflow runs on the CUDA provider. Skipped, with the reason, where onnxruntime-gpu or a GPU is missing."""

import json

import h5py
import numpy as np
import onnx
import pytest
from conftest import EXAMPLE, copy_workflow, layer_norm_model, snakemake
from onnx import TensorProto, helper

from accubisect.core.errors import BackendError, ConfigError
from accubisect.core.onnx_graph import graph_nodes
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CUDA
from accubisect.runtime.finalize import finalize


def cuda_missing() -> str | None:
    """Why the CUDA backend cannot run here, or None."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    try:
        CUDA.check_installed()
        ort_compile.Runner(model.SerializeToString(), ort_compile.CompileOptions("off"), CUDA).activate()
    except (ConfigError, BackendError) as error:
        return str(error)
    return None


MISSING = cuda_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"no usable CUDA GPU: {MISSING}")


def test_native_fp16_overflows_where_the_cpu_fp16_path_does_not(tmp_path):
    """The LayerNorm sum of squares reaches 1e6: an fp16 tensor on the GPU cannot hold it."""
    path = layer_norm_model(tmp_path / "ln.onnx")
    model = onnx.load(path)
    x = np.random.default_rng(0).normal(0, 1000, (2, 64)).astype(np.float32)
    exact = ort_compile.Runner(path, ort_compile.CompileOptions("off"), CUDA).activate().infer(
                                    {"x": x})["y"]
    dtypes = {t: "float32" for node in model.graph.node for t in [*node.input, *node.output]}
    everything = {node.name for node in graph_nodes(model.graph)}
    for reduced, fails in ((everything, True), (everything - {"ln/pow", "ln/var", "ln/add_eps", "ln/sqrt"}, False)):
        final = finalize(model, reduced, "fp16", dtypes).SerializeToString()
        got = ort_compile.Runner(final, ort_compile.CompileOptions("off"), CUDA).activate().infer(
                                      {"x": x})["y"]
        assert (np.abs(got - exact).max() > 0.5) == fails


@pytest.fixture(scope="module")
def precision_on_gpu(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("cuda"))
    snakemake(folder, "precision_bisect", "--configfile", "examples/precision/config.yaml",
              "--config", "backend=ort-cuda")
    return folder


@pytest.mark.e2e
def test_precision_bisect_runs_natively_and_its_answer_passes(precision_on_gpu):
    base = precision_on_gpu / "results/precision_example/precision_bisect"
    result = json.loads((base / "result.json").read_text())
    finalized = json.loads((base / "finalize.json").read_text())
    assert result["final_verdict"]["passed"] and finalized["passed"]
    assert finalized["checked"] == "loaded and run by ONNX Runtime on CUDAExecutionProvider at level all"
    assert "bn" in base.joinpath("keep_dtype.txt").read_text().split()  # its variance constant is inf in fp16


@pytest.mark.e2e
def test_every_stage_ran_on_the_cuda_backend(precision_on_gpu):
    workspace = precision_on_gpu / "workspace"
    records = [json.loads(path.read_text()) for path in workspace.glob("compile/*/compile.json")]
    assert records and {record["backend"] for record in records} == {"ort-cuda"}
    dumps = list(workspace.glob("dump/*/dump.h5"))
    assert dumps
    for path in dumps:
        with h5py.File(path) as dump:
            assert dump.attrs["backend"] == "ort-cuda"


@pytest.mark.e2e
def test_fusion_bisect_runs_on_the_cuda_backend(tmp_path):
    folder = copy_workflow(tmp_path)
    snakemake(folder, "fusion_bisect", *EXAMPLE, "--config", "backend=ort-cuda")
    assert json.loads((folder / "results/fusion_bisect/result.json").read_text())["final_verdict"]["passed"]
