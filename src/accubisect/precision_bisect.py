"""`snakemake precision_bisect`: the fewest nodes to keep in fp32 so the model passes, the rest reduced.

Candidates are the compiled nodes the configured mode runs in reduced precision; a probe keeps a set of
them in fp32 and runs the reduced model as the backend runs it (emulated on the CPU, native on a GPU).
The search is the shared one (`bisection.py`), guided by each node's local error and by overflow in the
reduced run. The answer is written as the seeds' files, keep_dtype.txt and modify_mixlist.json; the
mixed-precision model is made from it afterwards, on the user's own model (`deployable.py`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accubisect import ort_compile
from accubisect.backends import Backend, backend_named
from accubisect.bisection import (
    PreconditionError,
    candidate_passes,
    compare_verdict,
    final_verdict,
    judge_probe,
    known_verdicts,
    probes_by_round,
    rows_by,
    worst_local_error,
    write_plan,
)
from accubisect.files import read_json, write_atomic, write_json
from accubisect.graph import load_graph
from accubisect.model import load_compiled
from accubisect.report_html import bisect_page
from accubisect.run_context import with_context
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
    model = backend.reduced_model(load_compiled(Path(compiled_model)), set(assignment["reduced"]) - set(kept_fp32),
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
    """Original node names where a compiled node has them (keep_dtype resolves them through fusion), each
    once, in the order the culprits come."""
    nodes = {node["name"]: node for node in graph["nodes"]}
    return list(dict.fromkeys(name for culprit in culprits for name in (nodes[culprit]["original_nodes"] or [culprit])))


def mixlist_suggestion(culprits: Sequence[str], reduced: Sequence[str], graph: Mapping[str, Any]) -> list[str]:
    """Op types better moved to the black list as a whole: at least two reduced nodes of the type, and
    every one of them must be kept in fp32 anyway."""
    op_type = {node["name"]: node["op_type"] for node in graph["nodes"]}
    needed, present = Counter(op_type[c] for c in culprits), Counter(op_type[r] for r in reduced)
    return sorted(t for t, count in needed.items() if count >= 2 and count == present[t])


def write_result(plans: Sequence[str], verdicts: Sequence[str], compare_report: str, assignment: str,
                 graph_json: str, context: Mapping[str, Any], result_json: str, keep_dtype: str, modify_mixlist: str,
                 report_html: str, summary: str) -> None:
    """Final job of the search: every probe and the answer. The mixed-precision model is made by its own
    job afterwards, so a model the converter cannot handle never costs the user the answer."""
    rounds = [read_json(path) for path in plans]
    final, chosen, graph = rounds[-1], read_json(assignment), load_graph(Path(graph_json))
    answer = final["answer"]
    if answer["status"] == NOT_AMONG_CANDIDATES:
        raise PreconditionError("even with every reduced node in fp32 the model fails: precision is not the cause")
    probes = probes_by_round(rounds, verdicts)
    culprits, moved = answer["culprits"], mixlist_suggestion(answer["culprits"], chosen["reduced"], graph)
    reduced_verdict = compare_verdict(read_json(compare_report))
    result = {
        "status": "fixed" if culprits else "nothing to fix",
        "mode": chosen["mode"], "dtype": chosen["dtype"], "graph": chosen["graph"],
        "candidates": final["candidates"], "ranking": final["ranking"],
        "ranking_use": "nodes were searched most suspect first (largest local error on exact inputs, then overflow "
                       "in the reduced run); the first probe kept only the top-ranked node in fp32",
        "probes": probes, "culprits": culprits, "groups": answer["groups"],
        "kept": [name for name in final["candidates"] if name not in culprits],
        "kept_fp32": f"{len(culprits)} of {len(final['candidates'])} nodes",
        "keep_dtype": keep_dtype_lines(culprits, graph),
        "final_verdict": final_verdict(culprits, probes, reduced_verdict),
        "reduced_verdict": reduced_verdict,
        "mixlist_black": moved,
    }
    write_json(Path(result_json), result)
    write_atomic(Path(keep_dtype), "".join(f"{line}\n" for line in result["keep_dtype"]))
    write_json(Path(modify_mixlist), {"black-list": {"to-add": moved}})
    write_atomic(Path(report_html), bisect_page(result, "precision_bisect", "keep in fp32"))
    write_atomic(Path(summary), with_context(context, render_summary(result)))


def render_summary(result: Mapping[str, Any]) -> str:
    where = f"precision assigned on the {result['graph']} graph"
    culprits = result["culprits"]
    if not culprits:
        return (f"nothing to fix: the model passes the accuracy check in {result['mode']} ({result['dtype']}), "
                f"{where}; keep_dtype.txt is empty\n")
    before, after = result["reduced_verdict"]["worst"], result["final_verdict"]["worst"]
    change = f"max rel err {before.get('max_rel', math.nan):.2g} → {after.get('max_rel', math.nan):.2g}"
    lines = [f"keep {result['kept_fp32']} in fp32 ({', '.join(culprits)}; {change}); "
             f"{len(result['kept'])} nodes stay in {result['dtype']} ({where}). "
             f"keep_dtype.txt lists them: {len(result['keep_dtype'])} original node name(s)."]
    if result["mixlist_black"]:
        lines.append(f"every reduced {', '.join(result['mixlist_black'])} node must stay fp32: moving the op type to "
                     "the black list (modify_mixlist.json) is the simpler answer")
    rounds = len({probe["round"] for probe in result["probes"]})
    lines.append(f"{len(result['probes'])} probe(s) in {rounds} round(s)")
    return "\n".join(lines) + "\n"
