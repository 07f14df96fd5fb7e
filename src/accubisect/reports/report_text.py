"""The compare report as text: the CSV table and the short summary printed on the terminal."""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.metrics import METRICS, local_error
from accubisect.formats.compare_report import CompareReport, Divergence, TensorRow
from accubisect.formats.graph_record import GraphRecord


def csv_rows(tensors: Sequence[TensorRow]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["index", "tensor", "node", "op_type", "rule", "original_nodes", "sample", *METRICS, "passed"])
    for row in tensors:
        for sample, result in row.samples.items():
            writer.writerow([row.index, row.tensor, row.node, row.op_type, row.rule or "", " ".join(row.original_nodes),
                             sample,
                             *(_number(result.get(m, "")) for m in METRICS), result["passed"]])
    return buffer.getvalue()


def _number(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def render_summary(report: CompareReport, runtime: Sequence[str] = (), table_rows: int = 12) -> str:
    """The short text a user reads on the terminal; `runtime`: lines on what the candidate's backend ran
    (`runtime_lines`)."""
    verdicts = report.verdicts
    lines = [f"compare {report.candidate} vs {report.reference} on {len(verdicts)} sample(s), "
             f"outputs judged against {verdicts[0].against if verdicts else 'nothing'}: {_verdict(report)}"]
    broken_reference = [v.sample for v in verdicts if v.reference is not None and not v.reference["passed"]]
    if broken_reference:
        lines.append(f"the {report.reference} variant fails too on {', '.join(broken_reference)}")
    lines += _divergence_lines(report.first_divergence)
    lines += runtime
    lines += _unfaithful_lines(report)
    lines += _precision_lines(report)
    lines.append("")
    lines += _table(report.tensors, report.first_divergence, table_rows)
    return "\n".join(lines) + "\n"



def runtime_lines(graph: GraphRecord, shown: int = 4) -> list[str]:
    """What a backend that reports its kernels ran the candidate with: the kernels by how many nodes use
    them (the ISA is in their names: brgemm_avx512_amx_bf16) and the nodes per runtime precision."""
    kernels = Counter(node.kernel for node in graph.nodes if node.kernel and not node.kernel.startswith("unknown"))
    if not kernels:
        return []
    precisions = Counter(node.precision for node in graph.nodes if node.precision)
    return [f"kernels: {', '.join(f'{kernel} x{count}' for kernel, count in kernels.most_common(shown))}"
            f"{', ...' if len(kernels) > shown else ''}; nodes by runtime precision: "
            f"{', '.join(f'{precision} {count}' for precision, count in precisions.most_common())}"]


def _unfaithful_lines(report: CompareReport) -> list[str]:
    """Tensors whose dump ran another program than the undumped one: their rows are not the program's."""
    unfaithful = [row for row in report.tensors if row.unfaithful]
    if not unfaithful:
        return []
    return [f"{len(unfaithful)} tensor(s) NOT FAITHFUL (their dump ran otherwise than the undumped program), "
            f"first {unfaithful[0].tensor}: {unfaithful[0].unfaithful}"]


def _verdict(report: CompareReport) -> str:
    """PASS or FAIL as the check decides (`report.passed`), the failing samples named; below a
    `min_pass_fraction` of 1 the fraction too, since a PASS may then have failing samples."""
    failing = [v.sample for v in report.verdicts if not v.candidate["passed"]]
    fraction, total = AccuracyCheck.from_config(report.accuracy).min_pass_fraction, len(report.verdicts)
    if report.passed:
        return (f"PASS on {total - len(failing)} of {total}, {', '.join(failing)} failing "
                f"(accuracy.min_pass_fraction {fraction:g})") if failing else "PASS"
    allowed = f", more than accuracy.min_pass_fraction {fraction:g} allows" if fraction < 1 else ""
    return f"FAIL on {len(failing)} of {total} ({', '.join(failing)}){allowed}"


def _precision_lines(report: CompareReport, shown: int = 3) -> list[str]:
    """Tensors beyond the low type's range in the candidate run, and the nodes that make most error
    themselves (run alone on the reference's tensors)."""
    if report.local_skipped is None:
        return []
    dtype = report.low_precision
    overflowing = [row.tensor for row in report.tensors if row.worst.get("overflow_cand", 0) > 0]
    lines = [f"{len(overflowing)} tensor(s) reach {dtype}'s range in the {report.candidate} run"
             + (f", first: {overflowing[0]}" if overflowing else "")]
    local = sorted((row for row in report.tensors if row.local), key=lambda row: -local_error(row.local))[:shown]
    lines += [f"  node {row.node} ({row.op_type}): relative error {row.local['rel_euclidean']:.3g} made "
              f"itself on exact inputs, {row.worst.get('rel_euclidean', math.nan):.3g} with what it inherits"
              for row in local]
    return lines


def _divergence_lines(divergence: Divergence | None) -> list[str]:
    if divergence is None:
        return ["no compared tensor fails the tolerances"]
    worst = divergence.worst
    origin = ", ".join(divergence.original_nodes) or "no original node"
    return [
        f"error first appears at tensor '{divergence.tensor}' made by node '{divergence.node}' "
        f"({divergence.op_type}), rule {divergence.rule or 'none (not a fused node)'}",
        f"  original nodes: {origin}",
        f"  worst over samples: max abs {worst.get('max_abs', math.nan):.3g}, "
        f"max rel {worst.get('max_rel', math.nan):.3g}, cosine {worst.get('cosine', math.nan):.8f}, "
        f"mismatch {worst.get('mismatch', math.nan):.2%}",
    ]


def _table(tensors: Sequence[TensorRow], divergence: Divergence | None, limit: int) -> list[str]:
    stop = len(tensors) if divergence is None else next(i for i, t in enumerate(tensors) if not t.passed) + 3
    shown = tensors[max(0, stop - limit):stop]
    lines = [f"{'#':>4}  {'tensor':<28} {'op_type':<22} {'rule':<22} {'cosine':>10} {'max_abs':>9} {'max_rel':>9}"
             f" {'mismatch':>8}  verdict"]
    for row in shown:
        worst = row.worst
        lines.append(f"{row.index:>4}  {row.tensor[:28]:<28} {row.op_type[:22]:<22} "
                     f"{(row.rule or '-')[:22]:<22} {worst.get('cosine', math.nan):>10.7f} "
                     f"{worst.get('max_abs', math.nan):>9.2e} {worst.get('max_rel', math.nan):>9.2e} "
                     f"{worst.get('mismatch', math.nan):>8.2%}  {'ok' if row.passed else 'FAIL'}")
    if len(shown) < len(tensors):
        lines.append(f"      ... {len(tensors)} tensors in all; see report.csv")
    return lines

