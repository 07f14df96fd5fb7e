"""`snakemake precision_bisect` on `backend: openvino-cpu`: the fewest executed nodes to keep in f32 on the
CPU's own bf16/f16 kernels.

The candidates are the nodes the plugin runs in the reduced type (`openvino_keep.reduced_nodes`), each a unit:
the executed node with every ONNX node it stands for, whose IR layers all carry its mark
(`openvino_keep.marked_layers`), since the plugin keeps no mark on a node a fusion builds. A probe marks a
keep set's units `precise` in the IR and compiles it, and reads back what ran: a kept node whose mark the
plugin dropped is reported in the probe, and a node that stays reduced with every candidate marked cannot be
kept at all, so it is no candidate (the answer names it, most suspect first). Measured on ppocr_rec and
deepcut (bf16): the nodes dropped alone are exactly those dropped with every candidate marked, so one
compile finds them, and marking their executed producers or consumers too keeps none of them. OpenVINO runs
no node alone, so the ranking is the error each node adds in the reduced run: the relative error of its
output less the largest of its inputs', measured on the first sample with every candidate's output exposed.
Real kernels fail by error piling up over many nodes as often as by one culprit, which costs group testing
thousands of probes (yolov8n bf16: 1699), so the search walks the ranking (`core/walk.py`): the shortest
top of it that passes (a bisection over its length), then each of those nodes given back to the reduced
type, least suspect first, and left there when the model still passes, pass after pass until a pass gives
none back: 1-minimal over the units, each one left probed needed. The search is a `Search` run by the one
driver (`KeepWalk`, `driver.drive`: the progress lines, its verdicts kept in the workspace as the ORT searches
keep theirs, with the marks each probe's plugin dropped, so a killed or rerun job probes nothing it judged
before); the nodes no mark keeps are what it must know first (its `floor`). It is no `Bisection` (two jobs
that start from a comparison): OpenVINO has no local errors and one job holds the child process. Probes run in one child
process (a compile can crash its process); the answer is the IR with its marks, read back from its files,
compiled and judged again: its verdict is the answer's.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from accubisect.bisection.driver import drive
from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.protocol import Search
from accubisect.bisection.search import Pace, Prober, judged
from accubisect.core.accuracy import Judged
from accubisect.core.errors import BackendError, FinalizeError, PreconditionError
from accubisect.core.strategy import NOT_AMONG_CANDIDATES, Configuration, Outcome, Round
from accubisect.core.walk import next_keep
from accubisect.formats.files import write_atomic
from accubisect.formats.mixlist import write_keep_dtype
from accubisect.formats.openvino_precision_result import OpenVinoPrecisionResult
from accubisect.formats.step import Step
from accubisect.formats.verdict import VerdictRecord, VerdictStore
from accubisect.reports.run_context import with_context
from accubisect.runtime.openvino_backend import CompiledRunner

NOTHING_TO_FIX, FIXED, UNFIXABLE = "nothing to fix", "fixed", "no keep set passes"


@dataclass(frozen=True)
class Candidate:
    """An executed node that runs in the reduced type, with its kind (`layerType`), the IR layers a mark goes
    on to keep it (`openvino_keep.marked_layers`: those of every ONNX node it stands for), those ONNX nodes,
    and the error it adds (None: its output has no ONNX name to expose)."""

    name: str
    layer_type: str
    layers: tuple[str, ...]
    original: tuple[str, ...]
    added_error: float | None


@dataclass
class KeepSearch:
    """What the search found: every probe, the candidates whose marks the plugin drops, and the keep set."""

    status: str
    ranking: list[Candidate]
    probes: list[dict[str, Any]] = field(default_factory=list)
    not_keepable: list[str] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)
    reason: str = ""


class _Worker:
    """The child process's state: the marked IR, the samples, the check."""

    def __init__(self, model: Path, hint: str, threads: int, judge: SampleJudge) -> None:
        from accubisect.runtime.openvino_keep import MarkedIR

        self.model, self.hint, self.threads, self.judge = model, hint, threads, judge
        self.ir = MarkedIR(model)

    def rank(self) -> list[Candidate]:
        from accubisect.runtime.openvino_backend import onnx_graph_of
        from accubisect.runtime.openvino_graph import executed_graph, original_nodes
        from accubisect.runtime.openvino_keep import marked_layers, reduced_nodes

        read = self.ir.read()
        graph = executed_graph(read, self.ir.compile({}, self.hint, self.threads).compiled.get_runtime_model())
        onnx_graph, ops = onnx_graph_of(self.model).graph, read.get_ordered_ops()
        mapped = original_nodes(onnx_graph, ops, graph)
        layers = marked_layers(ops, onnx_graph, graph, mapped)
        nodes = {node.name: node for node in graph.nodes}
        names = reduced_nodes(graph)
        errors = self._errors(read, [t for name in names for t in (*nodes[name].inputs, *nodes[name].outputs)],
                              graph.output_precisions())
        found = [Candidate(name, nodes[name].layer_type, layers[name], tuple(mapped.get(name, ())),
                           _added(errors, nodes[name].inputs, nodes[name].outputs)) for name in names]
        return sorted(found, key=lambda c: (c.added_error is None, -(c.added_error or 0.0)))  # stable: run order

    def _errors(self, read, tensors: Sequence[str], precisions: Mapping[str, str]) -> dict[str, float]:
        """Each tensor's relative error (L2) in the reduced run against the f32 one, on the first sample; the
        reduced run's exposed tensors in the type their nodes write (an f32 output keeps the tail in f32)."""
        from accubisect.runtime.openvino_backend import compiled_on_cpu, exposed_model, run_outputs

        present = {name for op in read.get_ordered_ops() for out in op.outputs() for name in out.get_names()}
        wanted = sorted(set(tensors) & present - {name for out in read.outputs for name in out.get_names()})
        feeds = self.judge.samples[0].inputs
        runs = [run_outputs(compiled_on_cpu(self.ir.core, exposed_model(read, wanted, kinds), self.model,
                                            {"INFERENCE_PRECISION_HINT": hint}, self.threads), feeds)
                for hint, kinds in (("f32", {}), (self.hint, precisions))]
        return {name: _relative(runs[0][name], runs[1][name]) for name in wanted if name in runs[0]}

    def probe(self, kept: Mapping[str, tuple[str, ...]]) -> Judged:
        """The keep set judged, with the kept nodes whose marks the plugin dropped."""
        result = self.ir.compile(kept, self.hint, self.threads)
        return {**self.judge.judge(CompiledRunner(result.compiled)), "not_applied": list(result.dropped)}

    def publish(self, kept: Mapping[str, tuple[str, ...]], folder: Path) -> dict[str, Any]:
        """Writes the IR with the marks and judges it as a user would load it: read from its files, compiled
        with the hint on this CPU, the marks read back."""
        from accubisect.runtime.openvino_backend import compiled_on_cpu
        from accubisect.runtime.openvino_keep import dropped

        xml, weights = self.ir.save([layer for layers in kept.values() for layer in layers], folder)
        compiled = compiled_on_cpu(self.ir.core, self.ir.core.read_model(str(xml), str(weights)), xml,
                                   {"INFERENCE_PRECISION_HINT": self.hint}, self.threads)
        judged = self.judge.judge(CompiledRunner(compiled), stop_early=False)
        return {"passed": judged["passed"], "worst": judged["worst"],
                "dropped": list(dropped(compiled.get_runtime_model(), kept))}


_WORKER: _Worker | None = None


def _start(model: Path, hint: str, threads: int, samples: tuple[Any, ...]) -> None:
    """The child's state; `samples` are `SampleJudge.load`'s arguments (a val_func is loaded here)."""
    global _WORKER
    _WORKER = _Worker(model, hint, threads, SampleJudge.load(*samples))


def _call(method: str, *args: Any) -> Any:
    return getattr(_WORKER, method)(*args)


class Probes:
    """The search's probes, in one child process that holds the model and the samples (the verdict store
    asks for each configuration once)."""

    def __init__(self, model: Path, hint: str, threads: int, samples: tuple[Any, ...]) -> None:
        """`samples`: `SampleJudge.load`'s arguments (inputs, references, output names, the accuracy check)."""
        self.model, self.hint = model, hint
        self.pool = ProcessPoolExecutor(1, get_context("spawn"), _start, (model, hint, threads, samples))
        self.layers: dict[str, tuple[str, ...]] = {}

    def __enter__(self) -> Probes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown()

    def call(self, method: str, *args: Any) -> Any:
        try:
            return self.pool.submit(_call, method, *args).result()
        except BrokenProcessPool:
            raise BackendError(f"{self.model}: OpenVINO's CPU plugin crashed its process in {method}; "
                               "run precision_bisect with backend: ort-cpu") from None

    def rank(self) -> list[Candidate]:
        ranking = self.call("rank")
        self.layers = {c.name: c.layers for c in ranking}
        return ranking

    def judged(self, kept: Configuration, threads: int = 1, stop_early: bool = True) -> Judged:
        """A probe as the driver asks for it (a `Prober`; the child has its own threads and judges as `probe`
        does)."""
        return self.call("probe", {name: self.layers[name] for name in kept})

    def publish(self, kept: Sequence[str], folder: Path) -> dict[str, Any]:
        return self.call("publish", {name: self.layers[name] for name in kept}, folder)


class KeepWalk(Search):
    """The search as the driver runs it: the candidates as the child ranks them, nothing kept probed first, then
    the nodes no mark keeps (`floor`: marked with every candidate, they stay reduced) left out of the walk."""

    name, unit = "precision_bisect", "executed node"

    def __init__(self, probe: Probes, store: VerdictStore) -> None:
        self.probe, self.store = probe, store
        self.ranking: list[Candidate] = []
        self.not_keepable: list[str] = []

    def candidates(self) -> list[str]:
        self.ranking = self.probe.rank()
        return [c.name for c in self.ranking]

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        """The child lists the candidates ranked (by the error each adds)."""
        return [{"name": c.name, "added_error": c.added_error} for c in self.ranking]

    def nothing_off_passes(self) -> bool:
        return self.verdict(frozenset()).passed

    def verdict(self, kept: Configuration) -> VerdictRecord:
        """A keep set's verdict: from the store, or probed now."""
        return judged(self.probe.judged, self.store, 1, kept)

    def prober(self) -> Prober:
        return self.probe.judged

    def floor(self, ranking: Sequence[Mapping[str, Any]], judge_whole: Callable[[Configuration], VerdictRecord],
              key_of: Callable[[Configuration], str]) -> dict[str, Any]:
        """The candidates that stay reduced with every candidate marked: no mark keeps them (probed as every
        probe is, by the child: a verdict of its own, with what ran)."""
        dropped = set(judge_whole(frozenset(c.name for c in self.ranking)).not_applied)
        self.not_keepable = [c.name for c in self.ranking if c.name in dropped]
        return {"not_keepable": self.not_keepable}

    def strategy(self, candidates: Sequence[str], verdicts: Mapping[Configuration, bool],
                 parallel: int) -> Round | Outcome:
        """The walk over the keepable candidates (`core/walk.py`)."""
        return next_keep([name for name in candidates if name not in self.not_keepable], verdicts)


def search_keep(probe: Probes, store: VerdictStore) -> KeepSearch:
    """Ranks the candidates, then finds the keep set (module docstring), under the one driver, each verdict
    read from `store` when it holds it."""
    walk = KeepWalk(probe, store)
    searched = drive(walk, store, Pace(1, 1))
    every = frozenset(c.name for c in walk.ranking) if searched.floor is not None else frozenset()
    asked = dict.fromkeys([frozenset(), every, *(frozenset(p["off"]) for p in searched.probes)])
    found = KeepSearch(FIXED if searched.culprits else NOTHING_TO_FIX, walk.ranking,
                       [_listed(walk.verdict(kept)) for kept in asked], walk.not_keepable, list(searched.culprits))
    if searched.status == NOT_AMONG_CANDIDATES:
        keepable = [c.name for c in walk.ranking if c.name not in walk.not_keepable]
        kinds = Counter(c.layer_type for c in walk.ranking if c.name in walk.not_keepable)
        found.status = UNFIXABLE
        found.reason = _unfixable(len(keepable), walk.not_keepable, kinds, probe.hint,
                                  walk.verdict(frozenset(keepable)).worst)
    return found


def _listed(verdict: VerdictRecord) -> dict[str, Any]:
    """A probe as result.json lists it: the keep set, its verdict, the marks the plugin dropped."""
    return {"kept_fp32": list(verdict.off), "passed": verdict.passed, "worst": dict(verdict.worst),
            "dropped": list(verdict.not_applied), "seconds": verdict.seconds}


def _unfixable(keepable: int, not_keepable: Sequence[str], kinds: Counter[str], hint: str,
               worst: Mapping[str, float]) -> str:
    """Why no keep set passes, in one line: the check with every keepable node kept, and the nodes that stay in
    the reduced type even when marked with every ONNX node they stand for, counted by kind, the first named."""
    counted = ", ".join(f"{count} {kind}" for kind, count in kinds.most_common())
    dropped = (f"; the plugin drops the marks of {len(not_keepable)} more, which stay {hint} even when every ONNX "
               f"node they stand for is marked ({counted}: {', '.join(not_keepable[:3])}"
               f"{', ...' if len(not_keepable) > 3 else ''})" if not_keepable else "")
    metrics = ", ".join(f"{key} {worst[key]:.3g}" for key in ("mismatch", "cosine", "max_rel") if key in worst)
    return (f"with all {keepable} keepable nodes in f32 the model still fails the check ({metrics}){dropped}: "
            "no keep set passes on this backend")


def _relative(reference: np.ndarray, reduced: np.ndarray) -> float:
    reference, reduced = reference.astype(np.float64), reduced.astype(np.float64)
    scale = np.linalg.norm(reference)
    error = np.linalg.norm(reduced - reference)
    return float(error / scale) if scale > 0 else float(error)


def _added(errors: Mapping[str, float], inputs: Sequence[str], outputs: Sequence[str]) -> float | None:
    """The error a node adds: its outputs' worst less its inputs' worst (None: no output measured)."""
    out = [errors[name] for name in outputs if name in errors]
    if not out:
        return None
    return max(out) - max((errors[name] for name in inputs if name in errors), default=0.0)


@dataclass(frozen=True)
class OpenVinoPrecisionStep(Step):
    """The job's files and params (rule `openvino_precision_bisect`)."""

    model: Path
    sample_inputs: tuple[Path, ...]
    references: tuple[Path, ...]
    output_names: tuple[str, ...]
    accuracy: Mapping[str, Any]
    dtype: str  # precision.dtype
    threads: int
    result_json: Path
    keep_dtype: Path
    ir_xml: Path
    ir_bin: Path
    summary: Path
    verdicts: Mapping[str, Any]  # the verdict store (`VerdictStore.to_json`)
    context: Mapping[str, Any]  # the summary's first line (`run_context.LINE_FIELDS`)


def bisect_openvino_precision(step: OpenVinoPrecisionStep) -> None:
    """The job: the search, then the IR with the answer's marks written and judged again from its files."""
    from accubisect.runtime.openvino_backend import HINTS

    start = time.perf_counter()
    samples = (step.sample_inputs, step.references, step.output_names, step.accuracy)
    with Probes(step.model, HINTS[step.dtype], step.threads, samples) as probe:
        found = search_keep(probe, VerdictStore.from_json(step.verdicts))
        if found.status == UNFIXABLE:
            raise PreconditionError(f"{step.model}: {found.reason}")
        with tempfile.TemporaryDirectory(dir=step.ir_xml.parent) as folder:
            verdict = probe.publish(found.keep, Path(folder))
            if not verdict["passed"]:
                raise FinalizeError(f"{step.model}: the IR with the answer's marks (keep {len(found.keep)} "
                                    "executed node(s) in f32) passed as a probe but fails the check compiled "
                                    "again from its files; nothing is published: rerun with a looser accuracy "
                                    "check, or report it")
            os.replace(Path(folder, "model.xml"), step.ir_xml)
            os.replace(Path(folder, "model.bin"), step.ir_bin)
    result = _result(found, verdict, step.dtype, time.perf_counter() - start)
    write_keep_dtype(step.keep_dtype, result.keep_dtype)
    result.write(step.result_json)
    write_atomic(step.summary, with_context(step.context, _summary(result)))


def _result(found: KeepSearch, verdict: Mapping[str, Any], dtype: str, seconds: float) -> OpenVinoPrecisionResult:
    by_name = {c.name: c for c in found.ranking}
    original = tuple(dict.fromkeys(node for name in found.keep for node in by_name[name].original))
    return OpenVinoPrecisionResult(
        found.status, dtype, len(found.ranking),
        tuple({"name": c.name, "type": c.layer_type, "added_error": c.added_error, "original_nodes": list(c.original),
               "marked": list(c.layers)} for c in found.ranking),
        tuple(found.not_keepable), tuple(found.keep), original, tuple(found.probes), round(seconds, 1),
        dict(verdict))


def _summary(result: OpenVinoPrecisionResult) -> str:
    verdict = result.final_verdict
    worst = ", ".join(f"{key} {verdict['worst'][key]:.3g}" for key in ("mismatch", "cosine")
                      if key in verdict["worst"])
    lines = [f"{result.status}: keep {len(result.kept_fp32)} of {result.candidates} executed nodes in f32 "
             f"({len(result.keep_dtype)} ONNX nodes, keep_dtype.txt); the rest in {result.dtype} on this CPU's "
             f"kernels; {len(result.probes)} probes, {result.seconds:g} s",
             f"model.xml/model.bin: the OpenVINO IR with their `precise` marks, read back and compiled with the hint "
             f"on this CPU: passes the check ({worst}), marks dropped: {len(verdict['dropped'])}"]
    if result.not_keepable:
        lines.append(f"the plugin drops the marks of {len(result.not_keepable)} executed node(s), which stay "
                     f"{result.dtype} even when every ONNX node they stand for is marked: "
                     f"{', '.join(result.not_keepable[:5])}")
    return "\n".join(lines) + "\n"
