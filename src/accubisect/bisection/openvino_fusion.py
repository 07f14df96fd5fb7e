"""`snakemake fusion_bisect` on `backend: openvino-cpu`: which of OpenVINO's fusions break accuracy, with the
switches the plugin has (`runtime/openvino_fusion.py`).

Reference: fusion off as far as OpenVINO allows (every switch off, f32 hint); candidate: the plugin's own
compile (f32 hint: fusion is the question, the reduced type is precision_bisect's). Every probe is judged
against the reference's outputs on every sample. Rule level: the switches are searched by the pure group
testing of `core/strategy.py`; instance level: the fused executed nodes a barrier can break (the Subgraphs
when snippets are the culprit, else every fused node) by the same search, a configuration being the set
of instances given a barrier; a barrier the plugin did not honour is recorded in its probe. The answer is
deployable: the properties to set and the barrier outputs to add, each compiled again and judged on every
sample. One process runs it all (a probe is a compile of under a second): each level is a `Search` run by
the one driver (`driver.drive`: the strategy's rounds and progress lines, its verdicts kept in the workspace as
the ORT searches keep theirs, one store per level, so a rerun probes nothing it judged before), and the
answer is judged again by the driver's `judged_again`. Neither level is a
`Bisection` (two jobs that start from a comparison): OpenVINO has no local errors to rank by, so the
switches keep the plugin's order and the fused nodes its execution order, the reference is the f32 compile
with every switch off rather than a compared variant's dump, and both levels run in one job.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from accubisect.bisection.driver import drive, judged_again
from accubisect.bisection.judging import SampleArrays, SampleJudge
from accubisect.bisection.protocol import Search
from accubisect.bisection.search import Pace, Prober, judged
from accubisect.core.accuracy import AccuracyCheck, Judged
from accubisect.core.errors import FinalizeError
from accubisect.core.strategy import FOUND, Configuration
from accubisect.formats.files import write_atomic
from accubisect.formats.openvino_fusion_result import OpenVinoDeploy, OpenVinoFusionResult
from accubisect.formats.samples import load_arrays
from accubisect.formats.search_record import SearchRecord
from accubisect.formats.step import Step
from accubisect.formats.val_func import load_val_func
from accubisect.formats.verdict import VerdictRecord, VerdictStore
from accubisect.reports.run_context import with_context
from accubisect.runtime.openvino_backend import CompiledRunner

NOTHING_TO_FIX, FIXED, NOT_SWITCHABLE = "nothing to fix", "fixed", "not switchable"
ANSWER_FAILS = "answer fails when compiled again"  # the job stops: nothing is published


class FusionProbes:
    """The candidate compiled with switches off and barriers (the verdict stores ask for each configuration
    once)."""

    def __init__(self, model: Path, threads: int, inputs: Sequence[Path], output_names: Sequence[str],
                 accuracy: Mapping[str, Any]) -> None:
        from accubisect.runtime.openvino_fusion import FusionCompiler

        self.compiler = FusionCompiler(model, threads)
        samples = self._references(inputs, output_names)
        check = AccuracyCheck.from_config(accuracy)
        self.judge = SampleJudge(samples, tuple(output_names), check, load_val_func(check))
        self.instances = self.compiler.instances(self.compiler.compile())  # of the plugin's own compile

    def _references(self, inputs: Sequence[Path], output_names: Sequence[str]) -> tuple[SampleArrays, ...]:
        """Each sample with its outputs compiled with every switch off; that compile is released on return, so
        the job holds one compiled copy of the weights at a time (a gigabyte each on a gigabyte model)."""
        from accubisect.runtime.openvino_fusion import SWITCHES

        reference = CompiledRunner(self.compiler.compile(SWITCHES))
        return tuple(SampleArrays(path.name, arrays, reference.infer(arrays, output_names))
                     for path in inputs for arrays in (load_arrays(path),))

    def switches(self, off: Configuration, threads: int = 1, stop_early: bool = True) -> Judged:
        """A rule-level probe (a `Prober`; the compiler has its threads): the switches `off` switched off."""
        return self.judge.judge(CompiledRunner(self.compiler.compile(off)), stop_early)

    def barriers(self, instances: Mapping[str, Any], given: Configuration, threads: int = 1,
                 stop_early: bool = True) -> Judged:
        """An instance-level probe: a barrier on each of the `given` fused nodes, with those the plugin still
        fused whole (their barrier not honoured)."""
        from accubisect.runtime.openvino_fusion import unbroken

        chosen = [instances[name] for name in sorted(given)]
        compiled = self.compiler.compile(barriers=[i.barrier for i in chosen])
        return {**self.judge.judge(CompiledRunner(compiled), stop_early),
                "not_applied": unbroken(self.compiler.graph(compiled), chosen)}


class SwitchSearch(Search):
    """Rule level: the plugin's switches (`runtime/openvino_fusion.SWITCHES`), in its order; nothing off is the
    plugin's own compile, probed first."""

    name, unit = "fusion_bisect", "switch"

    def __init__(self, probes: FusionProbes, store: VerdictStore) -> None:
        self.probes, self.store = probes, store

    def candidates(self) -> list[str]:
        from accubisect.runtime.openvino_fusion import SWITCHES

        return list(SWITCHES)

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        return [{"name": name} for name in candidates]

    def nothing_off_passes(self) -> bool:
        return judged(self.probes.switches, self.store, 1, frozenset()).passed

    def prober(self) -> Prober:
        return self.probes.switches


class BarrierSearch(Search):
    """Instance level: the `suspects` (fused nodes a barrier can break, in execution order), searched when the
    plugin's own compile fails."""

    name, unit = "fusion_instances", "instance"

    def __init__(self, probes: FusionProbes, suspects: Mapping[str, Any]) -> None:
        self.probes, self.suspects = probes, suspects

    def candidates(self) -> list[str]:
        return list(self.suspects)

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        return [{"name": name} for name in candidates]

    def nothing_off_passes(self) -> bool:
        return False  # the rule level's first probe

    def prober(self) -> Prober:
        return functools.partial(self.probes.barriers, self.suspects)


def searched(search: Search, store: VerdictStore) -> SearchRecord:
    """One level run by the driver: one probe at a time (a compile takes the job's threads), verdicts kept in
    `store`, no budget (a probe is a compile of under a second)."""
    return drive(search, store, Pace(1, 1))


def listed(level: str, store: VerdictStore, configs: Sequence[Configuration]) -> list[dict[str, Any]]:
    """The level's probes as result.json lists them, read from its store: a rule probe's switches off, an
    instance probe's barriers and the instances the plugin still fused whole."""
    verdicts: list[VerdictRecord] = [v for off in dict.fromkeys(configs) if (v := store.read(off)) is not None]
    return [{"level": level, **({"off": list(v.off)} if level == "rule" else {"barriers": list(v.off)}),
             "passed": v.passed, "worst": dict(v.worst), "seconds": v.seconds,
             **({"not_broken": list(v.not_applied)} if level == "instance" else {})} for v in verdicts]


def holds(search: Search, answer: Sequence[str]) -> bool | None:
    """Whether a level's answer passes compiled again and judged on every sample; None: it has none."""
    return judged_again(search.prober(), frozenset(answer), 1)["passed"] if answer else None


def bisect_fusion(probes: FusionProbes, rule_store: VerdictStore, instance_store: VerdictStore) -> OpenVinoFusionResult:
    """Rule level, then instance level, each level's verdicts read from its store when it holds them, then the
    deployable answer judged again (module docstring); `seconds` is the job's to fill."""
    from accubisect.runtime.openvino_fusion import SNIPPET_TYPE, properties_of

    switches = SwitchSearch(probes, rule_store)
    rules = searched(switches, rule_store)
    probed = listed("rule", rule_store, [frozenset(), *(frozenset(p["off"]) for p in rules.probes)])
    if rules.status == FOUND and not rules.culprits:
        return OpenVinoFusionResult(NOTHING_TO_FIX, (), {}, None, None, None, tuple(probed), 0.0)
    switches_off = list(rules.culprits) if rules.status == FOUND else []
    every = probes.instances
    suspects = {i.name: i for i in every if not switches_off or i.layer_type == SNIPPET_TYPE}
    barrier_search = BarrierSearch(probes, suspects)
    instances = searched(barrier_search, instance_store)
    probed += listed("instance", instance_store, [frozenset(p["off"]) for p in instances.probes])
    barriers = ({name: suspects[name].barrier for name in instances.culprits} if instances.status == FOUND else {})
    deploy = OpenVinoDeploy(properties_of(switches_off), tuple(sorted(barriers.values())))
    verified = {"switches": holds(switches, switches_off), "barriers": holds(barrier_search, list(barriers))}
    status = NOT_SWITCHABLE if not (switches_off or barriers) else (
        FIXED if False not in verified.values() else ANSWER_FAILS)
    return OpenVinoFusionResult(status, tuple(switches_off), barriers,
                                tuple({"name": i.name, "type": i.layer_type, "layers": list(i.layers),
                                       "barrier": i.barrier} for i in every),
                                deploy, verified, tuple(probed), 0.0)


@dataclass(frozen=True)
class OpenVinoFusionStep(Step):
    """The job's files and params (rule `openvino_fusion_bisect`)."""

    model: Path
    sample_inputs: tuple[Path, ...]
    output_names: tuple[str, ...]
    accuracy: Mapping[str, Any]
    threads: int
    result_json: Path
    deploy_json: Path
    summary: Path
    verdicts: Mapping[str, Any]  # the rule level's verdict store (`VerdictStore.to_json`)
    instance_verdicts: Mapping[str, Any]  # the instance level's
    context: Mapping[str, Any]  # the summary's first line (`run_context.LINE_FIELDS`)


def bisect_openvino_fusion(step: OpenVinoFusionStep) -> None:
    """The job: the search and its answer, written as result.json, deploy.json and summary.txt."""
    start = time.perf_counter()
    probes = FusionProbes(step.model, step.threads, step.sample_inputs, step.output_names, step.accuracy)
    stores = (VerdictStore.from_json(step.verdicts), VerdictStore.from_json(step.instance_verdicts))
    result = replace(bisect_fusion(probes, *stores), seconds=round(time.perf_counter() - start, 1))
    if result.status == ANSWER_FAILS:
        raise FinalizeError(f"{step.model}: the answer ({', '.join(result.switches_off)} off, barriers on "
                            f"{len(result.barriers)} fused node(s)) passed as probes but fails the check when "
                            "compiled again on every sample; nothing is published: rerun with a looser "
                            "accuracy check, or report it")
    (result.deploy or OpenVinoDeploy({}, ())).write(step.deploy_json)
    result.write(step.result_json)
    write_atomic(step.summary, with_context(step.context, summary(result)))


def summary(result: OpenVinoFusionResult) -> str:
    """The answer in a few lines: what to switch, what to add, whether that passes when compiled again."""
    probes = f"{len(result.probes)} probes, {result.seconds:g} s"
    if result.status == NOTHING_TO_FIX:
        return f"nothing to fix: OpenVINO's own compile passes the check against fusion off (snippets off); {probes}\n"
    if result.status == NOT_SWITCHABLE:
        return (f"not switchable: the model fails the check with OpenVINO's fusions, and neither a switch "
                f"(snippets off) nor a barrier on any of its {len(result.instances or ())} fused nodes fixes it; "
                f"{probes}\n")
    deploy = result.deploy or OpenVinoDeploy({}, ())
    lines = [f"{result.status}: {probes}"]
    if result.switches_off:
        lines.append(f"rule level: switch off {', '.join(result.switches_off)} (compile with "
                     f"{dict(deploy.properties)}): passes compiled again")
    if result.barriers:
        lines.append(f"instance level: barriers on {len(result.barriers)} fused node(s) "
                     f"({', '.join(result.barriers)}; add outputs "
                     f"{', '.join(deploy.barrier_outputs)}): "
                     "passes compiled again on every sample")
    return "\n".join(lines) + "\n"
