"""Settling the search's answer in the user's model (job `precision_deploy`, `bisection/deployable.py`): the
carried answer verified, then made 1-minimal there, or, when it fails there, searched again over the user's
nodes with the same strategy, the candidates ranked most suspect first (`ranked`). Probes keep their verdicts
on disk as the search's do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from accubisect.bisection.deploy_probes import LOW_MAX, BothRoutes
from accubisect.bisection.precision_bisect import worst_text
from accubisect.bisection.search import (
    UNFINISHED,
    Budget,
    SearchRecord,
    VerdictRecord,
    VerdictStore,
    answer_status,
    judged,
    probe_entry,
    search,
)
from accubisect.core.errors import PreconditionError
from accubisect.core.onnx_graph import nodes_with_protos
from accubisect.core.strategy import NOT_AMONG_CANDIDATES, Configuration
from accubisect.formats.deployed import MINIMIZED, SEARCHED, VERIFIED
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.model import tensor_values
from accubisect.stages.tensor_ranges import largest_finite

log = logging.getLogger("accubisect")


def ranked(routes: BothRoutes, found: SearchRecord, graph: GraphRecord,
           carried: frozenset[str]) -> list[dict[str, Any]]:
    """The candidates most suspect first, for a search again: those the search's answer keeps, then those
    reading a constant beyond the low type's range (what a fusion folds away: a BatchNorm's variance), then
    those holding an activation beyond it in the low type (`LowRange`), then in the order of the search's
    ranking of the compiled nodes that absorbed them."""
    user = routes.deployable
    limit = LOW_MAX[user.dtype]
    overflowing = constant_overflow(user.model, limit, user.weights)
    position = {name: index for index, name in enumerate(found.candidates)}
    rank_of: dict[str, int] = {}
    for node in graph.nodes:
        for name in node.original_nodes:
            rank_of[name] = min(rank_of.get(name, len(position)), position.get(node.name, len(position)))
    evidence = [{"name": name, "kept_by_search": name in carried, "constant_overflow": overflowing.get(name, 0.0),
                 "activation_overflow": largest if (largest := routes.low_range.largest(name)) > limit else 0.0,
                 "search_rank": rank_of.get(name, position.get(name))} for name in routes.candidates]
    return sorted(evidence, key=lambda e: (not e["kept_by_search"], -e["constant_overflow"], -e["activation_overflow"],
                                           len(position) if e["search_rank"] is None else e["search_rank"]))


def constant_overflow(model: onnx.ModelProto, limit: float, weights: Path) -> dict[str, float]:
    """Per node: the largest finite magnitude beyond `limit` among the constants it reads (initializers and
    Constant nodes, the external ones read from the folder `weights` one at a time); nodes reading none are
    left out."""
    constants = {init.name: init for init in model.graph.initializer}
    constants.update({proto.output[0]: attribute.t for proto in model.graph.node if proto.op_type == "Constant"
                      for attribute in proto.attribute if attribute.name == "value"})
    largest: dict[str, float] = {}
    for tensor, proto in constants.items():
        if proto.data_type == onnx.TensorProto.FLOAT:
            largest[tensor] = largest_finite(tensor_values(proto, weights))
    found: dict[str, float] = {}
    for node, proto in nodes_with_protos(model.graph):
        beyond = [largest[t] for t in proto.input if largest.get(t, 0.0) > limit]
        if beyond:
            found[node.name] = max(beyond)
    return found


@dataclass(frozen=True)
class Settled:
    """The answer in the deployable model: how it was reached, its nodes kept fp32 and its verdict."""

    how: str
    keep: tuple[str, ...]
    verdict: Mapping[str, Any]
    carried_verdict: Mapping[str, Any]
    probes: list[dict[str, Any]]
    minimal: bool
    stopped_by: str | None


class Settle:
    """The deployable pass: the carried answer verified, then made 1-minimal, or searched again."""

    def __init__(self, probe: BothRoutes, store: VerdictStore, threads: int, bisect: Mapping[str, Any]):
        self.probe, self.store, self.threads = probe, store, threads
        self.parallel, self.budget = bisect["parallel"], Budget.from_config(bisect)
        self.probes: list[dict[str, Any]] = []
        self.start = time.monotonic()

    def verdict(self, off: Configuration) -> VerdictRecord:
        """One configuration's verdict, from disk or probed now, listed among this pass's probes."""
        known = self.store.read(off)
        verdict = known or judged(self.probe, self.store, self.threads, off)
        self.probes.append(probe_entry(len(self.probes), verdict, from_disk=known is not None))
        return verdict

    def known(self, off: Configuration) -> VerdictRecord:
        """A configuration this pass has probed already (the answer it settled on), or probed now."""
        return self.store.read(off) or self.verdict(off)

    def run(self, carried: frozenset[str], found: SearchRecord, ranking: list[dict[str, Any]]) -> Settled:
        order = [entry["name"] for entry in ranking]
        first = self.verdict(carried)
        if first.passed and found.status == UNFINISHED:  # the budget is spent: the search's best, not minimal
            return self.settled(VERIFIED, carried, first, first, False, found.stopped_by, order)
        if first.passed:
            log.info("precision_bisect in your model: the answer (%d node(s) in fp32) passes; checking that each "
                     "is needed", len(carried))
            keep, stopped_by = self.minimize(carried, order)
            how = VERIFIED if keep == carried else MINIMIZED
            return self.settled(how, keep, self.known(keep), first, stopped_by is None, stopped_by, order)
        log.info("precision_bisect in your model: the answer (%d node(s) in fp32) fails there (%s); searching "
                 "again over its %d reduced nodes", len(carried), worst_text(first.worst) or "; ".join(_reasons(first)),
                 len(order))
        again = self.search_again(carried, first, ranking)
        keep = frozenset(again.culprits)
        return self.settled(SEARCHED, keep, self.known(keep), first, again.minimal, again.stopped_by, order)

    def minimize(self, kept_fp32: frozenset[str], order: Sequence[str]) -> tuple[frozenset[str], str | None]:
        """Each node kept in fp32 tried back in the low type, the least suspect first, dropped where the model still
        passes; repeated until a pass drops none, so every node left is needed (1-minimal)."""
        dropped = True
        while dropped:
            dropped = False
            for node in sorted(kept_fp32, key=order.index, reverse=True):
                room, limit = self.budget.room(len(self.probes), time.monotonic() - self.start)
                if room == 0 and self.store.read(kept_fp32 - {node}) is None:
                    return kept_fp32, limit
                if self.verdict(kept_fp32 - {node}).passed:
                    kept_fp32, dropped = kept_fp32 - {node}, True
        return kept_fp32, None

    def search_again(self, carried: frozenset[str], first: VerdictRecord, ranking: list[dict[str, Any]]):
        """The strategy over the user's nodes, with the deployable model as the probe."""
        nothing_off = first if not carried else self.verdict(frozenset())
        found = search("precision_bisect in your model", ranking, nothing_off.passed, self.store,
                       self.probe, self.parallel, self.threads, self.budget)
        self.probes.extend(found.probes)
        if found.status == NOT_AMONG_CANDIDATES:
            raise PreconditionError("even with every reduced node of your model in fp32 it fails: precision is not "
                                    "the cause")
        answer_status(found, "node")  # a budget that ran out before anything passed: its one line
        return found

    def settled(self, how: str, keep: frozenset[str], verdict: VerdictRecord, first: VerdictRecord, minimal: bool,
                stopped_by: str | None, order: Sequence[str]) -> Settled:
        return Settled(how, tuple(name for name in order if name in keep), _shaped(verdict), _shaped(first),
                       self.probes, minimal, stopped_by)


def _shaped(verdict: VerdictRecord) -> dict[str, Any]:
    """A verdict as result.json's `final_verdict` shows it."""
    return {"off": list(verdict.off), "passed": verdict.passed,
            "samples_passed": [sample["passed"] for sample in verdict.samples], "worst": dict(verdict.worst),
            "reasons": _reasons(verdict)}


def _reasons(verdict: VerdictRecord) -> list[str]:
    """The first failing sample's reasons (a tensor beyond the low type's range, or the outputs' checks)."""
    return next((list(sample.get("reasons", ())) for sample in verdict.samples if not sample["passed"]), [])
