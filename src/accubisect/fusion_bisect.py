"""`snakemake fusion_bisect`: the fusion rules to switch off so the model passes, every other kept on.

Three kinds of job, each a function here:
- `plan_round` (a Snakemake checkpoint, one per round) checks the preconditions, ranks the rules that
  fired by the error of the nodes they made, and asks the pure search strategy for the next probes;
- `run_probe` (one job per probe) compiles the model with a set of rules off, runs every sample and
  judges the outputs;
- `write_result` collects every probe into result.json, fusion_switch.cfg and a summary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accubisect import ort_compile
from accubisect.backends import backend_named
from accubisect.bisection import (
    PreconditionError,
    candidate_passes,
    compare_verdict,
    final_verdict,
    judge_probe,
    known_verdicts,
    probes_by_round,
    rows_by,
    worst_local_error,
    write_plan,
)
from accubisect.catalogue import GRAPH_FUSION, UB_FUSION, installed_catalogue
from accubisect.compile_stage import Variant
from accubisect.errors import ConfigError
from accubisect.files import read_json, write_atomic, write_json
from accubisect.report_html import bisect_page
from accubisect.run_context import with_context
from accubisect.strategy import NOT_AMONG_CANDIDATES


def candidates_of(fired: Sequence[str], chosen: Sequence[str] | None) -> list[str]:
    """The rules a bisection searches: those that fired, narrowed to `bisect.rules` when set."""
    if chosen is None:
        return list(fired)
    idle = [rule for rule in chosen if rule not in fired]
    if idle:
        raise ConfigError(f"bisect.rules: {idle} did not fire on this model; rules that fired: {list(fired)}")
    return [rule for rule in fired if rule in chosen]


def rank_rules(candidates: Sequence[str], report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Most suspect first: the rule whose nodes make the largest error themselves (local error: a fused node
    run alone on fusion-off's own tensors), then the rule whose nodes fail earliest in topological order
    (error first appears there; later tensors inherit it), then the largest mismatch among its nodes.
    Rules with no compared tensor keep the order they fired in, last."""
    rows = rows_by(report, "rule", candidates)
    evidence = [{"name": rule, "local_error": worst_local_error(rows[rule]),
                 "first_failing_index": next((row["index"] for row in rows[rule] if not row["passed"]), None),
                 "worst_mismatch": max((row["worst"]["mismatch"] for row in rows[rule] if "mismatch" in row["worst"]),
                                       default=None)}
                for rule in candidates]
    return sorted(evidence, key=lambda e: (  # stable: ties keep the order the rules fired in
        -(e["local_error"] or 0.0),
        e["first_failing_index"] if e["first_failing_index"] is not None else math.inf,
        -(e["worst_mismatch"] if e["worst_mismatch"] is not None else -1.0)))


def plan_round(compile_record: str, compare_report: str, verdicts: Sequence[str], plan: str, round_index: int,
               rules: Sequence[str] | None, parallel: int, min_pass_fraction: float) -> None:
    """Checkpoint job: writes the probes of round `round_index`, or the answer."""
    record, report = read_json(compile_record), read_json(compare_report)
    ranking = rank_rules(candidates_of(record["fired_rules"], rules), report)
    not_the_cause = (f"the model fails even with fusion off ({report['reference']} fails against the golden "
                     "outputs): fusion is not the cause")
    known = known_verdicts(candidate_passes(report, min_pass_fraction, not_the_cause), verdicts)
    write_plan(plan, "fusion_bisect", "rule", round_index, ranking, known, parallel)


def run_probe(model: str, sample_inputs: Sequence[str], references: Sequence[str], variant: Mapping[str, Any],
              off: Sequence[str], output_names: Sequence[str], accuracy: Mapping[str, Any], backend: str,
              verdict: str) -> None:
    """Probe job: the model compiled with `variant` (fusion-on with the rules `off` off too), judged per sample."""
    start = time.perf_counter()
    options = Variant.from_json(variant).options(installed_catalogue())
    session = ort_compile.open_session(Path(model), options, backend_named(backend))
    judge_probe(session, sample_inputs, references, output_names, accuracy, off, verdict, start)


def write_result(plans: Sequence[str], verdicts: Sequence[str], compare_report: str, compile_record: str,
                 context: Mapping[str, Any], result_json: str, fusion_switch: str, report_html: str,
                 summary: str) -> None:
    """Final job: every probe, the answer, the deployable switch file and a short summary whose first line
    is the run's context (`context_line`'s arguments)."""
    rounds = [read_json(path) for path in plans]
    final = rounds[-1]
    answer = final["answer"]
    if answer["status"] == NOT_AMONG_CANDIDATES:
        raise PreconditionError("even with every candidate rule off the model fails: the culprits are not among "
                                f"the candidates {final['candidates']}; widen or drop bisect.rules")
    record, report = read_json(compile_record), read_json(compare_report)
    probes = probes_by_round(rounds, verdicts)
    base_off = record["variant"]["rules_off"]
    result = {
        "candidates": final["candidates"],
        "ranking": final["ranking"],
        "ranking_use": "candidates were searched most suspect first (largest local error of their nodes, then "
                       "earliest failing tensor, then largest mismatch, in the fusion-on vs fusion-off "
                       "comparison); the first probe switched off only "
                       f"the top-ranked rule, {final['candidates'][0] if final['candidates'] else 'none'}",
        "probes": probes,
        "culprits": answer["culprits"],
        "groups": answer["groups"],
        "final_verdict": final_verdict(answer["culprits"], probes, compare_verdict(report)),
        "fusion_on_verdict": compare_verdict(report),
        "kept": [rule for rule in final["candidates"] if rule not in answer["culprits"]],
        "already_off": base_off,
    }
    write_json(Path(result_json), result)
    write_json(Path(fusion_switch), switch_document(set(base_off) | set(answer["culprits"])))
    write_atomic(Path(report_html), bisect_page(result))
    write_atomic(Path(summary), with_context(context, render_summary(result)))


def switch_document(rules_off: set[str]) -> dict[str, Any]:
    """The seeds' fusion_switch.cfg with exactly `rules_off` set "off"."""
    catalogue = installed_catalogue()
    sections = {GRAPH_FUSION: {}, UB_FUSION: {}}
    for rule in sorted(rules_off):
        sections[catalogue.section_of(rule)][rule] = "off"
    return {"Switch": sections}


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
