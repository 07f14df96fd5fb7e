"""`snakemake fusion_bisect`: the fusion rules to switch off so the model passes, every other kept on.

The fusion kind of `Bisection` (`protocol.py`): the candidates are the rules that fired on the fusion-on
variant, ranked by the error of the nodes they made; a probe compiles the model with a configuration's
rules switched off too, runs the samples and judges the outputs; the answer is result.json,
fusion_switch.cfg, a report and a summary, both ending with which instances of the culprit rules break
accuracy (`fusion_instances`, run before). The jobs are the shared ones (`jobs.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from accubisect.bisection.instances import FUSION_CAUSE
from accubisect.bisection.instances import summary as instance_summary
from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.protocol import Bisection, nothing_off_verdict, rows_by, worst_local_error
from accubisect.bisection.search import answer_status, listed
from accubisect.core.errors import ConfigError
from accubisect.core.rules import RuleCatalogue
from accubisect.core.strategy import Configuration
from accubisect.formats.bisect_result import FusionResult, ResultVerdict
from accubisect.formats.compare_report import CompareReport
from accubisect.formats.compile_record import CompileRecord, Variant
from accubisect.formats.fusion_switch import write_fusion_switch
from accubisect.formats.graph_only import graph_only
from accubisect.formats.instances import InstancesRecord
from accubisect.formats.search_record import SearchRecord
from accubisect.reports.graph_view import graph_section
from accubisect.reports.report_html import Answer, instances_section
from accubisect.reports.run_context import apply_command
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend, backend_named
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.stages.compile_stage import Compiler, rewrites_weights

RANKING_USE = ("candidates were searched most suspect first (largest local error of their nodes, then earliest "
               "failing tensor, then largest mismatch, in the fusion-on vs fusion-off comparison); the first probe "
               "switched off only the top-ranked rule, {first}")


class FusionBisection(Bisection[FusionResult]):
    """Fusion rules switched off on top of the fusion-on variant (and the rules `compile.fusion_switch`
    already switches off)."""

    name, unit, action = "fusion_bisect", "rule", "switch off"
    cause, reference_words, advice = FUSION_CAUSE
    search_files = frozenset({"model", "compile_record", "compiled_model"})
    result_files = frozenset({"compile_record", "fusion_switch", "instances_json", "hybrid"})

    @cached_property
    def compile_record(self) -> CompileRecord:
        return CompileRecord.read(self.step.compile_record)

    def candidates(self) -> list[str]:
        return candidates_of(self.compile_record.fired_rules, self.search_step.bisect["rules"])

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        return rank_rules(candidates, self.report)

    def prober(self) -> FusionProbe:
        step = self.search_step
        return FusionProbe(step.model, self.compile_record.variant, self.sample_judge(), backend_named(step.backend),
                           installed_catalogue(), step.compiled_model)

    def not_among_candidates(self, found: SearchRecord) -> str:
        return ("even with every candidate rule off the model fails: the culprits are not among the candidates "
                f"{found.candidates}; widen or drop bisect.rules")

    def result(self, found: SearchRecord) -> FusionResult:
        fusion_on = nothing_off_verdict(self.report)
        return FusionResult(
            candidates=tuple(found.candidates), ranking=found.ranking,
            ranking_use=RANKING_USE.format(first=found.candidates[0] if found.candidates else "none"),
            probes=found.probes, culprits=found.culprits, groups=found.groups, minimal=found.minimal,
            search=answer_status(found, self.unit), final_verdict=ResultVerdict.of(found.final_verdict(fusion_on)),
            kept=tuple(found.kept), fusion_on_verdict=ResultVerdict.of(fusion_on),
            already_off=tuple(sorted(self.compile_record.variant.rules_off)))

    def write_answer(self, result: FusionResult) -> None:
        write_fusion_switch(self.result_step.fusion_switch, {*result.already_off, *result.culprits},
                            installed_catalogue())

    @cached_property
    def instances(self) -> InstancesRecord:
        return InstancesRecord.read(self.result_step.instances_json)

    def summary(self, result: FusionResult) -> str:
        """The rules' lines, then (when there are culprit rules) the instance lines: per rule which of its
        instances break accuracy, and hybrid.onnx's line."""
        instances = instance_summary(self.instances) if self.instances.culprit_rules else ""
        return render_summary(result) + instances

    def answer(self, result: FusionResult) -> Answer:
        step = self.result_step
        switch = {"compile": {"fusion_switch": str(self.published() / step.fusion_switch.name)}}
        fixed = bool(result.culprits)
        return Answer(((step.fusion_switch.name, step.fusion_switch.read_text()),),
                      apply_command("compare", step.context, switch) if fixed else None,
                      "Apply it: compare again with the switch file; the comparison then passes."
                      if fixed else "Nothing to switch off: fusion-on passes as compiled.")

    def culprits_graph(self, result: FusionResult) -> str:
        """Around the nodes the culprit rules made."""
        culprits = set(result.culprits)
        focus = list(dict.fromkeys(row.node for row in self.report.tensors if row.rule in culprits))
        return graph_section(self.report, focus, "The graph around the nodes the culprit rules made",
                             rows_page=self.rows_page())

    def sections(self, files: Sequence[str]) -> str:
        """Which instances of the culprit rules break accuracy, linking `files` (instances.json, hybrid.onnx);
        none without culprit rules."""
        record = self.instances
        if not record.culprit_rules:
            return ""
        lines = instance_summary(record).splitlines()
        return instances_section(record, lines[len(record.summary_lines()):], files)


@dataclass(frozen=True)
class FusionProbe:
    """A fusion probe: the fusion-on variant compiled with the configuration's rules switched off too."""

    model: Path
    base: Variant  # the fusion-on variant
    judge: SampleJudge
    runtime: Backend
    catalogue: RuleCatalogue
    fusion_on: Path  # the fusion-on variant's compiled graph: whether its rules keep the weights

    def __call__(self, off: Configuration, threads: int, stop_early: bool = True) -> dict[str, Any]:
        probed = Variant("probe", self.base.level, self.base.session_config, self.base.rules_off | off)
        options = ort_compile.with_weights(compile_options(probed, self.catalogue), self.model.parent)
        if self.shares_weights:
            options = ort_compile.shared_weights(options)
        runner = ort_compile.Runner(self.graph, options, self.runtime, threads).activate()
        return self.judge.judge(runner, stop_early)

    @cached_property
    def compiler(self) -> Compiler:
        return Compiler(self.model, self.base, self.catalogue, self.runtime)

    @cached_property
    def graph(self) -> bytes:
        """The model without its weights, its nodes named as ORT is handed them (`Compiler.graph`): every
        probe's session reads the weights from the model's files, where each session of the model's path held
        a copy of its own."""
        return self.compiler.graph_bytes

    @cached_property
    def shares_weights(self) -> bool:
        """Whether the probes, however many run side by side, read the weights from one mapping of the model's
        files (`ort_compile.shared_weights`): where the rules keep most weights as they are (the rule probes'
        decision, `rewrites_weights`), as in a transformer (1.07 GB: two probes 1.77-1.96 GB, 1.15 GB so).
        Where they rewrite most (ConvBNFusion, the NCHWc reorder of a CNN), ORT holds the weights it makes on
        top of the mapping, which then only adds: each session reads the files itself (the 170 MB CNN with its
        data file, two probes side by side: the search job 952-976 MiB shared, 715-797 MiB so)."""
        return not rewrites_weights(self.compiler.graph, graph_only(self.fusion_on))


def candidates_of(fired: Sequence[str], chosen: Sequence[str] | None) -> list[str]:
    """The rules a bisection searches: those that fired, narrowed to `bisect.rules` when set."""
    if chosen is None:
        return list(fired)
    idle = [rule for rule in chosen if rule not in fired]
    if idle:
        raise ConfigError(f"bisect.rules: {idle} did not fire on this model; rules that fired: {list(fired)}")
    return [rule for rule in fired if rule in chosen]


def rank_rules(candidates: Sequence[str], report: CompareReport) -> list[dict[str, Any]]:
    """Most suspect first: the rule whose nodes make the largest error themselves (local error: a fused node
    run alone on fusion-off's own tensors), then the rule whose nodes fail earliest in topological order
    (error first appears there; later tensors inherit it), then the largest mismatch among its nodes.
    Rules with no compared tensor keep the order they fired in, last."""
    rows = rows_by(report, "rule", candidates)
    evidence = [{"name": rule, "local_error": worst_local_error(rows[rule]),
                 "first_failing_index": next((row.index for row in rows[rule] if not row.passed), None),
                 "worst_mismatch": max((row.worst["mismatch"] for row in rows[rule] if "mismatch" in row.worst),
                                       default=None)}
                for rule in candidates]
    return sorted(evidence, key=lambda e: (  # stable: ties keep the order the rules fired in
        -(e["local_error"] or 0.0),
        e["first_failing_index"] if e["first_failing_index"] is not None else math.inf,
        -(e["worst_mismatch"] if e["worst_mismatch"] is not None else -1.0)))


def render_summary(result: FusionResult) -> str:
    culprits, candidates = result.culprits, result.candidates
    if not culprits:
        return "nothing to bisect: the model passes the accuracy check with every fusion on\n"
    before, after = result.fusion_on_verdict.worst, result.final_verdict.worst
    change = f"max rel err {before.get('max_rel', math.nan):.2g} → {after.get('max_rel', math.nan):.2g} when off"
    if result.minimal:
        verb = "breaks" if len(culprits) == 1 else "break"
        found = f"{len(culprits)} of {len(candidates)} fired rules {verb} accuracy"
    else:
        found = f"switching off {len(culprits)} of {len(candidates)} fired rules passes"
    lines = [f"{found}: {listed(culprits)} ({change}). {len(result.kept)} fusions kept."]
    lines += [f"rules {' + '.join(group)} fail only together; switching off {group[0]} is enough"
              for group in result.groups]
    lines.append(f"{result.search}; the switch file is fusion_switch.cfg")
    return "\n".join(lines) + "\n"
