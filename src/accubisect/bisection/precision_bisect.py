"""`snakemake precision_bisect`: the fewest nodes to keep in fp32 so the model passes, the rest reduced.

The precision kind of `Bisection` (`protocol.py`): the candidates are the compiled nodes the configured
mode runs in reduced precision; a node switched off is kept in fp32, and a probe runs the reduced model
with a configuration's nodes kept in fp32 as the backend runs it (emulated on the CPU, native on a GPU).
The ranking is each node's local error and overflow in the reduced run; before searching, the search job
measures the noise floor (`noise_floor.py`). The answer is written as the seeds' files, keep_dtype.txt and
modify_mixlist.json; the mixed-precision model is made from it afterwards, on the user's own model
(`deployable.py`). The jobs are the shared ones (`jobs.py`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import onnx

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.noise_floor import measure_floor
from accubisect.bisection.protocol import Bisection, nothing_off_verdict, rows_by, worst_local_error
from accubisect.bisection.search import SearchRecord, VerdictRecord, answer_status, listed
from accubisect.core.strategy import Config
from accubisect.formats.assignment import Assignment
from accubisect.formats.compare_report import CompareReport
from accubisect.formats.files import write_atomic, write_json
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.model import load_compiled
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend, backend_named

RANKING_USE = ("nodes were searched most suspect first (largest local error on exact inputs, then overflow in the "
               "reduced run); the first probe kept only the top-ranked node in fp32")


class PrecisionBisection(Bisection):
    """Nodes kept in fp32 (their reduction switched off) in the reduced model of the precision stage's
    assignment."""

    name, unit, action = "precision_bisect", "node", "keep in fp32"
    search_files = frozenset({"compiled_model", "assignment"})
    result_files = frozenset({"assignment", "graph_json", "keep_dtype", "modify_mixlist"})

    @cached_property
    def assignment(self) -> Assignment:
        return Assignment.read(self.step.assignment)

    def candidates(self) -> list[str]:
        return list(self.assignment.reduced)

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        return rank_nodes(candidates, self.report)

    def not_the_cause(self) -> str:
        return "the model fails even in fp32 against the golden outputs: precision is not the cause (try fusion_bisect)"

    def prober(self) -> PrecisionProbe:
        assignment = self.assignment
        return PrecisionProbe(load_compiled(self.step.compiled_model), frozenset(assignment.reduced),
                              assignment.dtype, assignment.dtypes, self.sample_judge(),
                              backend_named(self.step.backend))

    def floor(self, ranking: Sequence[Mapping[str, Any]], judge_whole: Callable[[Config], VerdictRecord],
              key_of: Callable[[Config], str]) -> dict[str, Any]:
        """The noise floor: what the reduced type can reach at all (`noise_floor.py`)."""
        return measure_floor(ranking, self.assignment.dtype, self.check,
                             lambda off: judge_whole(off).to_json(), nothing_off_verdict(self.report), key_of)

    def not_among_candidates(self, found: SearchRecord) -> str:
        return "even with every reduced node in fp32 the model fails: precision is not the cause"

    def result(self, found: SearchRecord) -> dict[str, Any]:
        """Every probe and the answer. The mixed-precision model is made by its own job afterwards, so a model
        the converter cannot handle never costs the user the answer."""
        assignment, graph, culprits = self.assignment, GraphRecord.read(self.step.graph_json), list(found.culprits)
        reduced = nothing_off_verdict(self.report)
        return {
            "status": "fixed" if culprits else "nothing to fix",
            "mode": assignment.mode, "dtype": assignment.dtype, "graph": assignment.graph,
            "candidates": found.candidates, "ranking": list(found.ranking), "ranking_use": RANKING_USE,
            "floor": found.floor,
            "probes": list(found.probes), "culprits": culprits, "groups": [list(group) for group in found.groups],
            "minimal": found.minimal,
            "search": answer_status(found, self.unit),
            "kept": found.kept,
            "kept_fp32": f"{len(culprits)} of {len(found.candidates)} nodes",
            "keep_dtype": keep_dtype_lines(culprits, graph),
            "final_verdict": found.final_verdict(reduced),
            "reduced_verdict": reduced,
            "mixlist_black": mixlist_suggestion(culprits, assignment.reduced, graph),
        }

    def write_answer(self, result: Mapping[str, Any]) -> None:
        write_atomic(self.step.keep_dtype, "".join(f"{line}\n" for line in result["keep_dtype"]))
        write_json(self.step.modify_mixlist, {"black-list": {"to-add": result["mixlist_black"]}})

    def summary(self, result: Mapping[str, Any]) -> str:
        return render_summary(result)


@dataclass(frozen=True)
class PrecisionProbe:
    """A precision probe: the compiled model with the reduced nodes, less the configuration's (kept in
    fp32), in the low type as the backend runs them."""

    model: onnx.ModelProto  # the compiled graph precision was assigned on
    reduced: frozenset[str]  # the candidates: nodes the assignment runs in `dtype`
    dtype: str
    dtypes: Mapping[str, str]
    judge: SampleJudge
    runtime: Backend

    def __call__(self, off: Config, threads: int, stop_early: bool = True) -> dict[str, Any]:
        lowered = self.runtime.reduced_model(self.model, set(self.reduced - off), self.dtype, self.dtypes)
        runner = ort_compile.Runner(lowered.SerializeToString(), ort_compile.CompileOptions("off"), self.runtime,
                                    threads).activate()
        return self.judge.judge(runner, stop_early)


def rank_nodes(reduced: Sequence[str], report: CompareReport) -> list[dict[str, Any]]:
    """Most suspect first: the largest error made locally (on exact inputs), then the largest fraction of
    values beyond the low type's range in the reduced run, then topological order."""
    rows = rows_by(report, "node", reduced)
    evidence = [{"name": name, "local_error": worst_local_error(rows[name]),
                 "overflow": max((row.worst.get("overflow_cand", 0.0) for row in rows[name]), default=0.0)}
                for name in reduced]
    return sorted(evidence, key=lambda e: (-(e["local_error"] or 0.0), -e["overflow"]))  # stable: topological


def keep_dtype_lines(culprits: Sequence[str], graph: GraphRecord) -> list[str]:
    """Original node names where a compiled node has them (keep_dtype resolves them through fusion), each
    once, in the order the culprits come."""
    nodes = graph.by_name
    return list(dict.fromkeys(name for culprit in culprits for name in (nodes[culprit].original_nodes or [culprit])))


def mixlist_suggestion(culprits: Sequence[str], reduced: Sequence[str], graph: GraphRecord) -> list[str]:
    """Op types better moved to the black list as a whole: at least two reduced nodes of the type, and
    every one of them must be kept in fp32 anyway."""
    op_type = {node.name: node.op_type for node in graph.nodes}
    needed, present = Counter(op_type[c] for c in culprits), Counter(op_type[r] for r in reduced)
    return sorted(t for t, count in needed.items() if count >= 2 and count == present[t])


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
