"""Cluster resources: the fitted formula's shape, every job rule's benchmark file, and local errors in bounded
memory (chunked metrics equal the whole-tensor ones; batching changes nothing)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from accubisect.core.metrics import tensor_metrics
from accubisect.stages import local_error
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.dump import DumpStep, dump_sample
from accubisect.stages.local_error import LOCAL_CHUNK, LOCAL_METRICS, LocalErrorsStep, local_errors, local_metrics
from accubisect.workflow.resources import GPU_HOST_MB, MIN_RUNTIME, STAGES, search_resources, stage_resources

REPO = Path(__file__).resolve().parents[2]
MIB = 2**20
RUNS_MODEL = {"compile", "graph", "dump", "local", "probe"}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_asks_grow_with_the_model_and_the_sample(stage):
    sizes = [0, MIB, 10 * MIB, 100 * MIB, 1000 * MIB]
    for field in ("mem_mb", "runtime"):
        by_model = [stage_resources(size, MIB, 0)[stage][field] for size in sizes]
        by_sample = [stage_resources(MIB, size, 0)[stage][field] for size in sizes]
        assert by_model == sorted(by_model) and by_sample == sorted(by_sample)
    assert stage_resources(1000 * MIB, 1000 * MIB, 0)[stage]["mem_mb"] > stage_resources(0, 0, 0)[stage]["mem_mb"]


def test_tensors_drive_dump_probe_compare_and_local_memory_not_compile():
    small, large = stage_resources(MIB, MIB, 0), stage_resources(MIB, 400 * MIB, 0)
    for stage in ("dump", "probe", "compare", "local"):
        assert large[stage]["mem_mb"] >= small[stage]["mem_mb"] + 2 * 400  # at least the pair, twice
    assert large["compile"] == small["compile"]


def test_clamps_and_types():
    tiny = stage_resources(0, 0, 0)
    for stage, asked in tiny.items():
        assert all(isinstance(value, int) for value in asked.values())
        assert asked["runtime"] >= MIN_RUNTIME
        assert asked["mem_mb"] == int(np.ceil(STAGES[stage].base))  # nothing to scale: the interpreter's base
        assert asked["mem_mb"] >= 64  # the interpreter with numpy, h5py, onnx and onnxruntime is ~75 MiB


@pytest.mark.parametrize("gpus", [0, 1])
def test_only_stages_that_run_the_model_ask_for_gpus_and_their_host_memory(gpus):
    asked, cpu = stage_resources(50 * MIB, MIB, gpus), stage_resources(50 * MIB, MIB, 0)
    for stage in STAGES:
        runs = stage in RUNS_MODEL
        assert asked[stage]["gpu"] == (gpus if runs else 0)
        assert asked[stage]["mem_mb"] == cpu[stage]["mem_mb"] + (GPU_HOST_MB if runs and gpus else 0)


def _rules(text):
    """(name, body) of every rule and checkpoint of a .smk file; a rule made by `use rule A as B with:` is
    ("B", its with: block), which `_workflow_rules` completes."""
    starts = list(re.finditer(r"^(?:rule|checkpoint) (\w+):\n|^use rule \w+ as (\w+) with:\n", text, re.MULTILINE))
    for start, end in zip(starts, starts[1:] + [None]):
        body = text[start.end():end.start() if end else len(text)]
        yield start.group(1) or start.group(2), body.split("\nlocalrules:")[0]


def _workflow_rules(texts):
    """(name, body) of every rule of the workflow; a rule made by `use rule A as B with:` has A's directives,
    each that its with: block gives replaced."""
    rules = {name: body for text in texts for name, body in _rules(text)}
    for text in texts:
        for used, name in re.findall(r"^use rule (\w+) as (\w+) with:\n", text, re.MULTILINE):
            rules[name] = "".join({**_directives(rules[used]), **_directives(rules[name])}.values())
    return rules.items()


def _directives(body):
    return {part.split(":", 1)[0]: f"    {part}" for part in re.split(r"^    (?=\w+:)", body, flags=re.MULTILINE)
            if part.strip()}


def _local_rules(texts):
    return {name for text in texts for block in re.findall(r"^localrules:\n((?:    \w+,\n)+)", text, re.MULTILINE)
            for name in re.findall(r"\w+", block)}


def test_every_job_rule_asks_for_resources_and_writes_a_benchmark_beside_its_log():
    """A job is a rule that runs something (a script, or a rule it reuses); local ones (results, publishing)
    ask a cluster for nothing but still leave their time and memory beside their log."""
    texts = [path.read_text() for path in sorted((REPO / "rules").glob("*.smk"))] + [(REPO / "Snakefile").read_text()]
    local = _local_rules(texts) | {"all"}
    rules = dict(_workflow_rules(texts))
    jobs = {name: body for name, body in rules.items() if "script:" in body or "log:" in body}
    assert {"compile_variant", "map_graph", "dump_sample", "compare_dumps", "fusion_local_errors", "fusion_search",
            "bundle_compare", "assign_precision", "local_errors", "precision_search", "precision_deploy",
            "fusion_result", "precision_result", "publish_compare", "publish_fusion_bisect"} <= set(jobs)
    for name, body in jobs.items():
        if name not in local:
            assert re.search(r"^    resources:\n        mem_mb=RESOURCES\[\"(\w+)\"\]", body, re.MULTILINE), name
        benchmark = re.search(r"^    benchmark:\n        (.+)\n", body, re.MULTILINE)
        log = re.search(r"^    log:\n        (.+)\n", body, re.MULTILINE)
        assert benchmark and log, f"rule {name} has no benchmark: or log:"
        assert "benchmark.tsv" in benchmark.group(1), name
        # beside the log, in the stage's own folder: pruned with it, never part of a stage key
        assert _stem(benchmark.group(1)) == _stem(log.group(1)), name
    assert not [name for name, body in rules.items() if name not in jobs and "benchmark:" in body]


def test_every_resources_entry_names_a_stage():
    used = {m for path in (REPO / "rules").glob("*.smk") for m in re.findall(r'RESOURCES\["(\w+)"\]', path.read_text())}
    assert used <= {*STAGES, "search"} and {"local", "dump", "probe", "search", "compare"} <= used


# Local errors in bounded memory


def _local(reference, candidate):
    metrics = tensor_metrics(reference, candidate, rtol=0.0, atol=0.0)
    return {name: metrics[name] for name in LOCAL_METRICS}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_chunked_local_metrics_equal_the_whole_tensors_to_rounding(dtype):
    rng = np.random.default_rng(0)
    reference = rng.normal(0, 3, 3 * LOCAL_CHUNK + 17).astype(dtype)
    candidate = (reference + rng.normal(0, 1e-3, reference.size)).astype(dtype)
    candidate[5] = reference[5] * 40  # the worst element, in the first chunk
    chunked, whole = local_metrics(reference, candidate), _local(reference, candidate)
    assert chunked["max_abs"] == whole["max_abs"] and chunked["max_rel"] == whole["max_rel"]  # extremes exact
    assert chunked["rel_euclidean"] == pytest.approx(whole["rel_euclidean"], rel=1e-12)
    assert chunked["cosine"] == pytest.approx(whole["cosine"], rel=1e-12)
    assert reference[5] * 40 == candidate[5] or dtype is np.float16  # the inputs are left as they were


@pytest.mark.parametrize(("dtype", "special"), [(np.float32, np.nan), (np.float32, np.inf), (np.float32, -np.inf),
                                              (np.float64, 1e200)])  # the last: its square overflows a sum
def test_large_pairs_with_special_values_are_judged_whole(dtype, special):
    rng = np.random.default_rng(0)
    reference = rng.normal(size=2 * LOCAL_CHUNK).astype(dtype)
    candidate = reference.copy()
    candidate[LOCAL_CHUNK + 3] = special
    chunked, whole = local_metrics(reference, candidate), _local(reference, candidate)
    assert json.dumps(chunked) == json.dumps(whole)


def test_identical_and_small_pairs_are_exact():
    rng = np.random.default_rng(0)
    big = rng.normal(size=2 * LOCAL_CHUNK).astype(np.float32)
    assert local_metrics(big, big) == {"rel_euclidean": 0.0, "max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0}
    small, noisy = big[:1000], big[:1000] + np.float32(1e-3)
    assert local_metrics(small, noisy) == _local(small, noisy)
    with pytest.raises(ValueError, match="shapes differ"):
        local_metrics(big, big[:10])


def test_local_errors_in_batches_equal_one_run(ffn_model, tmp_path, monkeypatch):
    """Cutting the isolated nodes into one run per node changes no number of local.json."""
    np.savez(tmp_path / "sample0_inputs.npz", x=np.random.default_rng(0).normal(0, 2, (1, 4, 8)).astype(np.float32))
    for variant, level in (("fusion_off", "off"), ("fusion_on", "all")):
        spec = {"name": variant, "level": level, "session_config": {}, "rules_off": []}
        compile_variant(CompileStep(ffn_model, spec, "ort-cpu", tmp_path / variant / "model.onnx",
                                    tmp_path / variant / "c.json"))
    dump_sample(DumpStep(ffn_model, tmp_path / "fusion_off" / "model.onnx", tmp_path / "sample0_inputs.npz",
                         tmp_path / "dump.h5", "fusion_off", "sample0", "ort-cpu"))
    arguments = (tmp_path / "fusion_on" / "model.onnx", (tmp_path / "dump.h5",), (tmp_path / "sample0_inputs.npz",),
                 "ort-cpu")
    local_errors(LocalErrorsStep(*arguments, tmp_path / "one.json"))
    runs = []
    original = local_error.LocalRun.run_alone
    monkeypatch.setattr(local_error, "LOCAL_BATCH_BYTES", 1)  # every node alone
    monkeypatch.setattr(local_error.LocalRun, "run_alone", lambda *a: runs.append(a[1]) or original(*a))
    local_errors(LocalErrorsStep(*arguments, tmp_path / "each.json"))
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "each.json").read_bytes()
    assert len(runs) > 1 and all(len(batch) == 1 for batch in runs)
    assert json.loads((tmp_path / "one.json").read_text())["nodes"]


def test_batches_keep_topological_order_and_put_an_oversized_node_alone(monkeypatch):
    """Budget 50 bytes: an empty tensor weighs nothing, a node over the budget runs alone, small ones share.

        x ─ a ─ empty ─ b ─ big(100) ─ c ─ s1(10) ─ d ─ s2(10) ─ e ─ s3(10)
    """
    from types import SimpleNamespace

    chain = [("a", "x", "empty"), ("b", "empty", "big"), ("c", "big", "s1"), ("d", "s1", "s2"), ("e", "s2", "s3")]
    sizes = {"x": 0, "empty": 0, "big": 100, "s1": 10, "s2": 10, "s3": 10}
    nodes = [SimpleNamespace(name=name, inputs=(i,), outputs=(o,)) for name, i, o in chain]
    monkeypatch.setattr(local_error, "graph_nodes", lambda graph: nodes)
    monkeypatch.setattr(local_error, "_nbytes", lambda dump, name: sizes[name])
    monkeypatch.setattr(local_error, "LOCAL_BATCH_BYTES", 50)
    batches = local_error._batches(SimpleNamespace(graph=None), {"a", "b", "c", "d", "e"}, set(sizes))
    assert batches == [{"a"}, {"b"}, {"c"}, {"d", "e"}]


def _stem(path: str) -> str:
    return re.sub(r"\.(benchmark\.tsv|log)\b", "", path.rstrip(","))


def test_a_search_asks_for_its_parallel_probes_and_its_time_budget():
    probe = stage_resources(50 * MIB, MIB, 0)["probe"]
    assert search_resources(probe, 2, None) == {"mem_mb": 2 * probe["mem_mb"], "runtime": 30 * probe["runtime"],
                                                "gpu": 0}
    assert search_resources(probe, 4, 12.5)["runtime"] == 13 + probe["runtime"]
