"""`snakemake precision_bisect`: the fewest nodes to keep in fp32 so the model passes, the rest reduced.

Candidates are the compiled nodes the configured mode runs in reduced precision; a probe keeps a set of
them in fp32 and runs the reduced model as the backend runs it (emulated on the CPU, native on a GPU).
The search is the shared one (`bisection.py`), guided by each node's local error and by overflow in the
reduced run. The answer is written as the seeds' deployable files: keep_dtype.txt, modify_mixlist.json
and the finalized mixed-precision model.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from accubisect import ort_compile
from accubisect.backends import Backend, backend_named
from accubisect.bisection import (
    PreconditionError,
    candidate_passes,
    compare_verdict,
    final_verdict,
    judge_probe,
    judge_session,
    known_verdicts,
    probes_by_round,
    rows_by,
    worst_local_error,
    write_plan,
)
from accubisect.files import atomic_path, read_json, write_atomic, write_json
from accubisect.finalize import finalize
from accubisect.graph import load_graph
from accubisect.model import load_model
from accubisect.report_html import bisect_page
from accubisect.strategy import NOT_AMONG_CANDIDATES


def rank_nodes(reduced: Sequence[str], report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Most suspect first: the largest error made locally (on exact inputs), then the largest fraction of
    values beyond the low type's range in the reduced run, then topological order."""
    rows = rows_by(report, "node", reduced)
    evidence = [{"name": name, "local_error": worst_local_error(rows[name]),
                 "overflow": max((row["worst"].get("overflow_cand", 0.0) for row in rows[name]), default=0.0)}
                for name in reduced]
    return sorted(evidence, key=lambda e: (-(e["local_error"] or 0.0), -e["overflow"]))  # stable: topological


def plan_round(assignment: str, compare_report: str, verdicts: Sequence[str], plan: str, round_index: int,
               parallel: int, min_pass_fraction: float) -> None:
    """Checkpoint job: the next round's probes (sets of nodes kept in fp32), or the answer."""
    report = read_json(compare_report)
    ranking = rank_nodes(read_json(assignment)["reduced"], report)
    not_the_cause = ("the model fails even in fp32 against the golden outputs: precision is not the cause "
                     "(try fusion_bisect)")
    known = known_verdicts(candidate_passes(report, min_pass_fraction, not_the_cause), verdicts)
    write_plan(plan, "precision_bisect", "node", round_index, ranking, known, parallel)


def reduced_session(compiled_model: str, assignment: Mapping[str, Any], kept_fp32: Sequence[str], backend: Backend):
    model = backend.reduced_model(load_model(Path(compiled_model)), set(assignment["reduced"]) - set(kept_fp32),
                                  assignment["dtype"], assignment["dtypes"])
    return ort_compile.open_session(model.SerializeToString(), ort_compile.CompileOptions("off"), backend)


def run_probe(compiled_model: str, assignment: str, sample_inputs: Sequence[str], references: Sequence[str],
              off: Sequence[str], output_names: Sequence[str], accuracy: Mapping[str, Any], backend: str,
              verdict: str) -> None:
    """Probe job: the reduced model with the nodes `off` kept in fp32, judged per sample."""
    start = time.perf_counter()
    session = reduced_session(compiled_model, read_json(assignment), off, backend_named(backend))
    judge_probe(session, sample_inputs, references, output_names, accuracy, off, verdict, start)


def keep_dtype_lines(culprits: Sequence[str], graph: Mapping[str, Any]) -> list[str]:
    """Original node names where a compiled node has them (keep_dtype resolves them through fusion)."""
    nodes = {node["name"]: node for node in graph["nodes"]}
    return [name for culprit in culprits for name in (nodes[culprit]["original_nodes"] or [culprit])]


def mixlist_suggestion(culprits: Sequence[str], reduced: Sequence[str], graph: Mapping[str, Any]) -> list[str]:
    """Op types better moved to the black list as a whole: at least two reduced nodes of the type, and
    every one of them must be kept in fp32 anyway."""
    op_type = {node["name"]: node["op_type"] for node in graph["nodes"]}
    needed, present = Counter(op_type[c] for c in culprits), Counter(op_type[r] for r in reduced)
    return sorted(t for t, count in needed.items() if count >= 2 and count == present[t])


def write_result(plans: Sequence[str], verdicts: Sequence[str], compare_report: str, assignment: str,
                 graph_json: str, compiled_model: str, sample_inputs: Sequence[str], references: Sequence[str],
                 output_names: Sequence[str], accuracy: Mapping[str, Any], backend: str, result_json: str,
                 keep_dtype: str,
                 modify_mixlist: str, finalized_model: str, report_html: str, summary: str) -> None:
    """Final job: every probe, the answer, verified once more, and the deployable files."""
    rounds = [read_json(path) for path in plans]
    final, chosen, graph = rounds[-1], read_json(assignment), load_graph(Path(graph_json))
    answer = final["answer"]
    if answer["status"] == NOT_AMONG_CANDIDATES:
        raise PreconditionError("even with every reduced node in fp32 the model fails: precision is not the cause")
    probes = probes_by_round(rounds, verdicts)
    culprits, moved = answer["culprits"], mixlist_suggestion(answer["culprits"], chosen["reduced"], graph)
    final_model = finalize(load_model(Path(compiled_model)), set(chosen["reduced"]) - set(culprits), chosen["dtype"],
                           chosen["dtypes"])
    with atomic_path(Path(finalized_model)) as temporary:
        onnx.save(final_model, temporary)
    result = {
        "mode": chosen["mode"], "dtype": chosen["dtype"], "candidates": final["candidates"],
        "ranking": final["ranking"],
        "ranking_use": "nodes were searched most suspect first (largest local error on exact inputs, then overflow "
                       "in the reduced run); the first probe kept only the top-ranked node in fp32",
        "probes": probes, "culprits": culprits, "groups": answer["groups"],
        "kept": [name for name in final["candidates"] if name not in culprits],
        "kept_fp32": f"{len(culprits)} of {len(final['candidates'])} nodes",
        "final_verdict": final_verdict(culprits, probes, compare_verdict(read_json(compare_report))),
        "reduced_verdict": compare_verdict(read_json(compare_report)),
        "mixlist_black": moved,
        "finalized": verify_finalized(final_model, chosen["dtype"], sample_inputs, references, output_names, accuracy,
                                      backend_named(backend)),
    }
    write_json(Path(result_json), result)
    write_atomic(Path(keep_dtype), "".join(f"{line}\n" for line in keep_dtype_lines(culprits, graph)))
    write_json(Path(modify_mixlist), {"black-list": {"to-add": moved}})
    write_atomic(Path(report_html), bisect_page(result, "precision_bisect", "keep in fp32"))
    write_atomic(Path(summary), render_summary(result))


def verify_finalized(model: onnx.ModelProto, dtype: str, sample_inputs: Sequence[str], references: Sequence[str],
                     output_names: Sequence[str], accuracy: Mapping[str, Any], backend: Backend) -> dict[str, Any]:
    """The finalized model loads in ORT on the backend and passes the accuracy check; ORT's CPU provider has
    no bf16 kernels, so there a bf16 model is only checked as ONNX."""
    onnx.checker.check_model(model, full_check=True)
    if dtype == "bf16" and backend.provider == "CPUExecutionProvider":
        return {"checked": "onnx.checker only: ONNX Runtime's CPU provider has no bf16 kernels"}
    session = ort_compile.open_session(model.SerializeToString(), ort_compile.CompileOptions("basic"), backend)
    checked = judge_session(session, sample_inputs, references, output_names, accuracy)
    return {"checked": f"loaded and run by ONNX Runtime on {backend.provider}", "passed": checked["passed"],
            "worst": checked["worst"]}


def render_summary(result: Mapping[str, Any]) -> str:
    culprits = result["culprits"]
    if not culprits:
        return f"nothing to bisect: the model passes the accuracy check in {result['mode']} ({result['dtype']})\n"
    before, after = result["reduced_verdict"]["worst"], result["final_verdict"]["worst"]
    change = f"max rel err {before.get('max_rel', math.nan):.2g} → {after.get('max_rel', math.nan):.2g}"
    lines = [f"keep {result['kept_fp32']} in fp32 ({', '.join(culprits)}; {change}); "
             f"{len(result['kept'])} nodes stay in {result['dtype']}. keep_dtype.txt lists them."]
    if result["mixlist_black"]:
        lines.append(f"every reduced {', '.join(result['mixlist_black'])} node must stay fp32: moving the op type to "
                     "the black list (modify_mixlist.json) is the simpler answer")
    finalized = result["finalized"]
    lines.append(f"model.onnx: the finalized mixed-precision model, {finalized['checked']}"
                 + (f", {'passes' if finalized['passed'] else 'FAILS'} the check" if "passed" in finalized else ""))
    rounds = len({probe["round"] for probe in result["probes"]})
    lines.append(f"{len(result['probes'])} probe(s) in {rounds} round(s)")
    return "\n".join(lines) + "\n"
