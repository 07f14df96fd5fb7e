"""The local-error stage: the error each compiled node makes run alone on the reference run's own tensors,
so the report can say how much error a node makes itself and how much it inherits. Fusion's runs every
fusion-on node on fusion-off's tensors; precision's every reduced node, in the reduced configuration, on
the fp32 run's tensors. Writes local.json (`formats/local_errors.py`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from accubisect.core.metrics import BLOCK, Pair, block_metrics, error_metrics, worst_over
from accubisect.core.onnx_graph import graph_nodes, nodes_with_protos
from accubisect.formats.assignment import Assignment
from accubisect.formats.dump_file import DumpReader
from accubisect.formats.local_errors import LocalErrors
from accubisect.formats.model import load_compiled
from accubisect.formats.samples import load_arrays
from accubisect.formats.step import Step
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend, backend_named

log = logging.getLogger(__name__)
# Local error is judged by no tolerance, so changing rtol/atol does not recompute it: `error` is the
# relative Euclidean distance ||c - r|| / ||r|| of the node's output run alone.
LOCAL_METRICS = ("rel_euclidean", "max_abs", "max_rel", "cosine")
LOCAL_CHUNK = BLOCK  # elements per float64 block of a local-error pair
LOCAL_BATCH_BYTES = 64 << 20  # fed and produced tensors of one run of isolated nodes


def isolate(model: onnx.ModelProto, nodes: set[str], dtypes: Mapping[str, str]) -> onnx.ModelProto:
    """Only the named nodes, each reading its activation inputs from new graph inputs `<tensor>/reference`
    and exposing its outputs, so one run computes every node alone on what is fed there."""
    produced = {out for node in model.graph.node for out in node.output if out}
    isolated = onnx.ModelProto()
    isolated.CopyFrom(model)
    chosen = [proto for node, proto in nodes_with_protos(model.graph) if node.name in nodes]
    graph_inputs = {value.name: value for value in model.graph.input}
    del isolated.graph.node[:], isolated.graph.input[:], isolated.graph.output[:]
    fed: dict[str, onnx.ValueInfoProto] = {}
    for proto in chosen:
        node = isolated.graph.node.add()
        node.CopyFrom(proto)
        for index, tensor in enumerate(node.input):
            if tensor in produced:
                node.input[index] = f"{tensor}/reference"
                elem_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtypes[tensor]))
                typed = onnx.helper.make_tensor_value_info(node.input[index], elem_type, None)  # any shape
                fed.setdefault(node.input[index], typed)
            elif tensor in graph_inputs:
                fed.setdefault(tensor, graph_inputs[tensor])
        isolated.graph.output.extend(onnx.ValueInfoProto(name=out) for out in node.output if out)
    isolated.graph.input.extend(fed.values())
    return isolated


@dataclass(frozen=True)
class LocalErrorsStep(Step):
    compiled_model: Path
    reference_dumps: tuple[Path, ...]  # per sample, the reference run whose tensors the nodes are fed
    sample_inputs: tuple[Path, ...]
    backend: str
    local_json: Path
    threads: int | None = None  # ORT's intra-op pool: the job's
    assignment: Path | None = None  # precision's: its reduced nodes run in its reduced type; None: fusion's


def local_errors(step: LocalErrorsStep) -> None:
    """Local-error stage, per node the error it makes alone on the reference run's own inputs (worst over
    samples). Precision's (an assignment given): each reduced node, in the reduced configuration, on the fp32
    run's tensors. Fusion's: each fusion-on compiled node whose input tensors the fusion-off dump also holds
    (names survive at fused-node boundaries), on fusion-off's tensors. Both read the graph alone: ORT
    reads the weights from beside it."""
    compiled = load_compiled(step.compiled_model, load_weights=False)
    weights = step.compiled_model.parent
    if step.assignment is None:
        nodes, reduced = [node.name for node in graph_nodes(compiled.graph)], None
    else:
        chosen = Assignment.read(step.assignment)
        nodes, reduced = list(chosen.reduced), (chosen.dtype, chosen.dtypes)
    run = LocalRun(compiled, backend_named(step.backend), reduced, step.threads, weights)
    run.measure(nodes, step.reference_dumps, step.sample_inputs).write(step.local_json)


@dataclass(frozen=True)
class LocalRun:
    """Nodes of `compiled` run alone on `backend` on a reference run's own tensors — in reduced precision
    `reduced` = (dtype, tensor dtypes) when given — with at most `threads` ORT threads (None: its default);
    `weights`: the folder of `compiled`'s external data, when it was read without its weights."""

    compiled: onnx.ModelProto
    backend: Backend
    reduced: tuple[str, Mapping[str, str]] | None = None
    threads: int | None = None
    weights: Path | None = None

    def measure(self, nodes: Sequence[str], reference_dumps: Sequence[Path],
                sample_inputs: Sequence[Path]) -> LocalErrors:
        """Each of `nodes` run alone on each sample's reference dump, its worst error over samples. Nodes whose
        inputs or outputs a reference dump lacks (filtered, statistics-only, or names fusion made up) are
        listed as skipped. Nodes run in batches of at most LOCAL_BATCH_BYTES of fed and produced tensors (a
        larger node alone), and each output is judged and dropped before the next, so memory follows the
        largest node, not the dump."""
        measured: dict[str, list[dict[str, float]]] = {}
        skipped: set[str] = set()
        for dump_path, inputs in zip(reference_dumps, sample_inputs, strict=True):
            with DumpReader(dump_path) as dump:
                feeds = load_arrays(inputs)
                runnable = _runnable(self.compiled, dump, feeds, nodes)
                skipped |= set(nodes) - runnable
                dtypes = {name: str(dump.layout(name)[0]) for name in dump.names()} if runnable else {}
                for batch in _batches(self.compiled, runnable, dump):
                    outputs = self.run_alone(batch, dump, dtypes, feeds)
                    for tensor in list(outputs):
                        node, value = outputs.pop(tensor)
                        measured.setdefault(node, []).append(local_metrics(dump.read(tensor), value))
                        del value  # judged: dropped before the next output is read
        worst = {node: worst_over(results, LOCAL_METRICS) for node, results in measured.items()}
        log.info("local error of %d nodes; %d left out", len(worst), len(skipped))
        return LocalErrors(worst, tuple(sorted(skipped)))

    def run_alone(self, runnable: set[str], dump: DumpReader, dtypes: Mapping[str, str],
                  feeds: Mapping[str, Any]) -> dict[str, tuple[str, np.ndarray]]:
        """Output tensor -> (node, value) of every runnable node, run alone; `dtypes` are the dump's tensors'
        types."""
        if not runnable:
            return {}
        model = isolate(self.compiled, runnable, dtypes)
        if self.reduced is not None:
            dtype, known = self.reduced
            model = self.backend.reduced_model(model, runnable, dtype,
                                               {**known, **{f"{t}/reference": d for t, d in known.items()}},
                                               self.weights)
        session_feeds = {}
        for value in model.graph.input:
            name = value.name
            session_feeds[name] = (dump.read(name.removesuffix("/reference")) if name.endswith("/reference")
                                   else feeds[name])
        runner = ort_compile.Runner(model.SerializeToString(), ort_compile.unoptimized(self.weights), self.backend,
                                    self.threads).activate()
        owner = {out: node.name for node in graph_nodes(self.compiled.graph) if node.name in runnable
                 for out in node.outputs}
        outputs = runner.infer(session_feeds)
        return {tensor: (owner[tensor], value) for tensor, value in outputs.items()
                if tensor in owner and tensor in dump}


def local_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """LOCAL_METRICS of one pair as `metrics.error_metrics` computes them, but block by block
    (`metrics.block_metrics`, error_only), so memory is the pair plus a few cache-sized blocks instead of four
    float64 copies of it, and each pass runs in the cache. Maxima are exact; sums are added block by block,
    so a norm can differ in its last bits. A pair of different shapes, empty, or holding NaN or an infinity
    goes to `error_metrics` whole, so those conventions stay `metrics.py`'s."""
    metrics = block_metrics(reference, candidate, 0.0, 0.0, error_only=True) if (
        reference.shape == candidate.shape) else None
    if metrics is None:
        metrics = error_metrics(Pair(reference, candidate))
    return {name: metrics[name] for name in LOCAL_METRICS}


def _batches(compiled: onnx.ModelProto, runnable: set[str], dump: DumpReader) -> list[set[str]]:
    """`runnable` in topological order, cut into runs whose fed (dumped) and produced tensors stay within
    LOCAL_BATCH_BYTES; a node larger than that runs alone."""
    batches: list[set[str]] = []
    size = 0
    for node in graph_nodes(compiled.graph):
        if node.name not in runnable:
            continue
        node_bytes = sum(_nbytes(dump, t) for t in {*node.inputs, *node.outputs} if t and t in dump)
        if not batches or size + node_bytes > LOCAL_BATCH_BYTES:
            batches.append(set())
            size = 0
        batches[-1].add(node.name)
        size += node_bytes
    return batches


def _nbytes(dump: DumpReader, name: str) -> int:
    dtype, shape = dump.layout(name)
    return dtype.itemsize * math.prod(shape)


def _runnable(compiled: onnx.ModelProto, dump: DumpReader, feeds: Mapping[str, Any], chosen: Sequence[str]) -> set[str]:
    """Nodes whose activation inputs and outputs the reference dump holds whole."""
    if dump.statistics_only:
        return set()
    nodes = {node.name: node for node in graph_nodes(compiled.graph)}
    constants = {init.name for init in compiled.graph.initializer}
    return {name for name in chosen
            if all(t in feeds or t in dump for t in nodes[name].inputs if t and t not in constants)
            and any(t in dump for t in nodes[name].outputs if t)}

