"""The deploy job's probes: a configuration of the user's nodes kept in fp32, judged as each way of deploying it
does (`bisection/deployable.py` is the job).

`Deployable` is model.onnx as the configuration makes it, converted and run by ONNX Runtime; `LowRange` is what
ORT's CPU provider cannot show, an activation stored in the low type beyond its range; `BothRoutes` judges a
configuration as model.onnx and as keep_dtype.txt handed to a compiler that fuses first (the search's own
probe), and both must pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.precision_bisect import PrecisionProbe
from accubisect.bisection.search import judged
from accubisect.core.errors import FinalizeError, ModelError
from accubisect.core.metrics import LOW_PRECISION
from accubisect.core.precision import resolve_keep_dtype
from accubisect.core.strategy import Configuration
from accubisect.formats.graph_record import GraphNode, GraphRecord
from accubisect.formats.verdict import VerdictStore
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend
from accubisect.runtime.finalize import finalize, low_tensors
from accubisect.stages.tensor_ranges import reference_ranges

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
class Deployable:
    """model.onnx as a configuration makes it: the user's model with `candidates` converted to the low type, less
    the configuration's nodes kept in fp32 (`finalize`), loaded and run by ONNX Runtime compiled as the variant
    precision was assigned on — the artifact the user deploys, judged as it runs. ORT's CPU provider has no
    bf16 kernels: there it cannot run (`runs`). The model is held without its weights, and so is every probe:
    the constants it converts are references into one file of them all converted, written once per job
    (`stored`, `finalize.store_low_constants`), the rest into the user's data file(s), and ORT reads both from
    `folder` (the job's scratch folder), mapping each file once, whatever the number of probes."""

    model: onnx.ModelProto  # the user's model, its nodes named as the graph records name them, without weights
    candidates: tuple[str, ...]  # in the model's order
    dtype: str
    dtypes: Mapping[str, str]
    judge: SampleJudge
    runtime: Backend
    options: ort_compile.CompileOptions
    weights: Path  # the user's model's folder: its external data
    stored: Mapping[str, onnx.TensorProto]  # the converted constants: references by their names in `finalize`
    folder: Path  # where ORT reads a probe's weights: the user's data file(s) linked, and the converted ones

    @property
    def runs(self) -> bool:
        return runs_on(self.dtype, self.runtime)

    def converted(self, off: Configuration) -> onnx.ModelProto:
        """The model.onnx `off` makes, its weights references relative to `folder`."""
        return finalize(self.model, set(self.candidates) - off, self.dtype, self.dtypes, self.weights, self.stored)

    def __call__(self, off: Configuration, threads: int, stop_early: bool = True) -> dict[str, Any]:
        final = self.converted(off)
        try:
            runner = ort_compile.Runner(final.SerializeToString(), ort_compile.with_weights(self.options, self.folder),
                                        self.runtime, threads).activate()
            return self.judge.judge(runner, stop_early)
        except ModelError as error:  # ORT refused to load or to run it
            raise FinalizeError(failure_line("the mixed-precision model fails in ONNX Runtime", error, final)) from None

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

    def __call__(self, off: Configuration, threads: int, stop_early: bool = True) -> dict[str, Any]:
        beyond = self.low_range.overflow(set(self.deployable.candidates) - off)
        if beyond is not None:
            return beyond
        deployed = self.deployable(off, threads, stop_early) if self.deployable.runs else {"passed": True}
        if not deployed["passed"]:
            return deployed
        kept_fp32 = frozenset(resolve_keep_dtype(sorted(off), self.nodes)) & self.compiled.reduced
        compiled = judged(self.compiled, self.compiled_store, threads, kept_fp32)
        if compiled.passed and self.deployable.runs:
            return deployed
        return {"passed": compiled.passed, "samples": list(compiled.samples), "worst": dict(compiled.worst)}


def runs_on(dtype: str, backend: Backend) -> bool:
    """Whether ONNX Runtime can run a model holding `dtype` on `backend`: its CPU provider has no bf16 kernels."""
    return not (dtype == "bf16" and backend.provider == "CPUExecutionProvider")


def failure_line(what: str, error: Exception, model: onnx.ModelProto) -> str:
    """One line: what failed, the node and op type the message names, and what to do."""
    text = " ".join(str(error).split())
    found = _NODE_IN_MESSAGE.search(text)
    node = next((group for group in found.groups() if group), None) if found else None
    op_types = {proto.name: proto.op_type for proto in model.graph.node}
    where = f" at node '{node}' ({op_types[node]})" if node in op_types else ""
    return (f"{what}{where}: {text[:300]}. Nothing is published; add the node to precision.keep_dtype, or "
            "report it, and rerun precision_bisect")
