"""`snakemake precision_bisect`: the fewest nodes to keep in fp32 so the model passes, the rest reduced.

Candidates are the compiled nodes the configured mode runs in reduced precision; a probe keeps a set of
them in fp32 and runs the reduced model as the backend runs it (emulated on the CPU, native on a GPU).
The search is the shared one (`bisection.py`), guided by each node's local error and by overflow in the
reduced run. The answer is written as the seeds' files, keep_dtype.txt and modify_mixlist.json; the
mixed-precision model is made from it afterwards, on the user's own model (`deployable.py`).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.noise_floor import measure_floor
from accubisect.bisection.search import (
    UNFINISHED,
    Budget,
    PreconditionError,
    SearchRecord,
    VerdictStore,
    answer_status,
    candidate_passes,
    compare_verdict,
    final_verdict,
    judged,
    listed,
    rows_by,
    search,
    worst_local_error,
)
from accubisect.core.strategy import NOT_AMONG_CANDIDATES, Config
from accubisect.formats.files import read_json, write_atomic, write_json
from accubisect.formats.model import load_compiled
from accubisect.reports.report_html import bisect_page
from accubisect.reports.run_context import with_context
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import backend_named
from accubisect.stages.graph import load_graph


def rank_nodes(reduced: Sequence[str], report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Most suspect first: the largest error made locally (on exact inputs), then the largest fraction of
    values beyond the low type's range in the reduced run, then topological order."""
    rows = rows_by(report, "node", reduced)
    evidence = [{"name": name, "local_error": worst_local_error(rows[name]),
                 "overflow": max((row["worst"].get("overflow_cand", 0.0) for row in rows[name]), default=0.0)}
                for name in reduced]
    return sorted(evidence, key=lambda e: (-(e["local_error"] or 0.0), -e["overflow"]))  # stable: topological


def search_nodes(compiled_model: str, assignment: str, compare_report: str, sample_inputs: Sequence[str],
                 references: Sequence[str], bisect: Mapping[str, Any],
                 output_names: Sequence[str], accuracy: Mapping[str, Any], backend: str,
                 verdicts: Mapping[str, Any], threads: int, search_json: str) -> None:
    """Search job: the noise floor, then the nodes to keep in fp32, probed round by round in this process."""
    chosen, report = read_json(assignment), read_json(compare_report)
    ranking = rank_nodes(chosen["reduced"], report)
    not_the_cause = ("the model fails even in fp32 against the golden outputs: precision is not the cause "
                     "(try fusion_bisect)")
    nothing_off_passes = candidate_passes(report, accuracy["min_pass_fraction"], not_the_cause)
    judge = SampleJudge.load(sample_inputs, references, output_names, accuracy)
    model, runtime, reduced = load_compiled(Path(compiled_model)), backend_named(backend), set(chosen["reduced"])
    store = VerdictStore.from_json(verdicts)

    def probe(off: Config, threads: int, stop_early: bool = True) -> dict[str, Any]:
        lowered = runtime.reduced_model(model, reduced - off, chosen["dtype"], chosen["dtypes"])
        session = ort_compile.open_session(lowered.SerializeToString(), ort_compile.CompileOptions("off"), runtime,
                                           threads=threads)
        return judge.judge(session, stop_early)

    def judged_whole(off: Config) -> dict[str, Any]:  # the floor's metrics are suggested: every sample counts
        return judged(functools.partial(probe, stop_early=False), store, threads, off)

    floor = None
    if not nothing_off_passes and ranking:
        floor = measure_floor(ranking, chosen["dtype"], accuracy, judged_whole, compare_verdict(report), store.key_of)
    found = search("precision_bisect", ranking, nothing_off_passes, store, probe, bisect["parallel"], threads,
                   Budget.from_config(bisect))
    write_json(Path(search_json), replace(found, floor=floor).to_json())


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


def write_result(search_json: str, compare_report: str, assignment: str, graph_json: str, context: Mapping[str, Any],
                 result_json: str, keep_dtype: str, modify_mixlist: str, report_html: str, summary: str) -> None:
    """Final job of the search: every probe and the answer. The mixed-precision model is made by its own
    job afterwards, so a model the converter cannot handle never costs the user the answer."""
    found, chosen, graph = SearchRecord.read(search_json), read_json(assignment), load_graph(Path(graph_json))
    if found.status == NOT_AMONG_CANDIDATES:
        raise PreconditionError("even with every reduced node in fp32 the model fails: precision is not the cause")
    culprits = list(found.culprits)
    moved = mixlist_suggestion(culprits, chosen["reduced"], graph)
    reduced_verdict = compare_verdict(read_json(compare_report))
    result = {
        "status": "fixed" if culprits else "nothing to fix",
        "mode": chosen["mode"], "dtype": chosen["dtype"], "graph": chosen["graph"],
        "candidates": found.candidates, "ranking": list(found.ranking),
        "ranking_use": "nodes were searched most suspect first (largest local error on exact inputs, then overflow "
                       "in the reduced run); the first probe kept only the top-ranked node in fp32",
        "floor": found.floor,
        "probes": list(found.probes), "culprits": culprits, "groups": [list(group) for group in found.groups],
        "minimal": found.status != UNFINISHED,
        "search": answer_status(found, "node"),
        "kept": [name for name in found.candidates if name not in culprits],
        "kept_fp32": f"{len(culprits)} of {len(found.candidates)} nodes",
        "keep_dtype": keep_dtype_lines(culprits, graph),
        "final_verdict": final_verdict(culprits, found.probes, reduced_verdict),
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
    lines = [f"keep {result['kept_fp32']} in fp32 ({listed(culprits)}; {change}); "
             f"{len(result['kept'])} nodes stay in {result['dtype']} ({where}). "
             f"keep_dtype.txt lists them: {len(result['keep_dtype'])} original node name(s)."]
    if result["mixlist_black"]:
        lines.append(f"every reduced {', '.join(result['mixlist_black'])} node must stay fp32: moving the op type to "
                     "the black list (modify_mixlist.json) is the simpler answer")
    if result["floor"] and result["floor"]["warning"]:
        lines.append(f"warning: {result['floor']['warning']}")
    lines.append(result["search"])
    return "\n".join(lines) + "\n"
