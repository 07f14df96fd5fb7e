"""`fusion_instances` (part of `snakemake fusion_bisect`): which instances of each culprit rule break accuracy.

fusion_bisect names the rules to switch off; a rule fires at many places, and often only some of them matter
(an approximate Gelu is harmless where its input is small). This job searches the *instances* — the fused
nodes of the culprit rules in the fusion-on graph (`core/hybrid.py`) — with the same pure strategy as the
rules, run by the same driver (`InstanceSearch`, a `protocol.Search` run by `driver.drive`): a probe reverts
a configuration's instances to the original nodes they absorbed in the saved fusion-on graph, runs that
hybrid with graph optimization off (so nothing is fused again; the saved graph run that way gives the
fusion-on outputs) and judges it on the samples. Candidates are ranked by the largest local error of their
nodes; each verdict is kept under `workspace/instance_probe/`. The answer: instances.json, `hybrid.onnx`
(every other fusion kept, the model written judged again on every sample; its weights in its own
`hybrid.onnx.data` beside it) and one line per culprit rule, "rule R: k of n instances break accuracy". When
no hybrid passes (reverting every revertable instance still fails, the budget ran out first, or the chosen
hybrid fails when run again), the job still succeeds: hybrid.onnx is then the rule-level answer, the
fusion-on variant compiled with the culprit rules off as fusion_bisect's probes compile it, verified the
same way, and instances.json and instances.txt say why.

Weights are held once, by ORT: the graphs are read without them (`formats.graph_only`), each probe's hybrid is
kilobytes of graph whose references ORT reads from one folder: a hard link to the compiled copy's data file,
and one copy of the user's weights the compiled graph lacks (`formats.linked_weights`), so no probe copies the
model, on disk or in memory.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from accubisect.bisection.driver import drive, failed_samples
from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.protocol import ComparedSearch
from accubisect.bisection.search import Pace, Prober, answer_status, listed
from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import PreconditionError
from accubisect.core.graph_map import nested_nodes
from accubisect.core.hybrid import Instance, Surgeon, instances_of, nested_instances
from accubisect.core.metrics import local_error
from accubisect.core.strategy import FOUND, NOT_AMONG_CANDIDATES, Configuration
from accubisect.formats.compare_report import CompareReport
from accubisect.formats.compile_record import CompileRecord
from accubisect.formats.files import atomic_model, write_atomic
from accubisect.formats.graph_only import graph_only
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.instances import InstanceEntry, InstancesRecord
from accubisect.formats.linked_weights import WeightsFolder, relocate, save_gathered
from accubisect.formats.local_errors import LocalErrors
from accubisect.formats.model import stored_tensors
from accubisect.formats.search_record import UNFINISHED, SearchRecord
from accubisect.formats.step import Step
from accubisect.formats.verdict import VerdictStore
from accubisect.reports.run_context import with_context
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend, backend_named
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.stages.dump import check_same_cpu

NAME = "fusion_instances"
FUSION_CAUSE = ("fusion", "with fusion off", "check the golden outputs and the accuracy check")  # and fusion_bisect's


@dataclass(frozen=True)
class InstancesStep(Step):
    """The rule `fusion_instances`'s files and params."""

    model: Path
    compiled_model: Path  # the fusion-on graph, as ORT saved it
    compile_record: Path
    graph_json: Path  # fusion-on's graph record: each compiled node's original nodes and rules
    local_errors: Path  # the fusion comparison's local.json
    compare_report: Path
    search_json: Path  # fusion_bisect's search record: the culprit rules
    sample_inputs: tuple[Path, ...]
    references: tuple[Path, ...]
    instances_json: Path
    hybrid: Path
    hybrid_data: Path  # hybrid.onnx's own data file, beside it
    instances_txt: Path
    verdicts: Mapping[str, Any]  # the instance verdict store (`VerdictStore.to_json`)
    bisect: Mapping[str, Any]
    output_names: tuple[str, ...]
    accuracy: Mapping[str, Any]
    backend: str
    context: Mapping[str, Any]
    threads: int = 1


@dataclass(frozen=True)
class InstanceProbe:
    """A probe: the fusion-on graph with a configuration's instances reverted, run unoptimized (optimizing
    would fuse it again) and judged. The surgeon's graphs hold no weights: ORT reads them from `weights`, the
    folder their references are relative to (`linked_weights.WeightsFolder`)."""

    surgeon: Surgeon
    instances: Mapping[str, Instance]  # the candidates, by name
    judge: SampleJudge
    runtime: Backend
    weights: Path

    def __call__(self, off: Configuration, threads: int, stop_early: bool = True) -> dict[str, Any]:
        return self.judged(self.hybrid(off), threads, stop_early)

    def hybrid(self, off: Configuration) -> onnx.ModelProto:
        return self.surgeon.hybrid([self.instances[name] for name in sorted(off)])

    def judged(self, hybrid: onnx.ModelProto, threads: int, stop_early: bool = True) -> dict[str, Any]:
        options = ort_compile.shared_weights(ort_compile.unoptimized(self.weights))
        runner = ort_compile.Runner(hybrid.SerializeToString(), options, self.runtime, threads).activate()
        return self.judge.judge(runner, stop_early)


@dataclass(frozen=True)
class InstanceSearch(ComparedSearch):
    """The instance search as the driver runs it: the candidates are the revertable instances of the culprit
    rules, ranked by local error, probed by `probe`; it starts from the fusion comparison, whose reference
    failing is worded as fusion_bisect words it."""

    name, unit = NAME, "instance"
    cause, reference_words, advice = FUSION_CAUSE
    report: CompareReport
    check: AccuracyCheck
    instances: tuple[Instance, ...]
    reasons: Mapping[str, str | None]  # why an instance cannot be reverted alone
    errors: Mapping[str, float | None]  # per instance (`instance_errors`)
    probe: Prober  # an `InstanceProbe`

    def candidates(self) -> list[str]:
        return [instance.name for instance in self.instances if self.reasons[instance.name] is None]

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        chosen = set(candidates)
        return rank_instances([i for i in self.instances if i.name in chosen], self.errors)

    def prober(self) -> Prober:
        return self.probe


def fusion_instances(step: InstancesStep) -> None:
    """Searches the instances of fusion_bisect's culprit rules; writes instances.json, the verified hybrid
    model with its own data file, and the summary lines. Every graph is read without its weights: ORT reads
    them through one folder (`linked_weights`)."""
    check_same_cpu(step.compile_record)
    rules = SearchRecord.read(step.search_json)
    with tempfile.TemporaryDirectory(prefix=".weights.", suffix=".part", dir=step.hybrid.parent) as folder:
        weights = WeightsFolder(Path(folder))
        compiled = graph_only(step.compiled_model)
        weights.add(compiled, step.compiled_model, "compiled")
        if not rules.culprits and rules.status != FOUND:  # fusion-on fails, and the rule search has no answer to
            record, answer = unanswered(rules), compiled  # refine: fusion_result says why
        else:
            record, answer = searched(step, rules.culprits, compiled, weights)
        with atomic_model(step.hybrid) as saved:
            save_gathered(answer, saved, weights.folder, step.hybrid_data.name)
    record.write(step.instances_json)
    write_atomic(step.instances_txt, with_context(step.context, summary(record)))


def searched(step: InstancesStep, culprits: Sequence[str], compiled: onnx.ModelProto,
             weights: WeightsFolder) -> tuple[InstancesRecord, onnx.ModelProto]:
    """The instance search's record and answer: the hybrid that passes, or the rule-level answer (no culprit
    rules: fusion-on passes, and no instance is searched)."""
    graph = GraphRecord.read(step.graph_json)
    original = graph_only(step.model)
    weights.copy_in(lacking(compiled, original), step.model, "original.data")
    surgeon = Surgeon(compiled, original, {original for node in graph.nodes for original in node.original_nodes})
    instances = instances_of(graph.nodes, culprits, surgeon.original_tensors)
    reasons = {instance.name: surgeon.why_not(instance) for instance in instances}
    inner_tensors = {out for nested in nested_nodes(surgeon.original.graph) for out in nested.node.outputs}
    nested = nested_instances(graph.nested, culprits, surgeon.original_tensors | inner_tensors)
    instances += [instance for instance, _ in nested]
    reasons.update({instance.name: reason for instance, reason in nested})
    errors = instance_errors(instances, LocalErrors.read(step.local_errors))
    judge = SampleJudge.load(step.sample_inputs, step.references, step.output_names, step.accuracy)
    probe = InstanceProbe(surgeon, {instance.name: instance for instance in instances}, judge,
                          backend_named(step.backend), weights.folder)
    searching = InstanceSearch(CompareReport.read(step.compare_report), AccuracyCheck.from_config(step.accuracy),
                               tuple(instances), reasons, errors, probe)
    found = drive(searching, VerdictStore.from_json(step.verdicts), Pace.from_config(step.bisect, step.threads))
    stuck = [name for name, reason in reasons.items() if reason]
    fallback, line = no_hybrid(found, len(found.ranking), len(stuck), len(nested))
    if fallback is None:
        answer, verified, fallback = verify(probe, found.culprits, step.threads)
    rules_off: list[str] = []
    if fallback is not None:  # the rule-level answer, verified as a hybrid is
        answer, rules_off = rule_level_answer(step.model, step.compile_record, step.backend, culprits, step.threads,
                                              weights)
        verified = judged_rule_level(probe, answer, culprits, fallback, step.threads)
    record = InstancesRecord(
        tuple(culprits),
        tuple(InstanceEntry(i.name, i.nodes, i.original_nodes, i.rules, errors[i.name], reasons[i.name],
                            None if reasons[i.name] or fallback else i.name in found.culprits) for i in instances),
        {"status": found.status, "culprits": list(found.culprits), "minimal": found.minimal,
         "stopped_by": found.stopped_by, "search": line, "ranking": list(found.ranking),
         "probes": list(found.probes)},
        {"reverted": [] if fallback else list(found.culprits), "passed": verified["passed"],
         "samples_passed": [s["passed"] for s in verified["samples"]], "worst": verified["worst"],
         "fallback": fallback, "rules_off": rules_off})
    return record, answer


def lacking(compiled: onnx.ModelProto, original: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The original model's tensors the compiled graph has none of the name of: all a hybrid can copy in
    (`Surgeon` copies an original initializer only where the compiled graph lacks it; a copied Constant's
    value comes with it)."""
    kept = {tensor.name for tensor in compiled.graph.initializer}
    return [tensor for tensor in stored_tensors(original.graph) if tensor.name not in kept]


def unanswered(rules: SearchRecord) -> InstancesRecord:
    """No culprit rules while fusion-on fails (the rule search found none, or its budget ran out first): no
    instance is searched (the search field keeps the rule search's status); hybrid.onnx is the fusion-on graph
    as saved, and fails."""
    return InstancesRecord((), (), {"status": rules.status, "culprits": [], "minimal": False,
                                    "stopped_by": rules.stopped_by, "search": answer_status(rules, "rule"),
                                    "ranking": [], "probes": []},
                           {"reverted": [], "passed": False, "samples_passed": [], "worst": {}, "fallback": None,
                            "rules_off": []})


def no_hybrid(found: SearchRecord, revertable: int, stuck: int, nested: int = 0) -> tuple[str | None, str]:
    """Why the search found no hybrid that passes (None when it found one), and its line on how far it got;
    `nested` of the `stuck` instances are inside subgraphs."""
    if found.status == UNFINISHED and not found.culprits:
        line = (f"{found.stopped_by} ran out after {len(found.probes)} probe(s), before any hybrid passed; raise it "
                "and rerun to go on from the verdicts on disk")
        return line, line
    line = answer_status(found, "instance")
    if found.status == NOT_AMONG_CANDIDATES:
        inside = f", {nested} of them inside subgraphs (If, Loop, Scan), where reverting is not supported yet"
        return (f"reverting all {revertable} revertable instance(s) still fails; {stuck} cannot be reverted "
                f"alone{inside if nested else ''}"), line
    return None, line


def rule_level_answer(model: Path, compile_record: Path, backend: str, culprits: Sequence[str], threads: int,
                      weights: WeightsFolder) -> tuple[onnx.ModelProto, list[str]]:
    """The fusion-on variant (`compile_record`'s) compiled with the culprit rules switched off too, as
    fusion_bisect's probes compile it, saved as ORT's optimized graph with its own data file into `weights`
    and read without its weights; and every rule it has off."""
    base = CompileRecord.read(compile_record).variant
    options = compile_options(base, installed_catalogue(), frozenset(culprits))
    saved = Path(tempfile.mkdtemp(prefix="rule_level.", dir=weights.folder)) / "model.onnx"
    ort_compile.compile_model(model, options, backend_named(backend), saved, threads, own_weights=True)
    answer = graph_only(saved)
    relocate(answer, saved.parent.name)
    return answer, sorted(base.rules_off | set(culprits))


def verify(probe: InstanceProbe, reverted: Sequence[str],
           threads: int) -> tuple[onnx.ModelProto, dict[str, Any], str | None]:
    """The answer's hybrid, the very model written, judged again on every sample (a probe may stop at the first
    sample that decides, and a verdict on disk is not this model); and why it cannot be the answer (None: it
    passes)."""
    answer = probe.hybrid(frozenset(reverted))
    verified = probe.judged(answer, threads, stop_early=False)
    if verified["passed"]:
        return answer, verified, None
    return answer, verified, (f"the hybrid reverting {len(reverted)} instance(s) ({listed(reverted)}) fails on "
                              f"{failed_samples(verified)} sample(s) when run again on every sample, though its "
                              "probe passed")


def judged_rule_level(probe: InstanceProbe, answer: onnx.ModelProto, culprits: Sequence[str], fallback: str,
                      threads: int) -> dict[str, Any]:
    """The rule-level answer run unoptimized and judged on every sample, as a hybrid is; refused if it fails."""
    verified = probe.judged(answer, threads, stop_early=False)
    if not verified["passed"]:
        raise PreconditionError(f"the rule-level answer does not hold: the fusion-on graph compiled with "
                                f"{', '.join(culprits)} off fails on {failed_samples(verified)} sample(s) run with "
                                f"graph optimization off, and no hybrid of reverted instances passes ({fallback})")
    return verified


def instance_errors(instances: Sequence[Instance], local: LocalErrors) -> dict[str, float | None]:
    """Per instance, the largest local error of its nodes (a fused node run alone on fusion-off's tensors);
    None where none of them was measured."""
    return {instance.name: max((local_error(local.nodes[node]) for node in instance.nodes if node in local.nodes),
                               default=None)
            for instance in instances}


def rank_instances(instances: Sequence[Instance], errors: Mapping[str, float | None]) -> list[dict[str, Any]]:
    """Most suspect first: the largest local error; ties (and unmeasured instances, last) keep graph order."""
    ranked = sorted(instances, key=lambda i: -(errors[i.name] if errors[i.name] is not None else -math.inf))
    return [{"name": instance.name, "local_error": errors[instance.name], "rules": list(instance.rules)}
            for instance in ranked]


def summary(record: InstancesRecord) -> str:
    lines = record.summary_lines()
    if record.fallback:
        lines.append(f"no hybrid of reverted instances passes ({record.fallback}): hybrid.onnx is the rule-level "
                     f"answer: the fusion-on graph compiled with {', '.join(record.culprit_rules)} off (run it with "
                     "graph optimization off)")
    elif record.culprit_rules:
        lines.append(f"{record.search['search']}; hybrid.onnx reverts {len(record.hybrid['reverted'])} instance(s), "
                     "keeps every other fusion and passes on every sample (run it with graph optimization off)")
    return "\n".join(lines) + "\n"
