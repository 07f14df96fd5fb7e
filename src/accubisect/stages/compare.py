"""The compare stage: two variants' dumps side by side, tensor by tensor, and the model outputs judged.

Dumps are joined on the tensor names both hold (names survive fusion at fused-node boundaries) and walked
in the candidate's topological order, one tensor pair in memory at a time. Each row names the candidate's
compiled node, the original nodes it absorbed and the rule that made it (from the graph JSON).

Metrics are computed once; `judge_report` applies the tolerances to them, so a saved report can be judged
again with other thresholds without touching a dump. The first failing tensor is where the error first
appears.

What a person reads tensor by tensor (histograms, worst elements) is made only for the tensors worth
reading (`detail_tensors`: around the first divergence, the largest local error, the model outputs, the
worst few), in a second pass over those tensors alone once every tensor is judged: on the 640x640 detector
the details of every tensor cost as much as all their metrics and made most of the HTML page.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from accubisect.core.accuracy import AccuracyCheck, ValFunc
from accubisect.core.errors import ConfigError, DumpError, ShapeMismatch
from accubisect.core.metrics import Pair, block_metrics, pair_metrics, worst_over
from accubisect.formats.assignment import Assignment
from accubisect.formats.compare_report import CompareReport, Divergence, LocalGrowth, Metrics, SampleVerdict, TensorRow
from accubisect.formats.dump_file import DumpReader, check_comparable, check_same_model
from accubisect.formats.files import write_atomic, write_json
from accubisect.formats.graph_record import GraphNode, GraphRecord
from accubisect.formats.local_errors import LocalErrors
from accubisect.formats.model import load_model
from accubisect.formats.samples import check_golden_shapes, load_golden
from accubisect.formats.step import Step
from accubisect.formats.val_func import load_val_func
from accubisect.reports.graph_view import graph_section
from accubisect.reports.model_explorer import node_data
from accubisect.reports.report_html import compare_links, compare_page, explorer_note
from accubisect.reports.report_text import csv_rows, render_summary, runtime_lines
from accubisect.reports.run_context import PageHeader, with_context

HISTOGRAM_BINS = 30
WORST_ELEMENTS = 5
log = logging.getLogger(__name__)

DETAIL_FAILING = 8  # failing tensors given details, from the first divergence on in topological order
DETAIL_WORST = 8  # and the tensors worst by mismatch, then cosine, passing or not
WORST_BLOCK = 4096  # elements per block whose maxima bound the worst elements' search


@dataclass(frozen=True)
class Compared:
    """What a comparison reads and how it judges: per sample, both variants' dumps and the golden outputs
    ("" where the sample has none); `labels` name the reference and the candidate."""

    reference_dumps: tuple[Path, ...]
    candidate_dumps: tuple[Path, ...]
    golden: tuple[str, ...]
    samples: tuple[str, ...]
    output_names: tuple[str, ...]
    accuracy: Mapping[str, Any]  # the config's accuracy section
    low_precision: str
    labels: tuple[str, ...]

    def dumps(self) -> Iterator[tuple[str, Path, Path]]:
        """(sample, reference dump, candidate dump) per sample."""
        return zip(self.samples, self.reference_dumps, self.candidate_dumps, strict=True)


@dataclass(frozen=True)
class CompareStep(Compared, Step):
    candidate_graph: Path  # names the candidate's nodes
    context: Mapping[str, Any]  # `compare_context`'s values: the summary's first line, the page's header
    report_json: Path
    report_csv: Path
    report_html: Path
    summary: Path
    local_errors: Path | None = None  # each row's node's error made alone on the reference's own tensors
    # (None: the backend cannot run a node alone)
    assignment: Path | None = None  # the precision comparison's: the page marks each node fp32 or reduced
    model: Path | None = None  # the user's model: node_data.json keys its nodes as Model Explorer's adapter does
    node_data: Path | None = None  # each original node's error, for Google's Model Explorer


def compare_dumps(step: CompareStep) -> None:
    """Compare stage entry point."""
    val_func = load_val_func(AccuracyCheck.from_config(step.accuracy))
    graph = GraphRecord.read(step.candidate_graph)
    report = build_report(step, graph, val_func)
    if step.local_errors is not None:
        report = with_local_errors(report, LocalErrors.read(step.local_errors))
    report.write(step.report_json)
    write_atomic(step.report_csv, csv_rows(report.tensors))
    if step.node_data:
        model = load_model(step.model, load_weights=False) if step.model else None
        write_json(step.node_data, node_data(report, model))
    write_atomic(step.report_html, report_page(step, report, graph))
    write_atomic(step.summary, with_context(step.context, render_summary(report, runtime_lines(graph))))


def report_page(step: CompareStep, report: CompareReport, graph: GraphRecord) -> str:
    """The HTML page: its header (the job's context), the graph view (each node's precision where an
    assignment is given, else where the candidate's `graph` records the precision each node ran in), and
    how to open node_data.json (published beside it) in Model Explorer."""
    comparison = step.context.get("comparison", "fusion")
    header = PageHeader.now(step.context, report.accuracy, compare_links(comparison))
    title = "The graph around the first divergence" if report.first_divergence else "The graph where error is largest"
    runtime = {node.name: node.precision for node in graph.nodes if node.precision}
    view = graph_section(report, (), title, Assignment.read(step.assignment) if step.assignment else None,
                         runtime=runtime)
    view += explorer_note(os.path.abspath(step.context["model"]))
    return compare_page(report, header, view)


def with_local_errors(report: CompareReport, local: LocalErrors) -> CompareReport:
    """Each row gets `local`: the error its node makes run alone on the reference's own tensors (None where
    that could not be measured). The rest of its error is inherited from the nodes before it."""
    return replace(report, tensors=tuple(replace(row, local=local.nodes.get(row.node)) for row in report.tensors),
                   local_skipped=local.skipped)


def build_report(comparison: Compared, graph: GraphRecord, val_func: ValFunc | None) -> CompareReport:
    """Every metric of every shared tensor and the verdict per sample, judged; the candidate's `graph` names
    the nodes. `val_func` is given loaded: a bundle's comes from its own file, not from sys.path."""
    check = AccuracyCheck.from_config(comparison.accuracy)
    model_sha256, statistics_only = compared_dumps(comparison)
    measured = CompareReport(
        reference=comparison.labels[0], candidate=comparison.labels[1], accuracy=dict(comparison.accuracy),
        low_precision=comparison.low_precision, samples=comparison.samples, statistics_only=statistics_only,
        verdicts=judge_samples(comparison, check, val_func), tensors=measure_tensors(comparison, graph, check),
        model_sha256=model_sha256)
    report = judge_report(measured, check)
    return with_details(report, comparison, detail_tensors(report, comparison.output_names))


def compared_dumps(comparison: Compared) -> tuple[str, bool]:
    """The sha256 of the one model every dump of `comparison` was made from, each sample's two dumps being
    of that sample, and whether they all hold statistics only; a DumpError naming two files that differ
    otherwise, or saying that statistics-only and full dumps are mixed."""
    first: DumpReader | None = None
    kinds = set()
    for _, ref_path, cand_path in comparison.dumps():
        with DumpReader(ref_path) as ref, DumpReader(cand_path) as cand:
            first = first or ref
            check_same_model(first, ref)
            check_comparable(ref, cand)
            kinds |= {ref.statistics_only, cand.statistics_only}
    if len(kinds) > 1:
        raise DumpError("cannot compare a statistics-only dump with a full one; use one dump.statistics_only")
    return (first.model_sha256 if first else ""), kinds == {True}


def graph_from_dump(dump: DumpReader) -> GraphRecord:
    """What a graph JSON would say, from a dump's own attributes: node, op type and order, no rules."""
    nodes: dict[str, dict[str, Any]] = {}
    for name in dump.names():
        info = dump.info(name)
        if info["role"] == "output":
            node = nodes.setdefault(str(info["node"]), {"index": int(info["topo_index"]),
                                                        "op_type": str(info["op_type"]), "outputs": []})
            node["outputs"].append(name)
    return GraphRecord(str(dump.attrs.get("variant", dump.path.name)), (), tuple(
        GraphNode(node["index"], name, node["op_type"], "", (), tuple(node["outputs"]), (), None, ())
        for name, node in nodes.items()), model_sha256=dump.model_sha256)


def measure_tensors(comparison: Compared, graph: GraphRecord, check: AccuracyCheck) -> tuple[TensorRow, ...]:
    """One row per shared tensor, in the candidate's topological order, with per-sample metrics; a line
    per sample on the job's log, so a long comparison shows it is moving."""
    producers = {out: node for node in graph.nodes for out in node.outputs}
    measured: dict[str, dict[str, Metrics]] = {}
    unfaithful: dict[str, str] = {}  # tensor -> why a dump of it is not the undumped program's
    for sample, ref_path, cand_path in comparison.dumps():
        start = time.perf_counter()
        with DumpReader(ref_path) as ref, DumpReader(cand_path) as cand:
            shared = [n for n in cand.names() if n in ref and n in producers]
            for name in shared:
                measured.setdefault(name, {})[sample] = measure_pair(ref.read(name), cand.read(name), check,
                                                                     comparison.low_precision)
                for side, dump in ((comparison.labels[0], ref), (comparison.labels[1], cand)):
                    if why := dump.info(name).get("unfaithful"):
                        unfaithful.setdefault(name, f"{side} dump of {sample}: {why}")
        log.info("compare %s: %d tensor pair(s) in %.2f s", sample, len(shared), time.perf_counter() - start)
    rows = [replace(_tensor_row(name, producers[name], samples), unfaithful=unfaithful.get(name, ""))
            for name, samples in measured.items()]
    return tuple(sorted(rows, key=lambda row: (row.index, row.output)))


def measure_pair(reference: np.ndarray, candidate: np.ndarray, check: AccuracyCheck,
                 low_precision: str) -> dict[str, Any]:
    """Metrics of one tensor pair."""
    try:
        metrics = block_metrics(reference, candidate, check.rtol, check.atol, low_precision)
    except ShapeMismatch as error:
        return {"shape_mismatch": str(error)}
    if metrics is None:  # empty, or a NaN or infinity somewhere: the general path
        metrics = pair_metrics(Pair(reference, candidate), check.rtol, check.atol, low_precision)
    return metrics


def detail_tensors(report: CompareReport, output_names: Sequence[str] = ()) -> set[str]:
    """The tensors whose details a person reads, from a judged report: the first divergence's compared
    inputs and the first DETAIL_FAILING failing tensors from it on, the largest local error, the model
    outputs, and the DETAIL_WORST tensors worst by mismatch, then cosine (NaN worst), so that a report where
    everything passes still shows where it comes closest to failing."""
    rows = report.tensors
    chosen = {row.tensor for row in rows if row.tensor in set(output_names)}
    failing = [row for row in rows if not row.passed]
    chosen.update(row.tensor for row in failing[:DETAIL_FAILING])
    if failing:
        compared = {row.tensor for row in rows}
        chosen.update(name for name in failing[0].inputs if name in compared)
    if report.worst_local:
        chosen.add(report.worst_local.tensor)

    def badness(row: TensorRow) -> tuple[float, float]:
        mismatch, cosine = row.worst.get("mismatch", math.inf), row.worst.get("cosine", -math.inf)
        return (math.inf if math.isnan(mismatch) else mismatch, math.inf if math.isnan(cosine) else -cosine)

    chosen.update(row.tensor for row in sorted(rows, key=badness, reverse=True)[:DETAIL_WORST])
    return chosen


def with_details(report: CompareReport, comparison: Compared, chosen: set[str]) -> CompareReport:
    """Each row's `details` per sample (histograms and worst elements), read again from the dumps for the
    `chosen` tensors only; empty for the rest."""
    wanted = [row for row in report.tensors if row.tensor in chosen]
    details: dict[str, dict[str, Any]] = {row.tensor: {} for row in wanted}
    for sample, ref_path, cand_path in comparison.dumps():
        with DumpReader(ref_path) as ref, DumpReader(cand_path) as cand:
            for row in wanted:
                if sample in row.samples and "shape_mismatch" not in row.samples[sample]:
                    details[row.tensor][sample] = tensor_detail(Pair(ref.read(row.tensor), cand.read(row.tensor)))
    return replace(report, tensors=tuple(replace(row, details=details.get(row.tensor, {})) for row in report.tensors))


def tensor_detail(pair: Pair) -> dict[str, Any]:
    """Histograms of both sides over shared bins, and the elements with the largest error (NaN first; of
    equal errors, the first)."""
    low, high = _finite_range(pair)
    edges = np.linspace(low, high if high > low else low + 1.0, HISTOGRAM_BINS + 1)
    ranked = pair.error if pair.finite or not np.isnan(pair.error).any() else np.where(
        np.isnan(pair.error), np.inf, pair.error)
    worst = largest(ranked, min(WORST_ELEMENTS, pair.size))
    return {
        "edges": edges.tolist(),
        "reference_counts": _histogram(pair.ref, edges, pair.finite),
        "candidate_counts": _histogram(pair.got, edges, pair.finite),
        "worst_elements": [{"index": [int(i) for i in np.unravel_index(flat, pair.shape)],
                            "reference": float(pair.ref[flat]), "candidate": float(pair.got[flat]),
                            "abs_error": float(pair.error[flat])} for flat in worst],
    }


def largest(values: np.ndarray, count: int) -> np.ndarray:
    """Flat indices of the `count` largest of `values` (no NaN), largest first, equal values by index. The
    `count`-th largest block maximum bounds them from below, so only a few blocks' elements are sorted:
    a full partition of a large tensor costs more than all its metrics."""
    if count == 0:
        return np.array([], np.intp)
    if values.size <= count * WORST_BLOCK:
        chosen = np.arange(values.size)
    else:
        maxima = np.maximum.reduceat(values, np.arange(0, values.size, WORST_BLOCK))
        bound = np.partition(maxima, maxima.size - count)[maxima.size - count]
        chosen = np.concatenate([np.flatnonzero(values > bound), np.flatnonzero(values == bound)[:count]])
    return chosen[np.lexsort((chosen, -values[chosen]))[:count]]


def _histogram(values: np.ndarray, edges: np.ndarray, finite: bool) -> list[int]:
    """Counts over `edges`, equal-width bins spanning every finite value. Where every value is finite the bin
    is found by arithmetic alone, 3x faster than numpy's histogram (which sorts the values when given edges,
    and checks each against its bin's edges when given a range); a value within rounding of an inner edge
    may then count in the bin beside it, which a histogram drawn for a person does not show."""
    if edges[0] == edges[-1]:  # a range too narrow to widen (numpy would widen it by ±0.5)
        return np.histogram(values, edges)[0].tolist()
    if not finite:  # NaN and infinities fall outside the bins
        return np.histogram(values, HISTOGRAM_BINS, (edges[0], edges[-1]))[0].tolist()
    position = np.subtract(values, edges[0])
    position *= HISTOGRAM_BINS / (edges[-1] - edges[0])
    bins = position.astype(np.intp)
    np.minimum(bins, HISTOGRAM_BINS - 1, out=bins)  # the largest value closes the last bin
    return np.bincount(bins, minlength=HISTOGRAM_BINS).tolist()


def _finite_range(pair: Pair) -> tuple[float, float]:
    """Smallest and largest finite value on either side; (0, 1) when there is none."""
    if pair.finite:
        if pair.size == 0:
            return 0.0, 1.0
        return min(pair.bounds("ref")[0], pair.bounds("got")[0]), max(pair.bounds("ref")[1], pair.bounds("got")[1])
    bounds = []
    for values in (pair.ref, pair.got):
        finite = values if np.isfinite(values).all() else values[np.isfinite(values)]
        if finite.size:
            bounds.append((float(finite.min()), float(finite.max())))
    return (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else (0.0, 1.0)


def _tensor_row(name: str, node: GraphNode, samples: Mapping[str, Metrics]) -> TensorRow:
    return TensorRow(name, node.index, node.outputs.index(name), node.name, node.op_type, node.rule, node.rules,
                     node.original_nodes, node.inputs, samples)


def judge_report(report: CompareReport, check: AccuracyCheck) -> CompareReport:
    """`report` judged by `check`, as a new report: every verdict, the first divergence, and the worst and
    mean of each metric over samples; it passes as the check passes its samples (`min_pass_fraction`).
    Changing rtol/atol changes the mismatch metric itself, so that needs a new comparison; ntol and cosine
    can be judged again at will."""
    measured = report.accuracy
    if (check.rtol, check.atol) != (measured["rtol"], measured["atol"]):
        raise ConfigError(f"rtol/atol define the mismatch metric, measured with rtol={measured['rtol']}, "
                          f"atol={measured['atol']}; re-run the comparison to change them")
    rows = tuple(_judge_row(row, check) for row in report.tensors)
    verdicts = report.verdicts if measured.get("val_func") else tuple(
        replace(v, candidate=_judge_outputs_again(v.candidate, check),
                reference=None if v.reference is None else _judge_outputs_again(v.reference, check))
        for v in report.verdicts)
    passed = check.passes([v.candidate["passed"] for v in verdicts])
    return replace(report, accuracy={**measured, "ntol": check.ntol, "cosine": check.cosine},
                   verdicts=verdicts, tensors=rows, passed=passed,
                   first_divergence=first_divergence(rows), worst_local=worst_local_error(rows))


def _judge_row(row: TensorRow, check: AccuracyCheck) -> TensorRow:
    samples = {sample: _judged(result, check) for sample, result in row.samples.items()}
    results = list(samples.values())
    worst = worst_over(results)
    mean = {m: sum(r[m] for r in results) / len(results) for m in worst}  # np.mean cost 10 us a call
    return replace(row, samples=samples, passed=all(result["passed"] for result in results), worst=worst, mean=mean)


def _judged(metrics: Metrics, check: AccuracyCheck) -> dict[str, Any]:
    reasons = check.failures(metrics)
    return {**metrics, "reasons": reasons, "passed": not reasons}


def _judge_outputs_again(verdict: Mapping[str, Any], check: AccuracyCheck) -> dict[str, Any]:
    outputs = {name: _judged(row, check) for name, row in verdict["outputs"].items()}
    reasons = [f"{name}: {reason}" for name, row in outputs.items() for reason in row["reasons"]]
    return {**verdict, "outputs": outputs, "reasons": reasons, "passed": not reasons}


def worst_local_error(tensors: Sequence[TensorRow]) -> LocalGrowth | None:
    """The tensor whose mismatch grows most over the worst mismatch among its node's compared inputs:
    where error is made rather than inherited (as far as the shared tensors can tell)."""
    mismatch = {row.tensor: row.worst.get("mismatch", 0.0) for row in tensors}
    growth = [(mismatch[row.tensor] - max((mismatch[t] for t in row.inputs if t in mismatch), default=0.0),
               row.tensor) for row in tensors]
    best = max(growth, default=(0.0, None))
    return LocalGrowth(best[1], best[0]) if best[0] > 0 else None


def first_divergence(tensors: Sequence[TensorRow]) -> Divergence | None:
    return next((Divergence.of(row) for row in tensors if not row.passed), None)


def judge_samples(comparison: Compared, check: AccuracyCheck, val_func: ValFunc | None) -> tuple[SampleVerdict, ...]:
    """Per sample: the candidate's outputs (and the reference's, when golden outputs exist) judged
    against the golden outputs, or against the reference run when there are none."""
    verdicts = []
    for (sample, ref_path, cand_path), golden_path in zip(comparison.dumps(), comparison.golden, strict=True):
        ref_outputs = _outputs(ref_path, comparison.output_names)
        cand_outputs = _outputs(cand_path, comparison.output_names)
        if golden_path:
            truth = load_golden(Path(golden_path))
            check_golden_shapes(Path(golden_path), truth, ref_outputs)
            verdicts.append(SampleVerdict(sample, "golden", check.judge_outputs(truth, cand_outputs, val_func),
                                          check.judge_outputs(truth, ref_outputs, val_func)))
        else:
            verdicts.append(SampleVerdict(sample, "reference",
                                          check.judge_outputs(ref_outputs, cand_outputs, val_func)))
    return tuple(verdicts)


def _outputs(dump: Path, names: Sequence[str]) -> dict[str, Any]:
    with DumpReader(dump) as reader:
        return {name: reader.read_output(name) for name in names}
