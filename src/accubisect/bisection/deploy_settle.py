"""Settling the search's answer in the user's model (job `precision_deploy`, `bisection/deployable.py`): the
carried answer verified, then made 1-minimal there (each node given back, least suspect first: the walk's
`core.walk.given_back`), or, when it fails there, searched again over the user's nodes by group testing, the
candidates ranked most suspect first (`ranked`). Both are searches over the user's nodes (`InYourModel`) run by
the one driver (`driver.drive`: its rounds, progress lines, verdict store and budget), each configuration
judged both ways the answer is deployed (`BothRoutes`). Probes keep their verdicts on disk as the search's do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from accubisect.bisection.deploy_probes import LOW_MAX, BothRoutes
from accubisect.bisection.driver import drive
from accubisect.bisection.precision_bisect import worst_text
from accubisect.bisection.protocol import Search
from accubisect.bisection.search import Pace, Prober, Strategy, answer_status, judged, probe_entry
from accubisect.core.errors import PreconditionError
from accubisect.core.onnx_graph import nodes_with_protos
from accubisect.core.strategy import NOT_AMONG_CANDIDATES, Configuration, Outcome, Round, next_probes
from accubisect.core.walk import given_back
from accubisect.formats.bisect_result import ResultVerdict
from accubisect.formats.deployed import MINIMIZED, SEARCHED, VERIFIED
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.model import tensor_values
from accubisect.formats.search_record import UNFINISHED, ProbeEntry, SearchRecord
from accubisect.formats.verdict import VerdictRecord, VerdictStore
from accubisect.stages.tensor_ranges import largest_finite

NAME = "precision_bisect in your model"  # the searches' name in progress lines
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
class InYourModel(Search):
    """A search over the user's nodes kept in fp32, as the driver runs it: `ranking` most suspect first with the
    evidence (`ranked`), each configuration judged both ways the answer is deployed (`BothRoutes`), by group
    testing unless `walk` says otherwise."""

    name, unit = NAME, "node"
    ranking: tuple[Mapping[str, Any], ...]
    nothing_passes: bool | None  # whether nothing kept passes; None: probed if the strategy asks for it
    probe: Prober  # `BothRoutes`
    walk: Strategy = next_probes

    def candidates(self) -> list[str]:
        return [entry["name"] for entry in self.ranking]

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        chosen = set(candidates)
        return [dict(entry) for entry in self.ranking if entry["name"] in chosen]

    def nothing_off_passes(self) -> bool | None:
        return self.nothing_passes

    def prober(self) -> Prober:
        return self.probe

    def strategy(self, candidates: Sequence[str], verdicts: Mapping[Configuration, bool],
                 parallel: int) -> Round | Outcome:
        return self.walk(candidates, verdicts, parallel)


@dataclass(frozen=True)
class Settled:
    """The answer in the deployable model: how it was reached, its nodes kept fp32 and its verdict."""

    how: str
    keep: tuple[str, ...]
    verdict: ResultVerdict
    carried_verdict: ResultVerdict
    probes: tuple[ProbeEntry, ...]
    minimal: bool
    stopped_by: str | None


class Settle:
    """The deployable pass: the carried answer verified, then made 1-minimal, or searched again."""

    def __init__(self, probe: BothRoutes, store: VerdictStore, pace: Pace):
        self.probe, self.store, self.pace = probe, store, pace
        self.probes: list[ProbeEntry] = []

    def verdict(self, off: Configuration) -> VerdictRecord:
        """One configuration's verdict, from disk or probed now, listed among this pass's probes."""
        known = self.store.read(off)
        verdict = known or judged(self.probe, self.store, self.pace.threads, off)
        self.probes.append(probe_entry(len(self.probes), verdict, from_disk=known is not None))
        return verdict

    def known(self, off: Configuration) -> VerdictRecord:
        """A configuration this pass has probed already (the answer it settled on), or probed now."""
        return self.store.read(off) or self.verdict(off)

    def run(self, carried: frozenset[str], found: SearchRecord, ranking: list[dict[str, Any]]) -> Settled:
        order = [entry["name"] for entry in ranking]
        first = self.verdict(carried)
        if first.passed and found.status == UNFINISHED:  # the budget is spent: the search's best, not minimal
            return self.settled(VERIFIED, carried, first, False, found.stopped_by, order)
        if first.passed:
            log.info("%s: the answer (%d node(s) in fp32) passes; checking that each is needed", NAME, len(carried))
            given = self.given_back(carried, ranking)
            keep = frozenset(given.culprits)
            return self.settled(VERIFIED if keep == carried else MINIMIZED, keep, first, given.minimal,
                                given.stopped_by, order)
        log.info("%s: the answer (%d node(s) in fp32) fails there (%s); searching again over its %d reduced nodes",
                 NAME, len(carried), worst_text(first.worst) or "; ".join(first.reasons), len(order))
        again = self.search_again(carried, first, ranking)
        return self.settled(SEARCHED, frozenset(again.culprits), first, again.minimal, again.stopped_by, order)

    def given_back(self, carried: frozenset[str], ranking: list[dict[str, Any]]) -> SearchRecord:
        """Each node of the carried answer, which passes, given back to the low type, least suspect first, pass
        after pass, kept where the model fails without it (each such verdict probed, nothing kept too):
        1-minimal, or, when the budget stops it, the passing configuration with the fewest nodes kept."""
        kept = tuple(entry for entry in ranking if entry["name"] in carried)
        given = self.drive(InYourModel(kept, None, self.probe, given_back))
        self.probes.extend(probe for probe in given.probes if set(probe["off"]) != carried)  # listed as probed above
        return given

    def search_again(self, carried: frozenset[str], first: VerdictRecord,
                     ranking: list[dict[str, Any]]) -> SearchRecord:
        """Group testing over the user's nodes, with the deployable model as the probe."""
        nothing_off = first if not carried else self.verdict(frozenset())
        found = self.drive(InYourModel(tuple(ranking), nothing_off.passed, self.probe))
        self.probes.extend(found.probes)
        if found.status == NOT_AMONG_CANDIDATES:
            raise PreconditionError("even with every reduced node of your model in fp32 it fails: precision is not "
                                    "the cause")
        answer_status(found, "node")  # a budget that ran out before anything passed: its one line
        return found

    def drive(self, search: InYourModel) -> SearchRecord:
        return drive(search, self.store, self.pace)

    def settled(self, how: str, keep: frozenset[str], first: VerdictRecord, minimal: bool, stopped_by: str | None,
                order: Sequence[str]) -> Settled:
        """The answer `keep`, its verdict and the carried answer's (`first`) as result.json shows them."""
        verdict = ResultVerdict.of_record(self.known(keep))
        return Settled(how, tuple(name for name in order if name in keep), verdict,
                       ResultVerdict.of_record(first), tuple(self.probes), minimal, stopped_by)
