"""Every answer survives contact with real exported graphs: each corpus model goes through `compare`,
`fusion_bisect` and `precision_bisect` (force_fp16) with the real `snakemake`, and each answer is fed back
and verified, as a user would deploy it.

Fusion is judged at the default tolerances; precision at the tolerances fp16 can reach (rtol 1e-2),
since no fp16 model meets rtol 1e-3 on every element.
"""

import hashlib
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from conftest import copy_workflow, snakemake
from corpus import CORPUS
from html_pages import assert_links_resolve

from accubisect.formats.instances import InstancesRecord

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def write_config(folder, name, model, **settings):
    config = {"model": str(model.model_path()), "samples": "samples", **settings}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return f"{name}.yaml"


def read(folder, path):
    return json.loads((folder / path).read_text())


def fed_back(folder, model, settings, section, key, value, target):
    """The report of `target` run with `section.key` set to an answer, over the model's `settings`."""
    name = f"{key}_fed_back"
    overridden = {**settings, section: {**settings.get(section, {}), key: value}}
    snakemake(folder, target, "--configfile", write_config(folder, name, model, results=name, **overridden))
    return read(folder, f"{name}/{target}/report.json")


@pytest.fixture(scope="module", params=sorted(CORPUS))
def corpus_run(request, tmp_path_factory):
    """One model through the three targets, as two runs sharing the workspace (compile and dumps are
    reused: their keys do not depend on the accuracy settings)."""
    model = CORPUS[request.param]
    folder = copy_workflow(tmp_path_factory.mktemp(model.name))
    model.write_samples(folder / "samples")
    fusion = snakemake(folder, "compare", "fusion_bisect", "--configfile",
                       write_config(folder, "fusion", model, **model.fusion_config))
    precision = snakemake(folder, "precision_bisect", "--configfile",
                          write_config(folder, "precision", model, **model.precision_config))
    return model, folder, fusion.stdout + fusion.stderr + precision.stdout + precision.stderr


def test_no_traceback_reaches_the_user(corpus_run):
    _, _, output = corpus_run
    assert "Traceback" not in output


def test_fusion_switch_fed_back_passes(corpus_run):
    model, folder, _ = corpus_run
    result = read(folder, "results/fusion_bisect/result.json")
    assert result["final_verdict"]["passed"]
    switch = "results/fusion_bisect/fusion_switch.cfg"
    assert fed_back(folder, model, model.fusion_config, "compile", "fusion_switch", switch, "compare")["passed"]


def test_instances_name_the_culprit_rules_and_the_hybrid_passes(corpus_run):
    """fusion_bisect goes on to the instances of its culprit rules on every real model: one line per rule, and a
    hybrid that reverts only the breaking instances passes. MiniLM (approximate Gelu) breaks at some of its three
    FastGelu (2 of 3 on ORT 1.31), so the hybrid keeps a fusion the rule-level answer switches off."""
    model, folder, _ = corpus_run
    record = InstancesRecord.read(folder / "results/fusion_bisect/instances.json")
    assert list(record.culprit_rules) == read(folder, "results/fusion_bisect/result.json")["culprits"]
    assert record.hybrid["passed"]
    lines = (folder / "results/fusion_bisect/instances.txt").read_text().splitlines()
    for rule in record.culprit_rules:
        instances = record.of_rule(rule)
        breaking = sum(bool(instance.breaks) for instance in instances)
        assert f"rule {rule}: {breaking} of {len(instances)} instances break accuracy" in "\n".join(lines)
    if model.name == "minilm":
        gelus = record.of_rule("GeluApproximation")
        assert len(gelus) == 3 and 0 < sum(bool(i.breaks) for i in gelus) < 3
        hybrid = onnx.load(folder / "results/fusion_bisect/hybrid.onnx")
        assert [node.op_type for node in hybrid.graph.node].count("FastGelu") == 3 - sum(bool(i.breaks) for i in gelus)


def test_pages_state_their_run_and_link_each_other(corpus_run):
    """The four pages of every real model name the model by its sha256 and the library versions, and every
    link (answer files, the partner page, a graph node's row on the comparison's page) resolves."""
    model, folder, _ = corpus_run
    digest = hashlib.sha256(model.model_path().read_bytes()).hexdigest()[:12]
    pages = sorted((folder / "results").glob("*/report.html"))
    assert [page.parent.name for page in pages] == ["compare", "fusion_bisect", "precision", "precision_bisect"]
    for path in pages:
        header = assert_links_resolve(path).header
        assert f"(sha256 {digest})" in header and "onnxruntime" in header


def test_keep_dtype_fed_back_passes_and_names_real_nodes(corpus_run):
    model, folder, _ = corpus_run
    result = read(folder, "results/precision_bisect/result.json")
    assert result["final_verdict"]["passed"]
    kept = (folder / "results/precision_bisect/keep_dtype.txt").read_text().split()
    original = onnx.load(model.model_path(), load_external_data=False)
    real_names = {node.name for node in original.graph.node} | {out for node in original.graph.node
                                                                 for out in node.output}
    assert set(kept) <= real_names
    assert len(kept) <= 3 * max(1, len(result["culprits"]))  # the map is bounded: about one name per node
    assert fed_back(folder, model, model.precision_config, "precision", "keep_dtype", kept, "precision")["passed"]


def test_deployable_model_is_the_users_model_in_mixed_precision(corpus_run):
    model, folder, _ = corpus_run
    path = folder / "results/precision_bisect/model.onnx"
    final = onnx.load(path)
    onnx.checker.check_model(final)
    assert {node.domain for node in final.graph.node} <= {"", "ai.onnx", "ai.onnx.ml"}  # no ORT-internal ops
    constants = [*final.graph.initializer, *(attribute.t for node in final.graph.node if node.op_type == "Constant"
                                             for attribute in node.attribute if attribute.name == "value")]
    assert any(constant.data_type == onnx.TensorProto.FLOAT16 for constant in constants)  # weights stored in fp16
    assert read(folder, "results/precision_bisect/finalize.json")["passed"]
    feeds = dict(np.load(folder / "samples/sample0_inputs.npz"))
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        assert all(np.isfinite(output).all() for output in session.run(None, feeds) if output.dtype.kind == "f")


@pytest.mark.parametrize("name", ["magika", "deepcut"])
def test_bf16_runs_end_to_end(name, tmp_path):
    """bf16's range holds magika's 1.26e5 that overflows fp16, but its 8-bit mantissa costs deepcut's
    BatchNorms accuracy that fp16 keeps: the same search, emulated on the CPU, and a bf16 model that passes
    onnx.checker."""
    model = CORPUS[name]
    folder = copy_workflow(tmp_path)
    model.write_samples(folder / "samples")
    config = write_config(folder, "bf16", model, accuracy={"rtol": 1e-2, "atol": 1e-3},
                          precision={"dtype": "bf16"})
    snakemake(folder, "precision_bisect", "--configfile", config)
    result = read(folder, "results/precision_bisect/result.json")
    assert result["dtype"] == "bf16" and result["final_verdict"]["passed"]
    assert (result["status"] == "nothing to fix") == (name == "magika")
    final = onnx.load(folder / "results/precision_bisect/model.onnx")
    onnx.checker.check_model(final, full_check=True)
    assert any(init.data_type == onnx.TensorProto.BFLOAT16 for init in final.graph.initializer)


@pytest.mark.parametrize(("name", "below_the_floor"), [("ppocr_rec", True), ("magika", False)])
def test_the_default_check_gets_the_noise_floor_verdict_and_a_budget_goes_on(name, below_the_floor, tmp_path):
    """At fp32's default check (rtol 1e-3, ntol 0) the recognizer's 400 reduced nodes make only rounding
    error and still fail it: one warning line. Magika's overflowing LayerNorm sum is a real culprit: no
    warning. Either way 6 probes publish a passing answer marked not proven minimal, and a bigger budget
    goes on from the verdicts on disk."""
    model = CORPUS[name]
    folder = copy_workflow(tmp_path)
    model.write_samples(folder / "samples")
    run = snakemake(folder, "precision_bisect", "--configfile", write_config(folder, "six", model,
                                                                               bisect={"max_probes": 6}))
    warnings = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("WARNING accubisect:")]
    assert len(warnings) == (1 if below_the_floor else 0)
    assert all("is tighter than fp16 reaches on this model" in line for line in warnings)
    first = read(folder, "results/precision_bisect/result.json")
    assert not first["minimal"] and len(first["probes"]) == 6 and first["final_verdict"]["passed"]
    assert "not proven minimal: bisect.max_probes (6) ran out" in run.stdout
    snakemake(folder, "precision_bisect", "--configfile", write_config(folder, "twelve", model,
                                                                       bisect={"max_probes": 12}))
    more = read(folder, "results/precision_bisect/result.json")
    assert [p["off"] for p in more["probes"][:6]] == [p["off"] for p in first["probes"]]
    assert all(p["from_disk"] for p in more["probes"][:6]) and len(more["probes"]) > 6
