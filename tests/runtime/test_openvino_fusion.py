"""fusion_bisect on backend openvino-cpu, on real compiles: an attention block the CPU plugin fuses into one
snippet `Subgraph` (MatMul, scale, Softmax, MatMul) sums otherwise than the un-fused kernels, which a tight
check (rtol 1e-7, atol 0) sees; switching snippets off fixes it (rule level), and so does one barrier
output on the scores inside that Subgraph (instance level). The answer's properties and barrier outputs
are compiled again here and checked against fusion off."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import copy_workflow, openvino_context, save_model, snakemake
from corpus import CORPUS
from onnx import TensorProto, helper, numpy_helper

from accubisect.bisection.openvino_fusion import (
    NOTHING_TO_FIX,
    FusionProbes,
    OpenVinoFusionStep,
    bisect_fusion,
    bisect_openvino_fusion,
)
from accubisect.core.errors import FinalizeError
from accubisect.formats.openvino_fusion_result import OpenVinoDeploy, OpenVinoFusionResult
from accubisect.formats.verdict import VerdictStore
from accubisect.runtime.openvino_backend import cpu_capabilities
from accubisect.runtime.openvino_fusion import SNIPPET_TYPE, SWITCHES, FusionCompiler, unbroken

TIGHT = {"rtol": 1e-7, "atol": 0.0, "ntol": 0.0, "cosine": None, "min_pass_fraction": 1.0, "val_func": None}
LOOSE = {**TIGHT, "rtol": 1e-2, "atol": 1e-3}


def attention_model(path):
    """softmax(q·kᵀ·scale)·v, the pattern the plugin makes one MHA snippet."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], name="transpose", perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"], name="qk"),
             helper.make_node("Mul", ["qk", "scale"], ["scores"], name="scale"),
             helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    shape = [1, 4, 64, 32]
    return save_model(nodes, [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in "qkv"],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                      [numpy_helper.from_array(np.array(0.177, np.float32), "scale")], path)


def sample(path):
    rng = np.random.default_rng(0)
    feeds = {name: rng.normal(0, 3, (1, 4, 64, 32)).astype(np.float32) for name in "qkv"}
    np.savez(path, **feeds)
    return feeds


def test_a_barrier_breaks_exactly_its_snippet_and_snippets_off_breaks_them_all(tmp_path):
    compiler = FusionCompiler(attention_model(tmp_path / "attention.onnx"), threads=1)
    fused = compiler.instances(compiler.compile())
    assert [(i.layer_type, i.barrier) for i in fused] == [(SNIPPET_TYPE, "scores")], fused
    barred = compiler.graph(compiler.compile(barriers=["scores"]))
    assert unbroken(barred, fused) == [] and [n.layer_type for n in barred.nodes if "softmax" in n.original_layers] == [
        "Softmax"]
    assert unbroken(compiler.graph(compiler.compile()), fused) == [fused[0].name]  # without it, held whole
    off = compiler.graph(compiler.compile(SWITCHES))
    assert SNIPPET_TYPE not in {n.layer_type for n in off.nodes} and {"MatMul", "Softmax"} <= {
        n.layer_type for n in off.nodes}


def test_the_search_finds_snippets_and_the_one_subgraph_and_verifies_both(tmp_path):
    model = attention_model(tmp_path / "attention.onnx")
    sample(tmp_path / "sample0_inputs.npz")
    probes = FusionProbes(model, 1, (tmp_path / "sample0_inputs.npz",), ("y",), TIGHT)
    found = bisect_fusion(probes, *stores(tmp_path / "tight"))
    assert found.switches_off == ("snippets",) and list(found.barriers.values()) == ["scores"], found
    assert found.deploy == OpenVinoDeploy({"SNIPPETS_MODE": "DISABLE"}, ("scores",))
    assert found.verified == {"switches": True, "barriers": True}
    assert not found.probes[0]["passed"] and all(p.get("not_broken", []) == [] for p in found.probes)
    assert bisect_fusion(probes, *stores(tmp_path / "tight")).probes == found.probes  # every verdict read back

    loose = FusionProbes(model, 1, (tmp_path / "sample0_inputs.npz",), ("y",), LOOSE)
    unfused = bisect_fusion(loose, *stores(tmp_path / "loose"))
    assert unfused.status == NOTHING_TO_FIX and len(unfused.probes) == 1


def test_an_answer_that_fails_compiled_again_publishes_nothing(tmp_path, monkeypatch):
    """The search finds its answer on real compiles; its check compiled again on every sample (made to fail
    here) stops the job in one line, and no deploy.json, result.json or summary is written."""
    from accubisect.bisection import openvino_fusion

    monkeypatch.setattr(openvino_fusion, "holds", lambda search, answer: False if answer else None)
    model = attention_model(tmp_path / "attention.onnx")
    sample(tmp_path / "sample0_inputs.npz")
    step = OpenVinoFusionStep(model, (tmp_path / "sample0_inputs.npz",), ("y",), TIGHT, 1,
                              *(tmp_path / name for name in ("result.json", "deploy.json", "summary.txt")),
                              *(store.to_json() for store in stores(tmp_path / "verdicts")),
                              openvino_context(model, [tmp_path / "sample0_inputs.npz"]))
    with pytest.raises(FinalizeError) as caught:
        bisect_openvino_fusion(step)
    message = str(caught.value)
    assert message.startswith(f"{model}: the answer (snippets off, barriers on 1 ") and "\n" not in message
    assert "nothing is published" in message, message
    assert sorted(path.name for path in tmp_path.iterdir()) == ["attention.onnx", "sample0_inputs.npz", "verdicts"]


@pytest.mark.e2e
@pytest.mark.skipif("BF16" not in cpu_capabilities(), reason=f"fusion_bisect's compare runs bf16; this CPU's "
                                                             f"OpenVINO capabilities are {cpu_capabilities()}")
def test_snakemake_fusion_bisect_on_openvino_publishes_a_deployable_answer(tmp_path):
    import openvino as ov

    model = attention_model(tmp_path / "attention.onnx")
    (tmp_path / "samples").mkdir()
    feeds = sample(tmp_path / "samples" / "sample0_inputs.npz")
    folder = copy_workflow(tmp_path / "project")
    run = snakemake(folder, "fusion_bisect", "--config", f"model={model}", f"samples={tmp_path / 'samples'}",
                    "backend=openvino-cpu", "precision={dtype: bf16}", "accuracy={rtol: 1.0e-7, atol: 0.0}")
    results = folder / "results" / "fusion_bisect"
    summary = (results / "summary.txt").read_text()  # after the run's context line, as the console shows it
    assert f"results/fusion_bisect/summary.txt:\n{summary}" in run.stdout, run.stdout
    assert "results/fusion_bisect/deploy.json" in run.stdout, run.stdout
    deploy = OpenVinoDeploy.read(results / "deploy.json")
    assert deploy == OpenVinoDeploy({"SNIPPETS_MODE": "DISABLE"}, ("scores",)), deploy
    result = OpenVinoFusionResult.read(results / "result.json")
    assert result.status == "fixed" and result.deploy == deploy and len(result.probes) < 10, result
    assert "switch off snippets" in (results / "summary.txt").read_text()

    core = ov.Core()  # the answer as a user deploys it, against fusion off
    f32 = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}
    reference = core.compile_model(str(model), "CPU", {**f32, "SNIPPETS_MODE": "DISABLE"})(feeds)[0]
    assert not np.array_equal(core.compile_model(str(model), "CPU", f32)(feeds)[0], reference)
    barred = core.read_model(str(model))
    barred.add_outputs(list(deploy.barrier_outputs))
    for compiled in (core.compile_model(str(model), "CPU", {**f32, **deploy.properties}),
                     core.compile_model(barred, "CPU", f32)):
        np.testing.assert_allclose(compiled(feeds)[compiled.output("y")], reference, rtol=1e-7, atol=0)


def stores(folder) -> tuple[VerdictStore, VerdictStore]:
    """A search's verdict stores, rule and instance level, under `folder`."""
    return VerdictStore(folder / "probe", {"level": "rule"}), VerdictStore(folder / "instance_probe", {})


READABLE = sorted(set(CORPUS) - {"silero_vad"})  # its op15 export OpenVINO cannot read (test_openvino_corpus.py)


def corpus_probes(name: str, folder, accuracy: dict) -> FusionProbes:
    model = CORPUS[name]
    inputs = tuple(sorted(model.write_samples(folder).glob("*_inputs.npz")))
    outputs = [o.name for o in onnx.load(str(model.model_path()), load_external_data=False).graph.output]
    return FusionProbes(model.model_path(), 1, inputs, outputs, {**TIGHT, **accuracy})


@pytest.mark.integration
@pytest.mark.parametrize("name", READABLE)
def test_every_corpus_model_passes_its_check_with_openvinos_fusions(name, tmp_path):
    probes = corpus_probes(name, tmp_path, CORPUS[name].precision_config["accuracy"])
    found = bisect_fusion(probes, *stores(tmp_path))
    assert found.status == NOTHING_TO_FIX and len(found.probes) == 1


@pytest.mark.integration
def test_ppocr_recs_attention_snippets_are_what_a_tight_check_sees(tmp_path):
    """At rtol 1e-6 ppocr_rec fails with its two attention Subgraphs fused: snippets off fixes it, and so do
    barriers on both (one alone does not); the other corpus models are bit for bit with snippets off."""
    probes = corpus_probes("ppocr_rec", tmp_path, {"rtol": 1e-6})
    found = bisect_fusion(probes, *stores(tmp_path))
    fused = {i["name"]: i["type"] for i in found.instances or ()}
    assert found.switches_off == ("snippets",) and len(found.barriers) == 2, found
    assert {fused[name] for name in found.barriers} == {SNIPPET_TYPE}
    assert found.verified == {"switches": True, "barriers": True} and len(found.probes) < 12
