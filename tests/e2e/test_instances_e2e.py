"""The real `snakemake fusion_bisect` finds which instances of each culprit rule break accuracy: on a model
where GeluApproximation fires at five sites and two break (tests/gelu_sites.py), on the bundled example, and
on a healthy corpus model (YOLOv8n), whose NCHWc chains revert whole. MiniLM compiled with approximate Gelu,
and every other corpus model, is checked in tests/corpus/test_real_models.py."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from conftest import EXAMPLE, copy_workflow, jobs_run, snakemake
from corpus import CORPUS
from gelu_sites import BREAKING, SCALES, build_gelu_sites

from accubisect.core.hybrid import Surgeon, instances_of
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.instances import InstancesRecord
from accubisect.runtime.catalogue import installed_catalogue

pytestmark = pytest.mark.e2e
TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}  # the default check


def published(folder, results="results"):
    base = folder / results / "fusion_bisect"
    return InstancesRecord.read(base / "instances.json"), (base / "instances.txt").read_text(), base / "hybrid.onnx"


def unoptimized(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def within(got, want, rtol, atol):
    return all(np.all(np.abs(g - w) <= atol + rtol * np.abs(w)) for g, w in zip(got, want, strict=True))


def fusion_on(folder):
    """The fusion-on variant's saved graph and its graph record, from the workspace."""
    compiled = next(path.parent / "model.onnx" for path in (folder / "workspace" / "compile").glob("*/compile.json")
                    if json.loads(path.read_text())["variant"]["name"] == "fusion_on")
    graph = next(GraphRecord.read(path) for path in (folder / "workspace" / "graph").glob("*/graph.json")
                 if GraphRecord.read(path).variant == "fusion_on")
    return compiled, graph


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("gelu_sites"))
    config = build_gelu_sites(folder)
    return folder, config, snakemake(folder, "fusion_bisect", "--configfile", config)


def test_two_of_five_gelu_sites_break_accuracy(sites):
    folder, _, run = sites
    record, text, _ = published(folder, "gelu_results")
    assert record.culprit_rules == ("GeluApproximation",)
    instances = record.of_rule("GeluApproximation")
    assert len(instances) == len(SCALES)
    breaking = sorted(i.original_nodes[0].split("/")[0] for i in instances if i.breaks)
    assert breaking == sorted(BREAKING)
    assert all(i.not_revertable is None and i.rules == ("GeluFusion", "GeluApproximation") for i in instances)
    names = [i.name for i in instances if i.breaks]
    assert text.splitlines()[1] == f"rule GeluApproximation: 2 of 5 instances break accuracy: {', '.join(names)}"
    assert record.search["status"] == "found" and record.search["minimal"]
    assert record.search["ranking"][0]["name"] in names  # the largest local error is a breaking site
    console = run.stdout.splitlines()  # the run ends with the summary, which ends with the instance lines
    end = console.index("answer files:", console.index("gelu_results/fusion_bisect/summary.txt:"))
    assert console[end - 2:end] == text.splitlines()[1:]


def test_the_hybrid_keeps_the_other_fusions_and_passes_on_every_sample(sites):
    folder, _, _ = sites
    record, _, hybrid = published(folder, "gelu_results")
    assert record.hybrid["passed"] and record.hybrid["samples_passed"] == [True] * 3
    model = onnx.load(hybrid)
    assert [node.op_type for node in model.graph.node].count("FastGelu") == len(SCALES) - 2
    assert {f"{site}/gelu/erf" for site in BREAKING} <= {node.name for node in model.graph.node}
    compiled, _ = fusion_on(folder)
    fusion_on_passes = []
    for index in range(3):
        feeds = dict(np.load(folder / "gelu_samples" / f"sample{index}_inputs.npz"))
        golden = np.load(folder / "gelu_samples" / f"sample{index}_outputs.npz")
        want = [golden[f"y{site}"] for site in range(len(SCALES))]
        assert within(unoptimized(hybrid, feeds), want, **TOLERANCE)
        fusion_on_passes.append(within(unoptimized(compiled, feeds), want, **TOLERANCE))
    assert not all(fusion_on_passes)


def test_a_rerun_takes_every_instance_verdict_from_disk(sites):
    folder, config, _ = sites
    before, _, _ = published(folder, "gelu_results")
    for path in [*(folder / "workspace" / "fusion_bisect").glob("*/instances.json"),
                 folder / "gelu_results" / "fusion_bisect" / "instances.json"]:
        path.unlink()
    rerun = snakemake(folder, "fusion_bisect", "--configfile", config)
    assert "fusion_instances" in jobs_run(rerun) and "fusion_search" not in jobs_run(rerun)
    after, _, _ = published(folder, "gelu_results")
    assert after.instances == before.instances
    assert all(probe["from_disk"] for probe in after.search["probes"])
    assert [p["off"] for p in after.search["probes"]] == [p["off"] for p in before.search["probes"]]


def test_a_budget_spent_before_any_hybrid_passes_leaves_the_rule_level_answer_as_hybrid(tmp_path):
    """With bisect.max_probes 1, the instance search reverts only the top-ranked site, which fails (the other
    breaking site stays fused), and stops: fusion_bisect still succeeds. hybrid.onnx is then the fusion-on graph
    compiled with GeluApproximation off, exactly as ORT compiles it, and passes on every sample; instances.txt
    says which instances' verdicts are unknown and why. A rerun without the budget goes on to the instances."""
    folder = copy_workflow(tmp_path)
    config = build_gelu_sites(folder)
    run = snakemake(folder, "fusion_bisect", "--configfile", config, "--config", "bisect={'max_probes': 1}")
    record, text, hybrid = published(folder, "gelu_results")
    reason = "bisect.max_probes (1) ran out after 1 probe(s), before any hybrid passed"
    assert record.search["status"] == "unfinished" and record.fallback.startswith(reason)
    assert record.hybrid["reverted"] == [] and record.hybrid["rules_off"] == ["GeluApproximation"]
    assert record.hybrid["samples_passed"] == [True] * 3 and all(i.breaks is None for i in record.instances)
    assert text.splitlines()[1:] == [
        "rule GeluApproximation: which of its 5 instances break accuracy is not known",
        f"no hybrid of reverted instances passes ({record.fallback}): hybrid.onnx is the rule-level answer: the "
        "fusion-on graph compiled with GeluApproximation off (run it with graph optimization off)"]
    assert text.splitlines()[-1] in run.stdout.splitlines()
    options = ort.SessionOptions()
    options.add_session_config_entry("optimization.enable_gelu_approximation", "1")
    options.optimized_model_filepath = str(tmp_path / "rule_off.onnx")
    ort.InferenceSession(str(folder / "gelu_sites.onnx"), options, providers=["CPUExecutionProvider"],
                         disabled_optimizers=sorted(installed_catalogue().ort_names({"GeluApproximation"})))
    ops = [node.op_type for node in onnx.load(hybrid).graph.node]
    assert ops == [node.op_type for node in onnx.load(tmp_path / "rule_off.onnx").graph.node]
    assert ops.count("Gelu") == len(SCALES) and "FastGelu" not in ops
    for index in range(3):
        feeds = dict(np.load(folder / "gelu_samples" / f"sample{index}_inputs.npz"))
        golden = np.load(folder / "gelu_samples" / f"sample{index}_outputs.npz")
        assert within(unoptimized(hybrid, feeds), [golden[f"y{site}"] for site in range(len(SCALES))], **TOLERANCE)
    snakemake(folder, "fusion_bisect", "--configfile", config)
    record, text, _ = published(folder, "gelu_results")
    assert record.fallback is None and text.splitlines()[1].startswith("rule GeluApproximation: 2 of 5 instances")


def test_the_bundled_example_has_one_gelu_instance_and_it_breaks(tmp_path):
    folder = copy_workflow(tmp_path)
    snakemake(folder, "fusion_bisect", *EXAMPLE)
    record, text, hybrid = published(folder)
    assert text.splitlines()[1] == "rule GeluApproximation: 1 of 1 instances breaks accuracy: FastGelu"
    (gelu,) = record.instances
    assert gelu.breaks and gelu.original_nodes == ("gelu/div", "gelu/erf", "gelu/add", "gelu/mul", "gelu/half")
    ops = [node.op_type for node in onnx.load(hybrid).graph.node]
    assert "FastGelu" not in ops and {"Gemm", "SkipLayerNormalization", "FusedConv"} <= set(ops)
    assert record.hybrid["passed"]


def corpus_folder(tmp_path, name, **settings):
    model = CORPUS[name]
    folder = copy_workflow(tmp_path)
    model.write_samples(folder / "samples")
    config = {"model": str(model.model_path()), "samples": "samples", **model.fusion_config, **settings}
    (folder / "fusion.yaml").write_text(yaml.safe_dump(config))
    return model, folder


@pytest.mark.integration
def test_a_healthy_model_has_no_culprit_rules_and_its_nchwc_chains_revert_whole(tmp_path):
    """YOLOv8n passes with every fusion on: no rule, no instance searched, and the hybrid is the fusion-on
    graph. Its NchwcTransformer instances are whole NCHWc chains (blocked tensors inside), each revertable:
    reverting them all computes as the original model does."""
    model, folder = corpus_folder(tmp_path, "yolov8n")
    snakemake(folder, "fusion_bisect", "--configfile", "fusion.yaml")
    record, text, hybrid = published(folder)
    assert record.culprit_rules == () and record.instances == () and record.search["probes"] == []
    assert text.splitlines()[1] == "no culprit rules: fusion_bisect switched no rule off, so no instance is searched"
    compiled, graph = fusion_on(folder)
    assert len(onnx.load(hybrid).graph.node) == len(onnx.load(compiled).graph.node)
    original = onnx.load(model.model_path())
    surgeon = Surgeon(onnx.load(compiled), original, {o for node in graph.nodes for o in node.original_nodes})
    chains = instances_of(graph.nodes, ["NchwcTransformer"], surgeon.original_tensors)
    assert len(chains) > 5 and all(surgeon.why_not(chain) is None for chain in chains)
    assert max(len(chain.nodes) for chain in chains) > 3  # ReorderInput, several NCHWc nodes, ReorderOutput
    reverted = surgeon.hybrid(chains)
    assert not any(node.domain == "com.microsoft.nchwc" for node in reverted.graph.node)
    feeds = dict(np.load(folder / "samples" / "sample0_inputs.npz"))
    assert within(unoptimized(reverted, feeds), unoptimized(model.model_path(), feeds), rtol=1e-5, atol=1e-5)
