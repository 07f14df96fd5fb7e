"""The deployable precision answer: the user's original model converted to mixed precision, and the answer
settled in its terms (job `precision_deploy`, between the search and the result job).

The search decides per node of the graph precision was assigned on (ORT's compiled graph, or the original
graph). A compiled graph is no deployment format: at level `all` it holds layout ops for this CPU
(NCHWc `ReorderInput`, `*_nchwc` Conv) and ORT-internal ops in the default domain. So the answer is carried
back to the original nodes each compiled node absorbed, and the original model is finalized: portable,
loadable by ORT at any level, checked by `onnx.checker`, and judged by the same accuracy check.

What passes on the compiled graph need not pass, nor be minimal, in the user's graph: a fusion can hide a
node that fails in the low type (ConvBNFusion folds a BatchNorm whose variance overflows fp16 into its Conv's
weights), or make two original nodes one compiled node. So the deployable model's verdict is the answer's:
this job judges the carried answer as model.onnx, converted and run, and as keep_dtype.txt handed to a
compiler that fuses first (`BothRoutes`), after checking that every activation model.onnx stores in the low
type fits the type's range on every sample by its fp32 value (`LowRange`: ORT's CPU kernels compute fp16 in
fp32 behind Casts and never store such a tensor, so neither run shows the inf a device that stores it makes).
When all three pass, it drops each kept node they do not need (1-minimal there); when one fails, it searches
again over the user's nodes with the same strategy. Probes keep their verdicts on disk as the search's do.
The result job then writes result.json, keep_dtype.txt, the page and the summary from this record
(`formats/deployed.py`), so they always describe the published model.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import numpy_helper

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.precision_bisect import NOT_THE_CAUSE, PrecisionProbe, worst_text
from accubisect.bisection.search import (
    UNFINISHED,
    Budget,
    SearchRecord,
    VerdictRecord,
    VerdictStore,
    answer_status,
    judged,
    probe_entry,
    search,
)
from accubisect.core.errors import FinalizeError, ModelError, PreconditionError
from accubisect.core.metrics import LOW_PRECISION
from accubisect.core.onnx_graph import name_nodes_uniquely, nodes_with_protos, subgraph_reads
from accubisect.core.precision import resolve_keep_dtype
from accubisect.core.strategy import NOT_AMONG_CANDIDATES, Config
from accubisect.formats.assignment import Assignment
from accubisect.formats.deployed import MINIMIZED, SEARCHED, VERIFIED, DeployedRecord
from accubisect.formats.files import atomic_model, write_json
from accubisect.formats.graph_record import GraphNode, GraphRecord
from accubisect.formats.model import load_model, save_whole
from accubisect.formats.step import Step
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend, backend_named
from accubisect.runtime.catalogue import installed_catalogue
from accubisect.runtime.finalize import finalize, low_tensors, lowered_nodes
from accubisect.stages.compile_stage import Variant
from accubisect.stages.precision_stage import tensor_dtypes
from accubisect.stages.tensor_ranges import largest_finite, reference_ranges

log = logging.getLogger("accubisect")
_NODE_IN_MESSAGE = re.compile(r"node name: ([^)\s,]+)|in node \(([^)]+)\)|Node \(([^)]+)\)")
LOW_MAX = {dtype: largest for dtype, (largest, _) in LOW_PRECISION.items()}


def original_low_nodes(graph: GraphRecord, reduced: set[str]) -> set[str]:
    """Original nodes whose computation runs reduced: absorbed by a reduced compiled node and by no
    compiled node that stays fp32 (fp32 wins where a layout or glue node shares an original node)."""
    low: set[str] = set()
    fp32: set[str] = set()
    for node in graph.nodes:
        (low if node.name in reduced else fp32).update(node.original_nodes)
    return low - fp32


@dataclass(frozen=True)
class DeployStep(Step):
    """The deploy job's files and params (rule `precision_deploy`)."""

    model: Path  # the user's model
    compiled_model: Path  # the graph precision was assigned on, as the search probed it
    search_json: Path  # the search on the graph precision was assigned on
    assignment: Path
    graph_json: Path  # the graph precision was assigned on
    sample_inputs: tuple[Path, ...]
    references: tuple[Path, ...]
    output_names: tuple[str, ...]
    accuracy: Mapping[str, Any]
    backend: str
    variant: Mapping[str, Any]  # the variant precision was assigned on: how the model is verified
    verdicts: Mapping[str, Any]  # this pass's verdict store (`VerdictStore.to_json`)
    search_verdicts: Mapping[str, Any]  # the search's: a configuration of compiled nodes it already judged
    bisect: Mapping[str, Any]  # config `bisect`: parallel and budgets
    threads: int
    deployed_json: Path
    finalized_model: Path
    finalized_data: Path  # model.onnx's weights, beside it
    finalize_json: Path


@dataclass(frozen=True)
class Deployable:
    """model.onnx as a configuration makes it: the user's model with `candidates` converted to the low type, less
    the configuration's nodes kept in fp32 (`finalize`), loaded and run by ONNX Runtime compiled as the variant
    precision was assigned on — the artifact the user deploys, judged as it runs. ORT's CPU provider has no
    bf16 kernels: there it cannot run (`runs`). The model is held without its weights: a configuration holds
    only the constants it converts, and ORT reads the rest from the user's data file(s)."""

    model: onnx.ModelProto  # the user's model, its nodes named as the graph records name them, without weights
    candidates: tuple[str, ...]  # in the model's order
    dtype: str
    dtypes: Mapping[str, str]
    judge: SampleJudge
    runtime: Backend
    options: ort_compile.CompileOptions
    weights: Path  # the user's model's folder: its external data

    @property
    def runs(self) -> bool:
        return runs_on(self.dtype, self.runtime)

    def converted(self, off: Config) -> onnx.ModelProto:
        return finalize(self.model, set(self.candidates) - off, self.dtype, self.dtypes, self.weights)

    def __call__(self, off: Config, threads: int, stop_early: bool = True) -> dict[str, Any]:
        final = self.converted(off)
        try:
            runner = ort_compile.Runner(final.SerializeToString(), ort_compile.with_weights(self.options, self.weights),
                                        self.runtime, threads).activate()
            return self.judge.judge(runner, stop_early)
        except ModelError as error:  # ORT refused to load or to run it
            raise FinalizeError(_failure("the mixed-precision model fails in ONNX Runtime", error, final)) from None

    def carried(self, graph: GraphRecord, reduced: set[str]) -> frozenset[str]:
        """The candidates kept in fp32 when the compiled nodes `reduced` run reduced and the rest fp32."""
        return frozenset(self.candidates) - original_low_nodes(graph, reduced)


@dataclass(frozen=True)
class LowRange:
    """What ORT's CPU provider cannot show: it runs fp16 ops in fp32 behind Casts and removes Cast pairs, so a
    tensor model.onnx stores in fp16 beyond 65504 never becomes inf there, nor in the compiled route when a
    fusion makes it interior (MatMulAddFusion's bias Add). A configuration fails where a tensor its reduced
    nodes write or read in the low type (`held`, the converter's own decision) exceeds the type's max by its
    fp32 reference value (`ranges`, per sample) on any sample."""

    held: Mapping[str, frozenset[str]]  # per candidate: the tensors it stores or reads in the low type
    ranges: Mapping[str, Sequence[float]]  # per such tensor: its largest finite |x| on each sample, fp32
    samples: tuple[str, ...]  # the samples' names, in order
    dtype: str

    def largest(self, node: str) -> float:
        """The largest reference magnitude among the tensors `node` holds in the low type (0 for none)."""
        return max((max(self.ranges[t], default=0.0) for t in self.held.get(node, ())), default=0.0)

    def overflow(self, reduced: set[str]) -> dict[str, Any] | None:
        """A failing verdict (a probe's shape) naming, per sample, the largest tensor beyond the range; None
        when every held tensor fits."""
        limit = LOW_MAX[self.dtype]
        tensors = sorted(set().union(*(self.held.get(node, ()) for node in reduced)))
        samples = []
        for index, sample in enumerate(self.samples):
            beyond = sorted(((self.ranges[t][index], t) for t in tensors if self.ranges[t][index] > limit),
                            reverse=True)
            if beyond:
                value, tensor = beyond[0]
                samples.append({"inputs": sample, "passed": False, "outputs": {}, "reasons": [
                    f"tensor '{tensor}' reaches {value:.3g} in the fp32 reference, beyond {self.dtype}'s max "
                    f"{limit:.6g}: inf where it is stored in {self.dtype} ({len(beyond)} such tensor(s))"]})
        return {"passed": False, "samples": samples, "worst": {}} if samples else None


def low_range(model: onnx.ModelProto, candidates: Sequence[str], dtype: str, dtypes: Mapping[str, str],
              judge: SampleJudge, runtime: Backend, threads: int, weights: Path) -> LowRange:
    """The tensors each candidate holds in the low type, and their reference ranges, measured once per job by
    running the user's model. Constants, initializers or Constant nodes (paddle2onnx writes every weight as one),
    are left to the runs: model.onnx holds them converted, so ORT computes with their inf."""
    held = {node: frozenset(tensors) for node, tensors in low_tensors(model, set(candidates), dtype, dtypes).items()}
    constants = {init.name for init in model.graph.initializer}
    constants |= {proto.output[0] for proto in model.graph.node if proto.op_type == "Constant"}
    names = sorted(set().union(*held.values()) - constants)
    ranges = reference_ranges(model, names, [sample.inputs for sample in judge.samples], runtime, threads, weights)
    held = {node: tensors & set(ranges) for node, tensors in held.items()}
    return LowRange(held, ranges, tuple(sample.name for sample in judge.samples), dtype)


@dataclass(frozen=True)
class BothRoutes:
    """A configuration of the user's nodes kept in fp32 judged as each way of deploying it does: model.onnx, the
    user's graph converted and run (`Deployable`), and keep_dtype.txt handed to a compiler that fuses first —
    the search's own probe with the compiled nodes those names resolve to kept in fp32, judged once in the
    search's store. Both must pass: a failure reports the route that failed, a pass the deployable model's
    metrics. The compiled route runs as the search does, so it also shows the activation overflow that ORT's
    CPU fp16 kernels hide in model.onnx (they compute in fp32 behind Casts), except where a fusion makes the
    tensor interior: `low_range` checks those first, without a run; a constant is fp16 in model.onnx whatever
    the kernel, which the compiled route may have folded away (ConvBNFusion).
    `candidates` also holds the reduced compiled nodes that stand for none of the user's nodes the converter
    lowers (ORT made them, or only ops with no low-type kernel): keep_dtype.txt names those by their compiled
    name, and model.onnx leaves them be."""

    deployable: Deployable
    compiled: PrecisionProbe
    nodes: tuple[GraphNode, ...]  # graph.json's, of the graph precision was assigned on
    compiled_store: VerdictStore
    candidates: tuple[str, ...]
    low_range: LowRange

    def carried(self, graph: GraphRecord, reduced: set[str], culprits: Sequence[str]) -> frozenset[str]:
        """The candidates kept in fp32 when the compiled nodes `reduced` run reduced: the user's nodes no reduced
        compiled node absorbed, and the compiled-only culprits."""
        compiled_only = set(self.candidates) - set(self.deployable.candidates)
        return self.deployable.carried(graph, reduced) | (set(culprits) & compiled_only)

    def __call__(self, off: Config, threads: int, stop_early: bool = True) -> dict[str, Any]:
        beyond = self.low_range.overflow(set(self.deployable.candidates) - off)
        if beyond is not None:
            return beyond
        deployed = self.deployable(off, threads, stop_early) if self.deployable.runs else {"passed": True}
        if not deployed["passed"]:
            return deployed
        kept = frozenset(resolve_keep_dtype(sorted(off), self.nodes)) & self.compiled.reduced
        compiled = judged(self.compiled, self.compiled_store, threads, kept)
        if compiled.passed and self.deployable.runs:
            return deployed
        return {"passed": compiled.passed, "samples": list(compiled.samples), "worst": dict(compiled.worst)}


def deploy_answer(step: DeployStep) -> None:
    """Deploy job: the search's answer settled in the user's model (verified, made 1-minimal, or searched
    again there), the mixed-precision model made of it, checked and judged, and deployed.json."""
    found = SearchRecord.read(step.search_json)
    if found.status == NOT_AMONG_CANDIDATES:
        raise PreconditionError(NOT_THE_CAUSE)
    answer_status(found, "node")  # a budget that ran out before anything passed: its one line
    assignment, graph = Assignment.read(step.assignment), GraphRecord.read(step.graph_json)
    routes = both_routes(step, assignment, graph)
    carried = routes.carried(graph, set(assignment.reduced) - set(found.culprits), found.culprits)
    settled = Settle(routes, VerdictStore.from_json(step.verdicts), step.threads, step.bisect).run(
        carried, found, ranked(routes, found, graph, carried))
    model = publish_model(step, routes.deployable, settled.keep, assignment)
    op_types = {**{node.name: node.op_type for node in graph.nodes},
                **{node.name: proto.op_type for node, proto in nodes_with_protos(routes.deployable.model.graph)}}
    DeployedRecord(routes.candidates, tuple(c for c in routes.candidates if c in carried),
                   settled.carried_verdict, settled.how, settled.keep, settled.verdict, tuple(settled.probes),
                   settled.minimal, settled.stopped_by,
                   tuple(mixlist_suggestion(settled.keep, routes.candidates, op_types)), model
                   ).write(step.deployed_json)


def both_routes(step: DeployStep, assignment: Assignment, graph: GraphRecord) -> BothRoutes:
    """The user's model, every node named, with the nodes the converter lowers as candidates, and the search's
    probe of the compiled graph, judging on the same samples."""
    original, runtime = load_model(step.model, load_weights=False), backend_named(step.backend)
    name_nodes_uniquely(original.graph)  # the deployable model must load: ORT refuses repeated node names
    dtypes = tensor_dtypes(original, step.sample_inputs[0], runtime, step.threads, step.model.parent)
    control_flow = {node.name for node, proto in nodes_with_protos(original.graph) if subgraph_reads(proto)}
    reduced = set(assignment.reduced)
    lowered = lowered_nodes(original, original_low_nodes(graph, reduced) - control_flow, assignment.dtype, dtypes)
    judge = SampleJudge.load(step.sample_inputs, step.references, step.output_names, step.accuracy)
    options = Variant.from_json(step.variant).options(installed_catalogue())
    deployable = Deployable(original, tuple(lowered), assignment.dtype, dtypes, judge, runtime, options,
                            step.model.parent)
    compiled = PrecisionProbe.of(step.compiled_model, assignment, judge, runtime)
    compiled_only = tuple(node.name for node in graph.nodes
                          if node.name in reduced and not set(lowered) & set(node.original_nodes))
    ranges = low_range(original, lowered, assignment.dtype, dtypes, judge, runtime, step.threads, step.model.parent)
    return BothRoutes(deployable, compiled, graph.nodes, VerdictStore.from_json(step.search_verdicts),
                      deployable.candidates + compiled_only, ranges)


def publish_model(step: DeployStep, deployable: Deployable, keep: Sequence[str],
                  assignment: Assignment) -> dict[str, Any]:
    """model.onnx with `keep` in fp32 and its weights in its own data file beside it (model.onnx.data: it loads
    wherever the two are copied, at any size), checked and run on every sample as written, and finalize.json,
    which is returned. The two files appear together or not at all (`atomic_model`)."""
    final = deployable.converted(frozenset(keep))
    with atomic_model(step.finalized_model) as temporary:
        save_whole(final, temporary, deployable.weights, step.finalized_data.name)
        _check(final, temporary, step.model)
        model = {"model": step.model.name, "dtype": assignment.dtype, "graph": assignment.graph,
                 "reduced_original_nodes": len(set(deployable.candidates) - set(keep)),
                 "original_nodes": len(deployable.model.graph.node),
                 **verify(final, temporary, assignment.dtype, deployable.judge, deployable.runtime, deployable.options)}
        if model.get("passed") is False:
            raise FinalizeError(f"{step.model}: the mixed-precision model fails the accuracy check when ONNX Runtime "
                                f"runs it on every sample ({worst_text(model['worst'])}), though it passed as a probe; "
                                "nothing is published: keep more nodes in fp32 (precision.keep_dtype) and rerun, or "
                                "report it")
    write_json(step.finalize_json, model)
    return model


def ranked(routes: BothRoutes, found: SearchRecord, graph: GraphRecord,
           carried: frozenset[str]) -> list[dict[str, Any]]:
    """The candidates most suspect first, for a search again: those the search's answer keeps, then those
    reading a constant beyond the low type's range (what a fusion folds away: a BatchNorm's variance), then
    those holding an activation beyond it in the low type (`LowRange`), then in the order of the search's
    ranking of the compiled nodes that absorbed them."""
    user = routes.deployable
    limit = LOW_MAX[user.dtype]
    overflowing = constant_overflow(user.model, limit, user.weights)
    position = {name: index for index, name in enumerate(found.candidates)}
    rank_of: dict[str, int] = {}
    for node in graph.nodes:
        for name in node.original_nodes:
            rank_of[name] = min(rank_of.get(name, len(position)), position.get(node.name, len(position)))
    evidence = [{"name": name, "kept_by_search": name in carried, "constant_overflow": overflowing.get(name, 0.0),
                 "activation_overflow": largest if (largest := routes.low_range.largest(name)) > limit else 0.0,
                 "search_rank": rank_of.get(name, position.get(name))} for name in routes.candidates]
    return sorted(evidence, key=lambda e: (not e["kept_by_search"], -e["constant_overflow"], -e["activation_overflow"],
                                           len(position) if e["search_rank"] is None else e["search_rank"]))


def constant_overflow(model: onnx.ModelProto, limit: float, weights: Path) -> dict[str, float]:
    """Per node: the largest finite magnitude beyond `limit` among the constants it reads (initializers and
    Constant nodes, the external ones read from the folder `weights` one at a time); nodes reading none are
    left out."""
    constants = {init.name: init for init in model.graph.initializer}
    constants.update({proto.output[0]: attribute.t for proto in model.graph.node if proto.op_type == "Constant"
                      for attribute in proto.attribute if attribute.name == "value"})
    largest: dict[str, float] = {}
    for tensor, proto in constants.items():
        if proto.data_type == onnx.TensorProto.FLOAT:
            largest[tensor] = largest_finite(numpy_helper.to_array(proto, str(weights)))
    found: dict[str, float] = {}
    for node, proto in nodes_with_protos(model.graph):
        beyond = [largest[t] for t in proto.input if largest.get(t, 0.0) > limit]
        if beyond:
            found[node.name] = max(beyond)
    return found


def mixlist_suggestion(kept: Sequence[str], reduced: Sequence[str], op_types: Mapping[str, str]) -> list[str]:
    """Op types better moved to the black list as a whole: at least two reduced nodes of the type, and
    every one of them must be kept in fp32 anyway."""
    needed, present = Counter(op_types[c] for c in kept), Counter(op_types[r] for r in reduced)
    return sorted(t for t, count in needed.items() if count >= 2 and count == present[t])


@dataclass(frozen=True)
class Settled:
    """The answer in the deployable model: how it was reached, its nodes kept fp32 and its verdict."""

    how: str
    keep: tuple[str, ...]
    verdict: Mapping[str, Any]
    carried_verdict: Mapping[str, Any]
    probes: list[dict[str, Any]]
    minimal: bool
    stopped_by: str | None


class Settle:
    """The deployable pass: the carried answer verified, then made 1-minimal, or searched again."""

    def __init__(self, probe: BothRoutes, store: VerdictStore, threads: int, bisect: Mapping[str, Any]):
        self.probe, self.store, self.threads = probe, store, threads
        self.parallel, self.budget = bisect["parallel"], Budget.from_config(bisect)
        self.probes: list[dict[str, Any]] = []
        self.start = time.monotonic()

    def verdict(self, off: Config) -> VerdictRecord:
        """One configuration's verdict, from disk or probed now, listed among this pass's probes."""
        known = self.store.read(off)
        verdict = known or judged(self.probe, self.store, self.threads, off)
        self.probes.append(probe_entry(len(self.probes), verdict, from_disk=known is not None))
        return verdict

    def known(self, off: Config) -> VerdictRecord:
        """A configuration this pass has probed already (the answer it settled on), or probed now."""
        return self.store.read(off) or self.verdict(off)

    def run(self, carried: frozenset[str], found: SearchRecord, ranking: list[dict[str, Any]]) -> Settled:
        order = [entry["name"] for entry in ranking]
        first = self.verdict(carried)
        if first.passed and found.status == UNFINISHED:  # the budget is spent: the search's best, not minimal
            return self.settled(VERIFIED, carried, first, first, False, found.stopped_by, order)
        if first.passed:
            log.info("precision_bisect in your model: the answer (%d node(s) in fp32) passes; checking that each "
                     "is needed", len(carried))
            keep, stopped_by = self.minimize(carried, order)
            how = VERIFIED if keep == carried else MINIMIZED
            return self.settled(how, keep, self.known(keep), first, stopped_by is None, stopped_by, order)
        log.info("precision_bisect in your model: the answer (%d node(s) in fp32) fails there (%s); searching "
                 "again over its %d reduced nodes", len(carried), worst_text(first.worst) or "; ".join(_reasons(first)),
                 len(order))
        again = self.search_again(carried, first, ranking)
        keep = frozenset(again.culprits)
        return self.settled(SEARCHED, keep, self.known(keep), first, again.minimal, again.stopped_by, order)

    def minimize(self, kept: frozenset[str], order: Sequence[str]) -> tuple[frozenset[str], str | None]:
        """Each kept node tried back in the low type, the least suspect first, dropped where the model still
        passes; repeated until a pass drops none, so every node left is needed (1-minimal)."""
        dropped = True
        while dropped:
            dropped = False
            for node in sorted(kept, key=order.index, reverse=True):
                room, limit = self.budget.room(len(self.probes), time.monotonic() - self.start)
                if room == 0 and self.store.read(kept - {node}) is None:
                    return kept, limit
                if self.verdict(kept - {node}).passed:
                    kept, dropped = kept - {node}, True
        return kept, None

    def search_again(self, carried: frozenset[str], first: VerdictRecord, ranking: list[dict[str, Any]]):
        """The strategy over the user's nodes, with the deployable model as the probe."""
        nothing_off = first if not carried else self.verdict(frozenset())
        found = search("precision_bisect in your model", ranking, nothing_off.passed, self.store,
                       self.probe, self.parallel, self.threads, self.budget)
        self.probes.extend(found.probes)
        if found.status == NOT_AMONG_CANDIDATES:
            raise PreconditionError("even with every reduced node of your model in fp32 it fails: precision is not "
                                    "the cause")
        answer_status(found, "node")  # a budget that ran out before anything passed: its one line
        return found

    def settled(self, how: str, keep: frozenset[str], verdict: VerdictRecord, first: VerdictRecord, minimal: bool,
                stopped_by: str | None, order: Sequence[str]) -> Settled:
        return Settled(how, tuple(name for name in order if name in keep), _shaped(verdict), _shaped(first),
                       self.probes, minimal, stopped_by)


def _shaped(verdict: VerdictRecord) -> dict[str, Any]:
    """A verdict as result.json's `final_verdict` shows it."""
    return {"off": list(verdict.off), "passed": verdict.passed,
            "samples_passed": [sample["passed"] for sample in verdict.samples], "worst": dict(verdict.worst),
            "reasons": _reasons(verdict)}


def _reasons(verdict: VerdictRecord) -> list[str]:
    """The first failing sample's reasons (a tensor beyond the low type's range, or the outputs' checks)."""
    return next((list(sample.get("reasons", ())) for sample in verdict.samples if not sample["passed"]), [])


def _check(final: onnx.ModelProto, saved: Path, original: Path) -> None:
    """`onnx.checker` on `final` as saved (with its data file), with full type and shape inference where the
    user's model at `original` itself passes it (exporters write models that do not)."""
    try:
        onnx.checker.check_model(str(saved), full_check=_passes_full_check(original))
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        what = f"{original}: the mixed-precision model fails onnx.checker"
        raise FinalizeError(_failure(what, error, final)) from None


def _passes_full_check(model: Path) -> bool:
    try:
        onnx.checker.check_model(str(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def runs_on(dtype: str, backend: Backend) -> bool:
    """Whether ONNX Runtime can run a model holding `dtype` on `backend`: its CPU provider has no bf16 kernels."""
    return not (dtype == "bf16" and backend.provider == "CPUExecutionProvider")


def verify(final: onnx.ModelProto, saved: Path, dtype: str, judge: SampleJudge, backend: Backend,
           options: ort_compile.CompileOptions) -> dict[str, Any]:
    """`final` as saved at `saved`, loaded from there and run by ORT compiled with `options` (the variant
    precision was assigned on) and judged by `judge` on every sample; where ORT cannot run it (`runs_on`) it is
    only checked."""
    if not runs_on(dtype, backend):
        return {"checked": "onnx.checker only: ONNX Runtime's CPU provider has no bf16 kernels"}
    try:
        runner = ort_compile.Runner(saved, options, backend).activate()
        judged = judge.judge(runner, stop_early=False)
    except ModelError as error:  # ORT refused to load or to run it
        raise FinalizeError(_failure("the mixed-precision model fails in ONNX Runtime", error, final)) from None
    return {"checked": f"loaded and run by ONNX Runtime on {backend.provider} at level {options.level}",
            "passed": judged["passed"], "worst": judged["worst"]}


def _failure(what: str, error: Exception, model: onnx.ModelProto) -> str:
    """One line: what failed, the node and op type the message names, and what to do."""
    text = " ".join(str(error).split())
    found = _NODE_IN_MESSAGE.search(text)
    node = next((group for group in found.groups() if group), None) if found else None
    op_types = {proto.name: proto.op_type for proto in model.graph.node}
    where = f" at node '{node}' ({op_types[node]})" if node in op_types else ""
    return (f"{what}{where}: {text[:300]}. Nothing is published; add the node to precision.keep_dtype, or "
            "report it, and rerun precision_bisect")
