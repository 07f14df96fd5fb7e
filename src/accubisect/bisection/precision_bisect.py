"""`snakemake precision_bisect`: the fewest nodes to keep in fp32 so the model passes, the rest reduced.

The precision kind of `Bisection` (`protocol.py`): the candidates are the compiled nodes the configured
mode runs in reduced precision; a node switched off is kept in fp32, and a probe runs the reduced model
with a configuration's nodes kept in fp32 as the backend runs it (emulated on the CPU, native on a GPU).
The ranking is each node's local error and overflow in the reduced run; before searching, the search job
measures the noise floor (`noise_floor.py`). The answer is written as the seeds' files, keep_dtype.txt and
modify_mixlist.json, in the terms of the deployable model: the user's own model in mixed precision, on which
the deploy job, between the search and the result job, verifies the search's answer, makes it 1-minimal or
searches again (`deployable.py`). The jobs are the shared ones (`jobs.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import onnx

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.noise_floor import measure_floor
from accubisect.bisection.protocol import Bisection, nothing_off_verdict, rows_by, worst_local_error
from accubisect.bisection.search import answer_status, listed
from accubisect.core.strategy import Configuration
from accubisect.formats.assignment import Assignment
from accubisect.formats.bisect_result import AssignedAnswer, DeployedAnswer, PrecisionResult, ResultVerdict
from accubisect.formats.compare_report import CompareReport
from accubisect.formats.deployed import MINIMIZED, SEARCHED, DeployedRecord
from accubisect.formats.finalize_record import FinalizeRecord
from accubisect.formats.mixlist import write_keep_dtype, write_modify_mixlist
from accubisect.formats.model import load_compiled
from accubisect.formats.search_record import UNFINISHED, SearchRecord
from accubisect.formats.verdict import VerdictRecord
from accubisect.reports.graph_view import graph_section
from accubisect.reports.report_html import Answer
from accubisect.reports.run_context import apply_command
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend, backend_named

NOT_THE_CAUSE = "even with every reduced node in fp32 the model fails: precision is not the cause"
RANKING_USE = ("nodes were searched most suspect first (largest local error on exact inputs, then overflow in the "
               "reduced run); the first probe kept only the top-ranked node in fp32")


class PrecisionBisection(Bisection[PrecisionResult]):
    """Nodes kept in fp32 (their reduction switched off) in the reduced model of the precision stage's
    assignment."""

    name, unit, action = "precision_bisect", "node", "keep in fp32"
    cause, reference_words, advice = "precision", "in fp32", "try fusion_bisect"
    search_files = frozenset({"compiled_model", "assignment"})
    result_files = frozenset({"assignment", "graph_json", "keep_dtype", "modify_mixlist", "deployed_json"})

    @cached_property
    def assignment(self) -> Assignment:
        return Assignment.read(self.step.assignment)

    def candidates(self) -> list[str]:
        return list(self.assignment.reduced)

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        return rank_nodes(candidates, self.report)

    def prober(self) -> PrecisionProbe:
        step = self.search_step
        return PrecisionProbe.of(step.compiled_model, self.assignment, self.sample_judge(), backend_named(step.backend))

    def floor(self, ranking: Sequence[Mapping[str, Any]], judge_whole: Callable[[Configuration], VerdictRecord],
              key_of: Callable[[Configuration], str]) -> dict[str, Any]:
        """The noise floor: what the reduced type can reach at all (`noise_floor.py`)."""
        return measure_floor(ranking, self.assignment.dtype, self.check,
                             lambda off: judge_whole(off).to_json(), nothing_off_verdict(self.report), key_of)

    def not_among_candidates(self, found: SearchRecord) -> str:
        return NOT_THE_CAUSE

    def result(self, found: SearchRecord) -> PrecisionResult:
        """Every probe and the answer, as the deployable model has it (`deployable.py`): its nodes kept in
        fp32 are the answer, its verdict the answer's; the search's own answer, on the graph precision was
        assigned on, is kept as `assigned`."""
        assignment, deployed = self.assignment, DeployedRecord.read(self.result_step.deployed_json)
        keep = deployed.keep
        return PrecisionResult(
            candidates=deployed.candidates, ranking=found.ranking, ranking_use=RANKING_USE, probes=found.probes,
            culprits=keep, groups=found.groups, minimal=deployed.minimal, search=answer_status(found, self.unit),
            final_verdict=deployed.verdict,
            kept=tuple(name for name in deployed.candidates if name not in keep),
            status="fixed" if keep else "nothing to fix", mode=assignment.mode, dtype=assignment.dtype,
            graph=assignment.graph, floor=found.floor, kept_fp32=f"{len(keep)} of {len(deployed.candidates)} nodes",
            keep_dtype=keep, reduced_verdict=ResultVerdict.of(nothing_off_verdict(self.report)),
            mixlist_black=deployed.mixlist_black,
            assigned=AssignedAnswer(len(found.candidates), found.culprits, found.status),
            deployed=DeployedAnswer(deployed.carried, deployed.carried_verdict, deployed.how,
                                    deployed.probes, deployed.stopped_by),
            model=deployed.model)

    def write_answer(self, result: PrecisionResult) -> None:
        write_keep_dtype(self.result_step.keep_dtype, result.keep_dtype)
        write_modify_mixlist(self.result_step.modify_mixlist, result.mixlist_black)

    def summary(self, result: PrecisionResult) -> str:
        return render_summary(result)

    def answer(self, result: PrecisionResult) -> Answer:
        step = self.result_step
        config = step.context.get("config") or {}
        kept_fp32 = [*config.get("precision", {}).get("keep_dtype", []), *result.keep_dtype]
        fixed = bool(result.culprits)
        applied = {"precision": {"keep_dtype": kept_fp32}}
        return Answer(((step.keep_dtype.name, step.keep_dtype.read_text()),
                       (step.modify_mixlist.name, step.modify_mixlist.read_text())),
                      apply_command("precision", step.context, applied) if fixed else None,
                      "Apply it: keep these nodes in fp32 (precision.keep_dtype, with any you kept already) and "
                      "compare again; the precision comparison then passes. modify_mixlist.json moves op types to "
                      "the black list instead, where every reduced node of a type must stay fp32."
                      if fixed else "Nothing to keep in fp32: the reduced model passes as assigned.")

    def culprits_graph(self, result: PrecisionResult) -> str:
        """Around the culprit nodes, each marked fp32 or reduced."""
        return graph_section(self.report, result.culprits, "The graph around the culprits", self.assignment,
                             self.rows_page())


@dataclass(frozen=True)
class PrecisionProbe:
    """A precision probe: the compiled model with the reduced nodes, less the configuration's (kept in
    fp32), in the low type as the backend runs them. The graph is held without its weights, which ORT reads
    from the compiled copy's data file: a probe copies no weight, whatever the model's size."""

    model: onnx.ModelProto  # the compiled graph precision was assigned on, read without its weights
    reduced: frozenset[str]  # the candidates: nodes the assignment runs in `dtype`
    dtype: str
    dtypes: Mapping[str, str]
    judge: SampleJudge
    runtime: Backend
    weights: Path  # the folder of the compiled graph's data file

    @classmethod
    def of(cls, compiled_model: Path, assignment: Assignment, judge: SampleJudge, runtime: Backend) -> PrecisionProbe:
        """The probe of the compiled graph saved at `compiled_model` under `assignment`."""
        return cls(load_compiled(compiled_model, load_weights=False), frozenset(assignment.reduced), assignment.dtype,
                   assignment.dtypes, judge, runtime, compiled_model.parent)

    def __call__(self, off: Configuration, threads: int, stop_early: bool = True) -> dict[str, Any]:
        lowered = self.runtime.reduced_model(self.model, set(self.reduced - off), self.dtype, self.dtypes,
                                             self.weights)
        runner = ort_compile.Runner(lowered.SerializeToString(), ort_compile.unoptimized(self.weights), self.runtime,
                                    threads).activate()
        return self.judge.judge(runner, stop_early)


def rank_nodes(reduced: Sequence[str], report: CompareReport) -> list[dict[str, Any]]:
    """Most suspect first: the largest error made locally (on exact inputs), then the largest fraction of
    values beyond the low type's range in the reduced run, then topological order."""
    rows = rows_by(report, "node", reduced)
    evidence = [{"name": name, "local_error": worst_local_error(rows[name]),
                 "overflow": max((row.worst.get("overflow_cand", 0.0) for row in rows[name]), default=0.0)}
                for name in reduced]
    return sorted(evidence, key=lambda e: (-(e["local_error"] or 0.0), -e["overflow"]))  # stable: topological


def render_summary(result: PrecisionResult) -> str:
    where = f"precision assigned on the {result.graph} graph"
    culprits = result.culprits
    if not culprits:
        lines = [f"nothing to fix: the model passes the accuracy check in {result.mode} ({result.dtype}), "
                 f"{where}; keep_dtype.txt is empty"]
    else:
        searched = result.deployed.how == SEARCHED  # what failed is the carried answer in your model
        before = (result.deployed.carried_verdict if searched else result.reduced_verdict).worst
        after = result.final_verdict.worst
        change = (f"max rel err {before['max_rel']:.2g} → {after.get('max_rel', math.nan):.2g}" if "max_rel" in before
                  else f"max rel err {after.get('max_rel', math.nan):.2g}")  # failed by range: nothing run
        lines = [f"keep {result.kept_fp32} in fp32 ({listed(culprits)}; {change}); "
                 f"{len(result.kept)} nodes stay in {result.dtype} ({where}). "
                 f"keep_dtype.txt lists them: {len(result.keep_dtype)} node name(s)."]
    lines.append(deployed_line(result))
    if result.mixlist_black:
        lines.append(f"every reduced {', '.join(result.mixlist_black)} node must stay fp32: moving the op type to "
                     "the black list (modify_mixlist.json) is the simpler answer")
    if result.floor and result.floor["warning"]:
        lines.append(f"warning: {result.floor['warning']}")
    lines += [f"the search on the {result.graph} graph: {result.search}", model_line(result.model)]
    return "\n".join(lines) + "\n"


def deployed_line(result: PrecisionResult) -> str:
    """How the search's answer became the deployable one (`deployable.py`)."""
    deployed, assigned = result.deployed, result.assigned
    carried, probes = len(deployed.carried), len(deployed.probes)
    search = (f"the search's answer ({len(assigned.culprits)} of {assigned.candidates} nodes of the "
              f"{result.graph} graph) keeps {carried} node(s) of your model in fp32")
    stopped = (f"; {deployed.stopped_by} stopped the pass: not proven minimal, raise it and rerun to go on from "
               "the verdicts on disk") if not result.minimal else ""
    if deployed.how == SEARCHED:
        verdict = deployed.carried_verdict
        worst, reasons = verdict.worst, verdict.reasons or ()
        why = worst_text(worst) or (reasons[0] if reasons else "no sample passes")
        return (f"{search}, and your model converted so FAILS the check ({why}): searched again over your "
                f"model's nodes, {probes} probe(s){stopped}")
    if deployed.how == MINIMIZED:
        return (f"{search}; {carried - len(result.culprits)} of them are not needed there (dropped, {probes} "
                f"probe(s) in your model){stopped}")
    if result.minimal or assigned.status == UNFINISHED:  # the search's budget ran out: nothing given back
        proven = "each needed" if result.minimal else "not checked one by one"
        return f"{search}: passes in your model, {proven} ({probes} probe(s) in your model)"
    return f"{search}: passes in your model, none of them dropped ({probes} probe(s) in your model){stopped}"


def worst_text(worst: Mapping[str, float]) -> str:
    """A verdict's worst cosine, mismatch and max_rel, those it has, on one line ("" for none)."""
    return ", ".join(f"{metric} {worst[metric]:.3g}" for metric in ("cosine", "mismatch", "max_rel") if metric in worst)


def model_line(record: FinalizeRecord) -> str:
    """The summary's line on model.onnx (finalize.json)."""
    verdict = f", {'passes' if record.passed else 'FAILS'} the check" if record.passed is not None else ""
    return (f"model.onnx: your model with {record.reduced_original_nodes} of {record.original_nodes} nodes "
            f"in {record.dtype}, {record.checked}{verdict}")
