"""`snakemake fusion_bisect`: the fusion rules to switch off so the model passes, every other kept on.

Three kinds of job, each a function here:
- `plan_round` (a Snakemake checkpoint, one per round) checks the preconditions, ranks the rules that
  fired by the error of the nodes they made, and asks the pure search strategy for the next probes;
- `run_probe` (one job per probe) compiles the model with a set of rules off, runs every sample and
  judges the outputs;
- `write_result` collects every probe into result.json, fusion_switch.cfg and a summary.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from accubisect import ort_compile
from accubisect.accuracy import Tolerance, judge_outputs, load_val_func
from accubisect.catalogue import GRAPH_FUSION, UB_FUSION, installed_catalogue
from accubisect.compile_stage import Variant
from accubisect.dump import DumpReader
from accubisect.errors import AccubisectError, ConfigError
from accubisect.files import write_atomic, write_json
from accubisect.report_html import bisect_page
from accubisect.samples import load_arrays, load_golden
from accubisect.strategy import NOT_AMONG_CANDIDATES, Answer, next_probes


class PreconditionError(AccubisectError):
    """The bisection cannot find an answer for this model and configuration."""


def collect_rounds(plan_of: Callable[[int], str]) -> list[str]:
    """Round plans 0, 1, ... up to the one that is done; `plan_of(r)` makes Snakemake run round r first."""
    plans = [plan_of(0)]
    while not _read(plans[-1])["done"]:
        plans.append(plan_of(len(plans)))
    return plans


def candidates_of(fired: Sequence[str], chosen: Sequence[str] | None) -> list[str]:
    """The rules a bisection searches: those that fired, narrowed to `bisect.rules` when set."""
    if chosen is None:
        return list(fired)
    idle = [rule for rule in chosen if rule not in fired]
    if idle:
        raise ConfigError(f"bisect.rules: {idle} did not fire on this model; rules that fired: {list(fired)}")
    return [rule for rule in fired if rule in chosen]


def rank_rules(candidates: Sequence[str], report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Most suspect first: the rule whose nodes fail earliest in topological order in the fusion-on vs
    fusion-off comparison (error first appears there; later tensors inherit it), then by the largest
    mismatch among its nodes. Rules with no compared tensor keep the order they fired in, last."""
    evidence = {rule: {"rule": rule, "first_failing_index": None, "worst_mismatch": None} for rule in candidates}
    for row in report["tensors"]:
        entry = evidence.get(row["rule"])
        if entry is None:
            continue
        mismatch = row["worst"].get("mismatch", math.nan)
        entry["worst_mismatch"] = max(mismatch, entry["worst_mismatch"] or 0.0)
        if not row["passed"] and entry["first_failing_index"] is None:
            entry["first_failing_index"] = row["index"]
    order = {rule: i for i, rule in enumerate(candidates)}
    return sorted(evidence.values(), key=lambda e: (
        e["first_failing_index"] if e["first_failing_index"] is not None else math.inf,
        -(e["worst_mismatch"] if e["worst_mismatch"] is not None else -1.0), order[e["rule"]]))


def passes(sample_verdicts: Sequence[bool], min_pass_fraction: float) -> bool:
    return bool(sample_verdicts) and sum(sample_verdicts) / len(sample_verdicts) >= min_pass_fraction


def check_preconditions(report: Mapping[str, Any], min_pass_fraction: float) -> bool:
    """Fails when fusion-off already fails; returns whether fusion-on passes (then nothing to bisect)."""
    reference = [v["reference"]["passed"] for v in report["verdicts"] if "reference" in v]
    if reference and not passes(reference, min_pass_fraction):
        raise PreconditionError(f"the model fails even with fusion off ({report['reference']} fails against the "
                                "golden outputs): fusion is not the cause")
    return passes([v["candidate"]["passed"] for v in report["verdicts"]], min_pass_fraction)


def known_verdicts(fusion_on_passes: bool, verdict_files: Sequence[str]) -> dict[frozenset[str], bool]:
    """Configuration (rules off) -> passed, from the compare stage (nothing off) and every probe so far."""
    known = {frozenset(): fusion_on_passes}
    for path in verdict_files:
        verdict = json.loads(Path(path).read_text())
        known[frozenset(verdict["rules_off"])] = verdict["passed"]
    return known


def plan_round(compile_record: str, compare_report: str, verdicts: Sequence[str], plan: str, round_index: int,
               rules: Sequence[str] | None, parallel: int, min_pass_fraction: float) -> None:
    """Checkpoint job: writes the probes of round `round_index`, or the answer."""
    record, report = _read(compile_record), _read(compare_report)
    ranking = rank_rules(candidates_of(record["fired_rules"], rules), report)
    known = known_verdicts(check_preconditions(report, min_pass_fraction), verdicts)
    step = next_probes([entry["rule"] for entry in ranking], known, parallel)
    if isinstance(step, Answer):
        body = {"done": True, "answer": {"status": step.status, "culprits": list(step.culprits),
                                         "groups": [list(g) for g in step.groups]}}
        print(f"fusion_bisect: done after {round_index} round(s), {len(known) - 1} probe(s)", flush=True)
    else:
        body = {"done": False, "probes": [sorted(config) for config in step.probes], "suspects": step.suspects}
        print(f"fusion_bisect round {round_index}: {len(step.probes)} probe(s), {step.suspects} suspect rule(s) "
              f"left of {len(ranking)}", flush=True)
    write_json(Path(plan), {"round": round_index, "candidates": [e["rule"] for e in ranking], "ranking": ranking,
                            **body})


def run_probe(model: str, sample_inputs: Sequence[str], references: Sequence[str], variant: Mapping[str, Any],
              rules_off: Sequence[str], output_names: Sequence[str], accuracy: Mapping[str, Any],
              verdict: str) -> None:
    """Probe job: the model compiled with `variant` (fusion-on with `rules_off` off too), judged per sample."""
    start = time.perf_counter()
    options = Variant.from_json(variant).options(installed_catalogue())
    session = ort_compile.open_session(Path(model), options)
    tolerance, val_func = Tolerance.from_config(accuracy), load_val_func(accuracy.get("val_func"))
    samples = []
    for inputs, reference in zip(sample_inputs, references, strict=True):
        outputs = ort_compile.run_session(session, load_arrays(Path(inputs)), list(output_names))
        judged = judge_outputs(load_reference(Path(reference), output_names), outputs, tolerance, val_func)
        samples.append({"inputs": Path(inputs).name, **judged})
    passed = passes([s["passed"] for s in samples], accuracy["min_pass_fraction"])
    write_json(Path(verdict), {"rules_off": sorted(rules_off), "passed": passed, "samples": samples,
                               "worst": worst_outputs(samples), "seconds": round(time.perf_counter() - start, 3)})


def load_reference(path: Path, output_names: Sequence[str]) -> dict[str, np.ndarray]:
    """Golden outputs (.npz) or the model outputs held in a fusion-off dump."""
    if path.suffix == ".npz":
        return load_golden(path)
    with DumpReader(path) as dump:
        return {name: dump.read_output(name) for name in output_names}


def worst_outputs(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    rows = [row for sample in samples for row in sample["outputs"].values() if "max_abs" in row]
    if not rows:
        return {}
    return {"max_abs": max(r["max_abs"] for r in rows), "max_rel": max(r["max_rel"] for r in rows),
            "cosine": min(r["cosine"] for r in rows), "mismatch": max(r["mismatch"] for r in rows)}


def write_result(plans: Sequence[str], verdicts: Sequence[str], compare_report: str, compile_record: str,
                 result_json: str, fusion_switch: str, report_html: str, summary: str) -> None:
    """Final job: every probe, the answer, the deployable switch file and a short summary."""
    rounds = [_read(path) for path in plans]
    final = rounds[-1]
    answer = final["answer"]
    if answer["status"] == NOT_AMONG_CANDIDATES:
        raise PreconditionError("even with every candidate rule off the model fails: the culprits are not among "
                                f"the candidates {final['candidates']}; widen or drop bisect.rules")
    record, report = _read(compile_record), _read(compare_report)
    probes = _probes_by_round(rounds, {tuple(sorted(_read(v)["rules_off"])): _read(v) for v in verdicts})
    base_off = record["variant"]["rules_off"]
    result = {
        "candidates": final["candidates"],
        "ranking": final["ranking"],
        "ranking_use": "candidates were searched most suspect first (earliest failing tensor, then largest "
                       "mismatch, in the fusion-on vs fusion-off comparison); the first probe switched off only "
                       f"the top-ranked rule, {final['candidates'][0] if final['candidates'] else 'none'}",
        "probes": probes,
        "culprits": answer["culprits"],
        "groups": answer["groups"],
        "final_verdict": _final_verdict(answer["culprits"], probes, report),
        "fusion_on_verdict": {"passed": report["passed"], "worst": _worst_candidate(report)},
        "kept": [rule for rule in final["candidates"] if rule not in answer["culprits"]],
        "already_off": base_off,
    }
    write_json(Path(result_json), result)
    write_json(Path(fusion_switch), switch_document(set(base_off) | set(answer["culprits"])))
    write_atomic(Path(report_html), bisect_page(result))
    text = render_summary(result)
    write_atomic(Path(summary), text)


def switch_document(rules_off: set[str]) -> dict[str, Any]:
    """The seeds' fusion_switch.cfg with exactly `rules_off` set "off"."""
    catalogue = installed_catalogue()
    sections = {GRAPH_FUSION: {}, UB_FUSION: {}}
    for rule in sorted(rules_off):
        sections[catalogue.section_of(rule)][rule] = "off"
    return {"Switch": sections}


def _probes_by_round(rounds: Sequence[Mapping[str, Any]], verdicts: Mapping[tuple, Mapping[str, Any]]):
    probes = []
    for plan in rounds:
        for rules_off in plan.get("probes", []):
            verdict = verdicts[tuple(rules_off)]
            probes.append({"round": plan["round"], "rules_off": rules_off, "passed": verdict["passed"],
                           "samples_passed": [s["passed"] for s in verdict["samples"]], "worst": verdict["worst"],
                           "seconds": verdict["seconds"]})
    return probes


def _final_verdict(culprits: Sequence[str], probes, report) -> dict[str, Any]:
    if not culprits:
        return {"rules_off": [], "passed": report["passed"], "worst": _worst_candidate(report)}
    (probe,) = [p for p in probes if sorted(p["rules_off"]) == sorted(culprits)]
    return {key: probe[key] for key in ("rules_off", "passed", "samples_passed", "worst")}


def _worst_candidate(report: Mapping[str, Any]) -> dict[str, float]:
    return worst_outputs([v["candidate"] for v in report["verdicts"]])


def render_summary(result: Mapping[str, Any]) -> str:
    culprits, candidates = result["culprits"], result["candidates"]
    if not culprits:
        return "nothing to bisect: the model passes the accuracy check with every fusion on\n"
    before, after = result["fusion_on_verdict"]["worst"], result["final_verdict"]["worst"]
    change = f"max rel err {before.get('max_rel', math.nan):.2g} → {after.get('max_rel', math.nan):.2g} when off"
    lines = [f"{len(culprits)} of {len(candidates)} fired rules {'breaks' if len(culprits) == 1 else 'break'} "
             f"accuracy: {', '.join(culprits)} ({change}). {len(result['kept'])} fusions kept."]
    lines += [f"rules {' + '.join(group)} fail only together; switching off {group[0]} is enough"
              for group in result["groups"]]
    rounds = len({probe["round"] for probe in result["probes"]})
    lines.append(f"{len(result['probes'])} probe(s) in {rounds} round(s); the switch file is fusion_switch.cfg")
    return "\n".join(lines) + "\n"


def _read(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())
