"""`snakemake fusion_bisect`: the fusion rules to switch off so the model passes, every other kept on.

Two jobs, each a function here:
- `search_rules` checks the preconditions, ranks the rules that fired by the error of the nodes they
  made, and runs the shared search (`bisection.search`); a probe compiles the model with a set of rules
  off, runs the samples and judges the outputs;
- `write_result` turns the search into result.json, fusion_switch.cfg, a report and a summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.search import (
    UNFINISHED,
    Budget,
    PreconditionError,
    SearchRecord,
    VerdictStore,
    answer_status,
    candidate_passes,
    compare_verdict,
    final_verdict,
    listed,
    rows_by,
    search,
    worst_local_error,
)
from accubisect.core.errors import ConfigError
from accubisect.core.rules import GRAPH_FUSION, UB_FUSION
from accubisect.core.strategy import NOT_AMONG_CANDIDATES, Config
from accubisect.formats.files import read_json, write_atomic, write_json
from accubisect.reports.report_html import bisect_page
from accubisect.reports.run_context import with_context
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import backend_named
from accubisect.runtime.catalogue import installed_catalogue
from accubisect.stages.compile_stage import Variant


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


def search_rules(model: str, compile_record: str, compare_report: str, sample_inputs: Sequence[str],
                 references: Sequence[str], variant: Mapping[str, Any], bisect: Mapping[str, Any],
                 output_names: Sequence[str], accuracy: Mapping[str, Any], backend: str,
                 verdicts: Mapping[str, Any], threads: int, search_json: str) -> None:
    """Search job: the rules to switch off, probed round by round in this process."""
    record, report = read_json(compile_record), read_json(compare_report)
    ranking = rank_rules(candidates_of(record["fired_rules"], bisect["rules"]), report)
    not_the_cause = (f"the model fails even with fusion off ({report['reference']} fails against the golden "
                     "outputs): fusion is not the cause")
    nothing_off_passes = candidate_passes(report, accuracy["min_pass_fraction"], not_the_cause)
    judge = SampleJudge.load(sample_inputs, references, output_names, accuracy)
    base, catalogue, runtime = Variant.from_json(variant), installed_catalogue(), backend_named(backend)

    def probe(off: Config, threads: int) -> dict[str, Any]:
        probed = Variant("probe", base.level, base.session_config, base.rules_off | off)
        return judge.judge(ort_compile.open_session(Path(model), probed.options(catalogue), runtime, threads=threads))

    found = search("fusion_bisect", ranking, nothing_off_passes, VerdictStore.from_json(verdicts), probe,
                   bisect["parallel"], threads, Budget.from_config(bisect))
    write_json(Path(search_json), found.to_json())


def write_result(search_json: str, compare_report: str, compile_record: str, context: Mapping[str, Any],
                 result_json: str, fusion_switch: str, report_html: str, summary: str) -> None:
    """Final job: every probe, the answer, the deployable switch file and a short summary whose first line
    is the run's context (`context_line`'s arguments)."""
    found = SearchRecord.read(search_json)
    if found.status == NOT_AMONG_CANDIDATES:
        raise PreconditionError("even with every candidate rule off the model fails: the culprits are not among "
                                f"the candidates {found.candidates}; widen or drop bisect.rules")
    record, report = read_json(compile_record), read_json(compare_report)
    base_off = record["variant"]["rules_off"]
    culprits = list(found.culprits)
    result = {
        "candidates": found.candidates,
        "ranking": list(found.ranking),
        "ranking_use": "candidates were searched most suspect first (largest local error of their nodes, then "
                       "earliest failing tensor, then largest mismatch, in the fusion-on vs fusion-off "
                       "comparison); the first probe switched off only "
                       f"the top-ranked rule, {found.candidates[0] if found.candidates else 'none'}",
        "probes": list(found.probes),
        "culprits": culprits,
        "groups": [list(group) for group in found.groups],
        "minimal": found.status != UNFINISHED,
        "search": answer_status(found, "rule"),
        "final_verdict": final_verdict(culprits, found.probes, compare_verdict(report)),
        "fusion_on_verdict": compare_verdict(report),
        "kept": [rule for rule in found.candidates if rule not in culprits],
        "already_off": base_off,
    }
    write_json(Path(result_json), result)
    write_json(Path(fusion_switch), switch_document(set(base_off) | set(culprits)))
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
    if result["minimal"]:
        verb = "breaks" if len(culprits) == 1 else "break"
        found = f"{len(culprits)} of {len(candidates)} fired rules {verb} accuracy"
    else:
        found = f"switching off {len(culprits)} of {len(candidates)} fired rules passes"
    lines = [f"{found}: {listed(culprits)} ({change}). {len(result['kept'])} fusions kept."]
    lines += [f"rules {' + '.join(group)} fail only together; switching off {group[0]} is enough"
              for group in result["groups"]]
    lines.append(f"{result['search']}; the switch file is fusion_switch.cfg")
    return "\n".join(lines) + "\n"
