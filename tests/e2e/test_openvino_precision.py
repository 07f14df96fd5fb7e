"""precision_bisect on backend openvino-cpu, on the CPU's own kernels: a small model whose variance is
computed as E[x²]−E[x]² over a Convolution's output near 100, which cancels when that output is rounded to
bf16 (or f16), runs through `snakemake precision_bisect`; the answer, keeping the Convolution in f32, is
checked by compiling the published IR again here and reading back what ran; with a MatMul instead, whose
mark the plugin drops, the job says no keep set passes and why. The corpus cases are in
tests/corpus/test_openvino_corpus.py. A reduced type this CPU lacks is skipped with the plugin's capabilities."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import copy_workflow, openvino_precision_step, save_float_model, snakemake
from onnx import helper

from accubisect.bisection.openvino_precision import OpenVinoPrecisionStep, Probes, bisect_openvino_precision
from accubisect.core.errors import FinalizeError, PreconditionError
from accubisect.runtime.openvino_backend import CAPABILITY, HINTS, cpu_capabilities

CAPABILITIES = cpu_capabilities()
DTYPES = [pytest.param(dtype, marks=pytest.mark.skipif(
    capability not in CAPABILITIES, reason=f"this CPU's OpenVINO capabilities are {', '.join(CAPABILITIES)}: "
                                           f"no {capability}")) for dtype, capability in CAPABILITY.items()]


def variance_model(path, matmul: bool = False):
    """A harmless Convolution ("stem": half its integer input, exact in any type), then one near 100
    ("project") whose channel variance is E[x²]−E[x]²: rounding "project"'s output to the reduced type cancels
    the variance. With `matmul`, "project" is a MatMul and an Add, which the plugin makes one FullyConnected
    and drops the marks of."""
    rng = np.random.default_rng(0)
    weights = {"stem_w": 0.5 * np.eye(16).reshape(16, 16, 1, 1), "eps": np.array([1e-3]),
               **({"project_w": rng.normal(0, 0.25, (8, 8)), "project_b": np.full(8, 100.0)} if matmul else
                  {"project_w": rng.normal(0, 0.25, (16, 16, 1, 1)), "project_b": np.full(16, 100.0)})}
    project = ([helper.make_node("MatMul", ["stem", "project_w"], ["mm"], name="project"),
                helper.make_node("Add", ["mm", "project_b"], ["h"], name="bias")] if matmul else
               [helper.make_node("Conv", ["stem", "project_w", "project_b"], ["h"], name="project")])
    nodes = [helper.make_node("Conv", ["x", "stem_w"], ["stem"], name="stem"), *project,
             helper.make_node("Mul", ["h", "h"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq"], ["meansq"], name="mean_of_squares", axes=[1]),
             helper.make_node("ReduceMean", ["h"], ["mean"], name="mean", axes=[1]),
             helper.make_node("Mul", ["mean", "mean"], ["mean2"], name="square_of_mean"),
             helper.make_node("Sub", ["meansq", "mean2"], ["var"], name="variance"),
             helper.make_node("Sub", ["h", "mean"], ["centered"], name="center"),
             helper.make_node("Add", ["var", "eps"], ["vareps"], name="add_eps"),
             helper.make_node("Sqrt", ["vareps"], ["std"], name="std"),
             helper.make_node("Div", ["centered", "std"], ["y"], name="normalize")]
    shape = [1, 16, 8, 8]
    return save_float_model(nodes, weights, shape, path)


@pytest.mark.e2e
@pytest.mark.parametrize("dtype", DTYPES)
def test_precision_bisect_keeps_the_cancelling_convolution_in_f32_on_real_kernels(dtype, tmp_path):
    import openvino as ov

    model = variance_model(tmp_path / "variance.onnx")
    (tmp_path / "samples").mkdir()
    feeds = {"x": np.random.default_rng(1).integers(-8, 9, (1, 16, 8, 8)).astype(np.float32)}
    np.savez(tmp_path / "samples" / "sample0_inputs.npz", **feeds)
    folder = copy_workflow(tmp_path / "project")
    run = snakemake(folder, "precision_bisect", "--config", f"model={model}", f"samples={tmp_path / 'samples'}",
                    "backend=openvino-cpu", f"precision={{dtype: {dtype}}}", "accuracy={rtol: 0.01, atol: 0.001}")
    results = folder / "results" / "precision_bisect"
    summary = (results / "summary.txt").read_text()  # after the run's context line, as the console shows it
    assert f"results/precision_bisect/summary.txt:\n{summary}" in run.stdout, run.stdout
    assert "results/precision_bisect/keep_dtype.txt" in run.stdout, run.stdout
    assert (results / "keep_dtype.txt").read_text() == "project\n"
    result = json.loads((results / "result.json").read_text())
    assert result["status"] == "fixed" and result["candidates"] >= 2, result
    assert result["final_verdict"]["passed"] and result["final_verdict"]["dropped"] == []
    assert not result["probes"][0]["passed"] and len(result["probes"]) < 10  # nothing kept fails; a few probes
    assert "passes the check" in (results / "summary.txt").read_text()

    core = ov.Core()  # the published IR, as a user loads it: the Convolution runs in f32, the stem reduced
    compiled = core.compile_model(core.read_model(str(results / "model.xml")), "CPU",
                                  {"INFERENCE_PRECISION_HINT": HINTS[dtype]})
    ran = {op.get_friendly_name(): op.get_rt_info()["runtimePrecision"].astype(str)
           for op in compiled.get_runtime_model().get_ordered_ops()}
    assert ran["project/WithoutBiases"] == "f32" and ran["stem"] == HINTS[dtype], ran
    reference = core.compile_model(str(model), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(feeds)[0]
    np.testing.assert_allclose(compiled(feeds)[0], reference, rtol=0.01, atol=0.001)


def direct_step(model, folder) -> OpenVinoPrecisionStep:
    """The job's step on one sample, its reference OpenVINO's f32 compile, run without Snakemake, bf16."""
    feeds = {"x": np.random.default_rng(1).integers(-8, 9, (1, 16, 8, 8)).astype(np.float32)}
    np.savez(folder / "sample0_inputs.npz", **feeds)
    return openvino_precision_step(model, [folder / "sample0_inputs.npz"], folder)


@pytest.mark.skipif("BF16" not in CAPABILITIES, reason=f"this CPU's OpenVINO capabilities are {CAPABILITIES}")
def test_a_mark_the_plugin_drops_is_reported_and_no_keep_set_is_claimed(tmp_path):
    """The MatMul and Add become one FullyConnected whose `precise` marks the plugin drops: read back, the
    node is reported as not keepable, and the job says in one line that no keep set passes."""

    model = variance_model(tmp_path / "variance.onnx", matmul=True)
    step = direct_step(model, tmp_path)
    with pytest.raises(PreconditionError) as caught:
        bisect_openvino_precision(step)
    message = str(caught.value)
    assert message.startswith(f"{model}: with all ") and "\n" not in message, message
    assert "the plugin drops the marks of 1 more, which stay bf16 even when every ONNX node they stand for is " \
           "marked (1 FullyConnected: bias)" in message and "no keep set passes" in message, message
    assert not step.result_json.exists() and not step.ir_xml.exists()


@pytest.mark.skipif("BF16" not in CAPABILITIES, reason=f"this CPU's OpenVINO capabilities are {CAPABILITIES}")
def test_an_answer_that_fails_compiled_again_from_its_files_publishes_nothing(tmp_path, monkeypatch):
    """The search finds its keep set on real kernels; the published IR's own check (made to fail here, as a
    plugin that ran the IR otherwise than the probes would) stops the job in one line, and no file is left."""
    published = Probes.publish

    def failing(self, kept, folder):
        return {**published(self, kept, folder), "passed": False}

    monkeypatch.setattr(Probes, "publish", failing)
    step = direct_step(variance_model(tmp_path / "variance.onnx"), tmp_path)
    with pytest.raises(FinalizeError) as caught:
        bisect_openvino_precision(step)
    message = str(caught.value)
    assert message.startswith(f"{step.model}: the IR with the answer's marks (keep 1 ") and "\n" not in message
    assert "nothing is published" in message, message
    assert not [path for path in tmp_path.iterdir() if path.name not in
                {"variance.onnx", "sample0_inputs.npz", "sample0_outputs.npz", "verdicts"}], list(tmp_path.iterdir())


@pytest.mark.e2e
@pytest.mark.skipif("BF16" not in CAPABILITIES, reason=f"this CPU's OpenVINO capabilities are {CAPABILITIES}")
def test_a_rerun_of_the_search_reads_every_verdict_from_the_workspace(tmp_path):
    """The search's verdicts are files in the workspace, as the ORT searches' are: with the search's folder
    and the published answer deleted (what a killed job leaves undone), the rerun probes nothing, writes no
    verdict, and gives the same answer and probes; pruning what the configuration does not need keeps them."""
    model = variance_model(tmp_path / "variance.onnx")
    (tmp_path / "samples").mkdir()
    feeds = {"x": np.random.default_rng(1).integers(-8, 9, (1, 16, 8, 8)).astype(np.float32)}
    np.savez(tmp_path / "samples" / "sample0_inputs.npz", **feeds)
    folder = copy_workflow(tmp_path / "project")
    (folder / "bf16.yaml").write_text(f"model: {model}\nsamples: {tmp_path / 'samples'}\nbackend: openvino-cpu\n"
                                      "precision: {dtype: bf16}\naccuracy: {rtol: 0.01, atol: 0.001}\n")
    config = ("--configfile", "bf16.yaml")
    snakemake(folder, "precision_bisect", *config)
    results = folder / "results" / "precision_bisect"
    first = json.loads((results / "result.json").read_text())
    verdicts = {path: path.stat().st_mtime_ns for path in (folder / "workspace").rglob("verdict.json")}
    assert len(verdicts) == len({tuple(p["kept_fp32"]) for p in first["probes"]}) > 2, (verdicts, first["probes"])

    shutil.rmtree(folder / "results")
    shutil.rmtree(folder / "workspace" / "precision_bisect")
    snakemake(folder, "precision_bisect", *config)
    again = json.loads((results / "result.json").read_text())
    assert {path: path.stat().st_mtime_ns for path in (folder / "workspace").rglob("verdict.json")} == verdicts
    assert again["probes"] == first["probes"] and again["keep_dtype"] == first["keep_dtype"] == ["project"], again
    log = next((folder / "workspace" / "precision_bisect").glob("*/search.log")).read_text()
    assert "of them from disk" in log and "probe(s) running" not in log, log
    pruned = subprocess.run([sys.executable, "-m", "accubisect.workflow.cli", "workspace", "prune", "--keep-config",
                             "bf16.yaml"], cwd=folder, capture_output=True, text=True, check=True).stdout
    assert "verdict" not in pruned and "precision_probe" not in pruned, pruned
