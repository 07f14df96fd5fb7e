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
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from accubisect.core.accuracy import Tolerance, ValFunc, judge_outputs, load_val_func
from accubisect.core.errors import ConfigError, DumpError
from accubisect.core.metrics import Pair, ShapeMismatch, block_metrics, pair_metrics, worst_over
from accubisect.formats.dump_file import DumpReader
from accubisect.formats.files import read_json, write_atomic, write_json
from accubisect.formats.samples import check_golden_shapes, load_golden
from accubisect.reports.report_html import compare_page
from accubisect.reports.report_text import csv_rows, render_summary
from accubisect.reports.run_context import with_context
from accubisect.stages.graph import load_graph

HISTOGRAM_BINS = 30
WORST_ELEMENTS = 5
log = logging.getLogger(__name__)

DETAIL_FAILING = 8  # failing tensors given details, from the first divergence on in topological order
DETAIL_WORST = 8  # and the tensors worst by mismatch, then cosine, passing or not
WORST_BLOCK = 4096  # elements per block whose maxima bound the worst elements' search


def compare_dumps(reference_dumps: Sequence[str], candidate_dumps: Sequence[str], candidate_graph: str,
                  local_errors: str, golden: Sequence[str], samples: Sequence[str], output_names: Sequence[str],
                  accuracy: Mapping[str, Any], low_precision: str, labels: Sequence[str],
                  context: Mapping[str, Any], report_json: str, report_csv: str, report_html: str,
                  summary: str) -> None:
    """Compare stage entry point; `golden[i]` is "" where sample i has no golden outputs; `labels` name the
    reference and the candidate; the candidate's graph names the nodes; `local_errors` gives each row the
    error its node makes alone on the reference's own tensors; `context` (`context_line`'s arguments) is the
    summary's first line."""
    report = build_report(reference_dumps, candidate_dumps, load_graph(Path(candidate_graph)), labels, golden,
                          samples, output_names, accuracy, low_precision, load_val_func(accuracy.get("val_func")))
    attach_local_errors(report, read_json(local_errors))
    write_json(Path(report_json), report)
    write_atomic(Path(report_csv), csv_rows(report["tensors"]))
    write_atomic(Path(report_html), compare_page(report))
    write_atomic(Path(summary), with_context(context, render_summary(report)))


def attach_local_errors(report: dict[str, Any], local: Mapping[str, Any]) -> None:
    """Each row gets `local`: the error its node makes run alone on the reference's own tensors (None where
    that could not be measured). The rest of its error is inherited from the nodes before it."""
    for row in report["tensors"]:
        row["local"] = local["nodes"].get(row["node"])
    report["local_skipped"] = local["skipped"]


def build_report(reference_dumps: Sequence[str], candidate_dumps: Sequence[str], graph: Mapping[str, Any],
                 labels: Sequence[str], golden: Sequence[str], samples: Sequence[str], output_names: Sequence[str],
                 accuracy: Mapping[str, Any], low_precision: str, val_func: ValFunc | None) -> dict[str, Any]:
    """Every metric of every shared tensor and the verdict per sample, judged; `labels` name the reference
    and the candidate. `val_func` is given loaded: a bundle's comes from its own file, not from sys.path."""
    tolerance = Tolerance.from_config(accuracy)
    report = {
        "reference": labels[0],
        "candidate": labels[1],
        "accuracy": dict(accuracy),
        "low_precision": low_precision,
        "samples": list(samples),
        "statistics_only": _statistics_only([*reference_dumps, *candidate_dumps]),
        "verdicts": judge_samples(reference_dumps, candidate_dumps, golden, samples, output_names, tolerance,
                                  val_func),
        "tensors": measure_tensors(reference_dumps, candidate_dumps, samples, graph, tolerance, low_precision),
    }
    judge_report(report, tolerance)
    attach_details(report, reference_dumps, candidate_dumps, samples, detail_tensors(report, output_names))
    return report


def graph_from_dump(dump: DumpReader) -> dict[str, Any]:
    """What a graph JSON would say, from a dump's own attributes: node, op type and order, no rules."""
    nodes: dict[str, dict[str, Any]] = {}
    for name in dump.names():
        info = dump.info(name)
        if info["role"] == "output":
            node = nodes.setdefault(str(info["node"]), {
                "index": int(info["topo_index"]), "name": str(info["node"]), "op_type": str(info["op_type"]),
                "outputs": [], "rule": None, "rules": [], "original_nodes": []})
            node["outputs"].append(name)
    return {"variant": str(dump.attrs.get("variant", dump.path.name)), "nodes": list(nodes.values())}


def _statistics_only(dumps: Sequence[str]) -> bool:
    kinds = set()
    for path in dumps:
        with DumpReader(Path(path)) as dump:
            kinds.add(dump.statistics_only)
    if len(kinds) > 1:
        raise DumpError("cannot compare a statistics-only dump with a full one; use one dump.statistics_only")
    return kinds == {True}


def measure_tensors(reference_dumps: Sequence[str], candidate_dumps: Sequence[str], samples: Sequence[str],
                    graph: Mapping[str, Any], tolerance: Tolerance, low_precision: str) -> list[dict[str, Any]]:
    """One entry per shared tensor, in the candidate's topological order, with per-sample metrics; a line
    per sample on the job's log, so a long comparison shows it is moving."""
    producers = {out: node for node in graph["nodes"] for out in node["outputs"]}
    rows: dict[str, dict[str, Any]] = {}
    for sample, ref_path, cand_path in zip(samples, reference_dumps, candidate_dumps, strict=True):
        start = time.perf_counter()
        with DumpReader(Path(ref_path)) as ref, DumpReader(Path(cand_path)) as cand:
            shared = [n for n in cand.names() if n in ref and n in producers]
            for name in shared:
                row = rows.setdefault(name, _tensor_row(name, producers[name]))
                row["samples"][sample] = measure_pair(ref.read(name), cand.read(name), tolerance, low_precision)
        log.info("compare %s: %d tensor pair(s) in %.2f s", sample, len(shared), time.perf_counter() - start)
    return sorted(rows.values(), key=lambda row: (row["index"], row["output"]))


def measure_pair(reference: np.ndarray, candidate: np.ndarray, tolerance: Tolerance,
                 low_precision: str) -> dict[str, Any]:
    """Metrics of one tensor pair."""
    try:
        metrics = block_metrics(reference, candidate, tolerance.rtol, tolerance.atol, low_precision)
    except ShapeMismatch as error:
        return {"shape_mismatch": str(error)}
    if metrics is None:  # empty, or a NaN or infinity somewhere: the general path
        metrics = pair_metrics(Pair(reference, candidate), tolerance.rtol, tolerance.atol, low_precision)
    return metrics


def detail_tensors(report: Mapping[str, Any], output_names: Sequence[str] = ()) -> set[str]:
    """The tensors whose details a person reads, from a judged report: the first divergence's compared
    inputs and the first DETAIL_FAILING failing tensors from it on, the largest local error, the model
    outputs, and the DETAIL_WORST tensors worst by mismatch, then cosine (NaN worst), so that a report where
    everything passes still shows where it comes closest to failing."""
    rows = report["tensors"]
    chosen = {row["tensor"] for row in rows if row["tensor"] in set(output_names)}
    failing = [row for row in rows if not row["passed"]]
    chosen.update(row["tensor"] for row in failing[:DETAIL_FAILING])
    if failing:
        compared = {row["tensor"] for row in rows}
        chosen.update(name for name in failing[0]["inputs"] if name in compared)
    if report.get("worst_local"):
        chosen.add(report["worst_local"]["tensor"])

    def badness(row: Mapping[str, Any]) -> tuple[float, float]:
        mismatch, cosine = row["worst"].get("mismatch", math.inf), row["worst"].get("cosine", -math.inf)
        return (math.inf if math.isnan(mismatch) else mismatch, math.inf if math.isnan(cosine) else -cosine)

    chosen.update(row["tensor"] for row in sorted(rows, key=badness, reverse=True)[:DETAIL_WORST])
    return chosen


def attach_details(report: dict[str, Any], reference_dumps: Sequence[str], candidate_dumps: Sequence[str],
                   samples: Sequence[str], chosen: set[str]) -> None:
    """Each row's `details` per sample (histograms and worst elements), read again from the dumps for the
    `chosen` tensors only; empty for the rest."""
    for row in report["tensors"]:
        row["details"] = {}
    wanted = [row for row in report["tensors"] if row["tensor"] in chosen]
    for sample, ref_path, cand_path in zip(samples, reference_dumps, candidate_dumps, strict=True):
        with DumpReader(Path(ref_path)) as ref, DumpReader(Path(cand_path)) as cand:
            for row in wanted:
                if sample in row["samples"] and "shape_mismatch" not in row["samples"][sample]:
                    row["details"][sample] = tensor_detail(Pair(ref.read(row["tensor"]), cand.read(row["tensor"])))


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


def _tensor_row(name: str, node: Mapping[str, Any]) -> dict[str, Any]:
    return {"tensor": name, "index": node["index"], "output": node["outputs"].index(name), "node": node["name"],
            "op_type": node["op_type"], "rule": node["rule"], "rules": node["rules"],
            "original_nodes": node["original_nodes"], "inputs": node.get("inputs", []), "samples": {}}


def judge_report(report: dict[str, Any], tolerance: Tolerance) -> dict[str, Any]:
    """Applies `tolerance` to the metrics a report holds: every verdict, the first divergence, and the
    worst and mean of each metric over samples. Changing rtol/atol changes the mismatch metric itself,
    so that needs a new comparison; ntol and cosine can be judged again at will."""
    measured = report["accuracy"]
    if (tolerance.rtol, tolerance.atol) != (measured["rtol"], measured["atol"]):
        raise ConfigError(f"rtol/atol define the mismatch metric, measured with rtol={measured['rtol']}, "
                          f"atol={measured['atol']}; re-run the comparison to change them")
    for row in report["tensors"]:
        for result in row["samples"].values():
            result["reasons"] = tolerance.failures(result)
            result["passed"] = not result["reasons"]
        results = list(row["samples"].values())
        row["passed"] = all(result["passed"] for result in results)
        row["worst"], row["mean"] = _over_samples(results)
    for verdict in report["verdicts"]:
        for side in ("candidate", "reference"):
            if side in verdict and not report["accuracy"].get("val_func"):
                _judge_outputs_again(verdict[side], tolerance)
    report["accuracy"] = {**measured, "ntol": tolerance.ntol, "cosine": tolerance.cosine}
    report["passed"] = all(v["candidate"]["passed"] for v in report["verdicts"])
    report["first_divergence"] = first_divergence(report["tensors"])
    report["worst_local"] = worst_local_error(report["tensors"])
    return report


def worst_local_error(tensors: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The tensor whose mismatch grows most over the worst mismatch among its node's compared inputs:
    where error is made rather than inherited (as far as the shared tensors can tell)."""
    mismatch = {row["tensor"]: row["worst"].get("mismatch", 0.0) for row in tensors}
    growth = [(mismatch[row["tensor"]] - max((mismatch[t] for t in row["inputs"] if t in mismatch), default=0.0),
               row["tensor"]) for row in tensors]
    best = max(growth, default=(0.0, None))
    return {"tensor": best[1], "growth": best[0]} if best[0] > 0 else None


def _judge_outputs_again(verdict: dict[str, Any], tolerance: Tolerance) -> None:
    for row in verdict["outputs"].values():
        row["reasons"] = tolerance.failures(row)
        row["passed"] = not row["reasons"]
    verdict["reasons"] = [f"{name}: {reason}" for name, row in verdict["outputs"].items() for reason in row["reasons"]]
    verdict["passed"] = not verdict["reasons"]


def _over_samples(results: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    worst = worst_over(results)
    mean = {m: sum(r[m] for r in results) / len(results) for m in worst}  # np.mean cost 10 us a call
    return worst, mean


def first_divergence(tensors: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    for row in tensors:
        if not row["passed"]:
            failing = [sample for sample, result in row["samples"].items() if not result["passed"]]
            keys = ("tensor", "index", "node", "op_type", "rule", "rules", "original_nodes", "worst")
            return {**{key: row[key] for key in keys}, "failing_samples": failing}
    return None


def judge_samples(reference_dumps: Sequence[str], candidate_dumps: Sequence[str], golden: Sequence[str],
                  samples: Sequence[str], output_names: Sequence[str], tolerance: Tolerance,
                  val_func) -> list[dict[str, Any]]:
    """Per sample: the candidate's outputs (and the reference's, when golden outputs exist) judged
    against the golden outputs, or against the reference run when there are none."""
    verdicts = []
    for sample, ref_path, cand_path, golden_path in zip(samples, reference_dumps, candidate_dumps, golden,
                                                        strict=True):
        ref_outputs, cand_outputs = _outputs(ref_path, output_names), _outputs(cand_path, output_names)
        if golden_path:
            truth = load_golden(Path(golden_path))
            check_golden_shapes(Path(golden_path), truth, ref_outputs)
            verdicts.append({"sample": sample, "against": "golden",
                             "candidate": judge_outputs(truth, cand_outputs, tolerance, val_func),
                             "reference": judge_outputs(truth, ref_outputs, tolerance, val_func)})
        else:
            verdicts.append({"sample": sample, "against": "reference",
                             "candidate": judge_outputs(ref_outputs, cand_outputs, tolerance, val_func)})
    return verdicts


def _outputs(dump: str, names: Sequence[str]) -> dict[str, Any]:
    with DumpReader(Path(dump)) as reader:
        return {name: reader.read_output(name) for name in names}
