"""The compare stage: two variants' dumps side by side, tensor by tensor, and the model outputs judged.

Dumps are joined on the tensor names both hold (names survive fusion at fused-node boundaries) and walked
in the candidate's topological order, one tensor at a time. Each row names the candidate's compiled node,
the original nodes it absorbed and the rule that made it (from the graph JSON). The first failing tensor
in that order is where the error first appears.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accubisect.accuracy import Tolerance, compare_arrays, judge_outputs, load_val_func
from accubisect.dump import DumpReader
from accubisect.files import atomic_path, write_atomic, write_json
from accubisect.graph import load_graph
from accubisect.samples import load_golden

METRICS = ("cosine", "max_abs", "mean_abs", "max_rel", "rmse", "mismatch", "nan_ref", "nan_cand", "inf_ref",
           "inf_cand")
WORST = {"cosine": min, "nan_ref": max, "nan_cand": max, "inf_ref": max, "inf_cand": max}  # others: max


def compare_dumps(reference_dumps: Sequence[str], candidate_dumps: Sequence[str], reference_graph: str,
                  candidate_graph: str, golden: Sequence[str], samples: Sequence[str], output_names: Sequence[str],
                  accuracy: Mapping[str, Any], report_json: str, report_csv: str, summary: str) -> None:
    """Compare stage entry point; `golden[i]` is "" where sample i has no golden outputs."""
    tolerance = Tolerance.from_config(accuracy)
    graph = load_graph(Path(candidate_graph))
    tensors = compare_tensors(reference_dumps, candidate_dumps, samples, graph, tolerance)
    verdicts = judge_samples(reference_dumps, candidate_dumps, golden, samples, output_names, tolerance,
                             load_val_func(accuracy.get("val_func")))
    report = {
        "reference": load_graph(Path(reference_graph))["variant"],
        "candidate": graph["variant"],
        "accuracy": dict(accuracy),
        "samples": list(samples),
        "verdicts": verdicts,
        "passed": all(v["candidate"]["passed"] for v in verdicts),
        "first_divergence": first_divergence(tensors),
        "tensors": tensors,
    }
    write_json(Path(report_json), report)
    write_atomic(Path(report_csv), csv_rows(tensors))
    text = render_summary(report)
    write_atomic(Path(summary), text)


def compare_tensors(reference_dumps: Sequence[str], candidate_dumps: Sequence[str], samples: Sequence[str],
                    graph: Mapping[str, Any], tolerance: Tolerance) -> list[dict[str, Any]]:
    """One entry per shared tensor, in the candidate's topological order, with per-sample metrics."""
    producers = {out: node for node in graph["nodes"] for out in node["outputs"]}
    rows: dict[str, dict[str, Any]] = {}
    for sample, ref_path, cand_path in zip(samples, reference_dumps, candidate_dumps, strict=True):
        with DumpReader(Path(ref_path)) as ref, DumpReader(Path(cand_path)) as cand:
            for name in (n for n in cand.names() if n in ref and n in producers):
                row = rows.setdefault(name, _tensor_row(name, producers[name]))
                row["samples"][sample] = compare_arrays(ref.read(name), cand.read(name), tolerance)
    ordered = sorted(rows.values(), key=lambda row: (row["index"], row["output"]))
    for row in ordered:
        results = list(row["samples"].values())
        row["passed"] = all(result["passed"] for result in results)
        row["worst"] = {m: WORST.get(m, max)(r[m] for r in results) for m in METRICS if all(m in r for r in results)}
    return ordered


def _tensor_row(name: str, node: Mapping[str, Any]) -> dict[str, Any]:
    return {"tensor": name, "index": node["index"], "output": node["outputs"].index(name), "node": node["name"],
            "op_type": node["op_type"], "rule": node["rule"], "rules": node["rules"],
            "original_nodes": node["original_nodes"], "samples": {}}


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
            verdicts.append({"sample": sample, "against": "golden",
                             "candidate": judge_outputs(truth, cand_outputs, tolerance, val_func),
                             "reference": judge_outputs(truth, ref_outputs, tolerance, val_func)})
        else:
            verdicts.append({"sample": sample, "against": "reference",
                             "candidate": judge_outputs(ref_outputs, cand_outputs, tolerance, val_func)})
    return verdicts


def _outputs(dump: str, names: Sequence[str]) -> dict[str, Any]:
    with DumpReader(Path(dump)) as reader:
        return {name: reader.read(name) for name in names}


def csv_rows(tensors: Sequence[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["index", "tensor", "node", "op_type", "rule", "original_nodes", "sample", *METRICS, "passed"])
    for row in tensors:
        for sample, result in row["samples"].items():
            writer.writerow([row["index"], row["tensor"], row["node"], row["op_type"], row["rule"] or "",
                             " ".join(row["original_nodes"]), sample,
                             *(_number(result.get(m, "")) for m in METRICS), result["passed"]])
    return buffer.getvalue()


def _number(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def render_summary(report: Mapping[str, Any], table_rows: int = 12) -> str:
    """The short text a user reads on the terminal."""
    verdicts = report["verdicts"]
    failing = [v["sample"] for v in verdicts if not v["candidate"]["passed"]]
    lines = [f"compare {report['candidate']} vs {report['reference']} on {len(verdicts)} sample(s), "
             f"outputs judged against {verdicts[0]['against'] if verdicts else 'nothing'}: "
             + (f"FAIL on {len(failing)} of {len(verdicts)} ({', '.join(failing)})" if failing else "PASS")]
    broken_reference = [v["sample"] for v in verdicts if "reference" in v and not v["reference"]["passed"]]
    if broken_reference:
        lines.append(f"the {report['reference']} variant fails too on {', '.join(broken_reference)}")
    lines += _divergence_lines(report["first_divergence"])
    lines.append("")
    lines += _table(report["tensors"], report["first_divergence"], table_rows)
    return "\n".join(lines) + "\n"


def _divergence_lines(divergence: Mapping[str, Any] | None) -> list[str]:
    if divergence is None:
        return ["no compared tensor fails the tolerances"]
    worst = divergence["worst"]
    origin = ", ".join(divergence["original_nodes"]) or "no original node"
    return [
        f"error first appears at tensor '{divergence['tensor']}' made by node '{divergence['node']}' "
        f"({divergence['op_type']}), rule {divergence['rule'] or 'none (not a fused node)'}",
        f"  original nodes: {origin}",
        f"  worst over samples: max abs {worst.get('max_abs', math.nan):.3g}, "
        f"max rel {worst.get('max_rel', math.nan):.3g}, cosine {worst.get('cosine', math.nan):.8f}, "
        f"mismatch {worst.get('mismatch', math.nan):.2%}",
    ]


def _table(tensors: Sequence[Mapping[str, Any]], divergence: Mapping[str, Any] | None, limit: int) -> list[str]:
    stop = len(tensors) if divergence is None else next(i for i, t in enumerate(tensors) if not t["passed"]) + 3
    shown = tensors[max(0, stop - limit):stop]
    lines = [f"{'#':>4}  {'tensor':<28} {'op_type':<22} {'rule':<22} {'cosine':>10} {'max_abs':>9} {'max_rel':>9}"
             f" {'mismatch':>8}  verdict"]
    for row in shown:
        worst = row["worst"]
        lines.append(f"{row['index']:>4}  {row['tensor'][:28]:<28} {row['op_type'][:22]:<22} "
                     f"{(row['rule'] or '-')[:22]:<22} {worst.get('cosine', math.nan):>10.7f} "
                     f"{worst.get('max_abs', math.nan):>9.2e} {worst.get('max_rel', math.nan):>9.2e} "
                     f"{worst.get('mismatch', math.nan):>8.2%}  {'ok' if row['passed'] else 'FAIL'}")
    if len(shown) < len(tensors):
        lines.append(f"      ... {len(tensors)} tensors in all; see report.csv")
    return lines

