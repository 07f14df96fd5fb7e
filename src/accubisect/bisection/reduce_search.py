"""reduce's two searches, each a `protocol.Search` run by the one driver (`driver.drive`).

The outputs side (`OutputsSide`) looks for the earliest cut of the node order whose prefix shows the bug, its
outputs every tensor live after the cut; the inputs side (`InputsSide`), for the latest start from which
the failing outputs of that cut still show it, read from the reference before it. Each is a bisection over
positions (`core.shrink.next_cut`, pure and replayed over the verdicts), one probe a round, its hint probed
first. A configuration is the cut's verdict configuration (`Cut.config`: a readable line with the hash of its
nodes and outputs), so the reduce probe store's keys are those it always had; `CutOrder` keeps which cut
each configuration names, for the prober and for the answer (the Outcome names the cut found by its
configuration). The configuration with nothing off is the side's known end: the whole model, or the cut
from the first node the outputs need. Its verdict is the side's precondition (`nothing_off_passes`), probed
through the store before the rounds and kept as the side's first step.

No probe budget (`bisect.max_probes`, `max_minutes`) applies: a side takes about log2(positions) + 2
probes, about 2·log2(nodes) + 3 in all, so the count is bounded by the model's size, and a repro is only
worth sending once its cut is found (fails, and the next cut towards the far end passes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, ClassVar

from accubisect.bisection.protocol import Search
from accubisect.bisection.reduce_probe import Cut, CutProber, describe
from accubisect.bisection.search import Prober, run_round
from accubisect.core.accuracy import Judged
from accubisect.core.errors import PreconditionError
from accubisect.core.shrink import EARLIEST, INPUTS, LATEST, OUTPUTS, next_cut
from accubisect.core.strategy import Configuration, Outcome, Round
from accubisect.core.subgraph import Graph
from accubisect.formats.reduce_record import ReduceProbe
from accubisect.formats.search_record import ProbeEntry, SearchRecord
from accubisect.formats.verdict import VerdictRecord, VerdictStore

log = logging.getLogger("accubisect")


class CutOrder(Sequence[Configuration]):
    """One side's cuts in order, one per node position in `positions`, each made (`make(position)`) and named
    when first indexed: a side of a large model has thousands of positions and probes about log2 of them.
    `named` maps each configuration indexed so far to its cut."""

    def __init__(self, graph: Graph, positions: Sequence[int], make: Callable[[int], Cut]) -> None:
        self.graph, self.positions, self.make = graph, positions, make
        self.configs: dict[int, Configuration] = {}
        self.named: dict[Configuration, Cut] = {}

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index: int) -> Configuration:  # type: ignore[override]
        if not 0 <= index < len(self.positions):
            raise IndexError(index)
        if index not in self.configs:
            cut = self.make(self.positions[index])
            self.configs[index] = cut.config(self.graph)
            self.named[self.configs[index]] = cut
        return self.configs[index]


class CutSearch(Search):
    """One side of reduce as the driver runs it: the node positions its cut's end (or start) may lie at, in
    node order; the known end's verdict as its precondition; its prober judges the cut a configuration
    names (`CutProber.judge`) and says in one line what the cut showed."""

    phase: ClassVar[str]  # outputs | inputs: the side, in progress lines and reduce.json's steps
    want: ClassVar[str]  # EARLIEST | LATEST (`core/shrink.py`)
    unit = "node"

    def __init__(self, prober: CutProber, store: VerdictStore, cuts: CutOrder, hint: int | None,
                 threads: int) -> None:
        self.cut_prober, self.store, self.cuts, self.hint, self.threads = prober, store, cuts, hint, threads

    def candidates(self) -> list[str]:
        return [self.cuts.graph.nodes[position].name for position in self.cuts.positions]

    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        """Node order, as the bisection walks it, with no evidence: what the evidence suggests is the hint, which
        the strategy probes first (`next_cut`)."""
        return [{"name": name} for name in candidates]

    @cached_property
    def _known(self) -> tuple[VerdictRecord, bool]:
        """The known end's verdict and whether it was on disk: from the store, or probed now, once."""
        config = self.cuts[len(self.cuts) - 1 if self.want == EARLIEST else 0]
        verdict = self.store.read(config)
        if verdict is not None:
            return verdict, True
        return run_round(self.prober(), [config], self.store, self.threads)[config], False

    @property
    def known_end(self) -> VerdictRecord:
        """The known end's verdict (`nothing_off_passes`)."""
        return self._known[0]

    def known_step(self) -> ReduceProbe:
        """reduce.json's step of the known end: the side's first."""
        verdict, from_disk = self._known
        return self._step(frozenset(verdict.off), verdict.passed, verdict.worst, verdict.seconds, from_disk)

    def prober(self) -> Prober:
        return self._judge

    def _judge(self, config: Configuration, threads: int) -> Judged:
        """The cut `config` names, judged (on the job's threads, as the candidate compiles it), and its line."""
        cut = self.cuts.named[config]
        start = time.perf_counter()
        judged = self.cut_prober.judge(cut)
        log.info("%s: %s: %s [%.1f s]", self.name, cut.describe(self.cuts.graph),
                 describe(judged["passed"], judged["samples"]), time.perf_counter() - start)
        return judged

    def strategy(self, candidates: Sequence[str], verdicts: Mapping[Configuration, bool],
                 parallel: int) -> Round | Outcome:
        """The bisection over the side's positions (`core.shrink.next_cut`), one probe a round."""
        return next_cut(self.cuts, verdicts, self.want, self.hint, self.phase)

    def found(self, record: SearchRecord) -> Cut:
        """The cut the side found: its Outcome's culprits are that cut's configuration."""
        return self.cuts.named[frozenset(record.culprits)]

    def steps(self, record: SearchRecord) -> list[ReduceProbe]:
        """reduce.json's steps of this side: the known end's, then every probe of its rounds."""
        return [self.known_step(), *(self._entry(probe) for probe in record.probes)]

    def _entry(self, probe: ProbeEntry) -> ReduceProbe:
        return self._step(frozenset(probe["off"]), probe["passed"], probe["worst"], probe["seconds"],
                          probe["from_disk"])

    def _step(self, config: Configuration, passed: bool, worst: Mapping[str, Any], seconds: float,
              from_disk: bool) -> ReduceProbe:
        cut = self.cuts.named[config]
        return ReduceProbe(self.phase, self.store.key_of(config), len(cut.positions), cut.outputs, passed,
                           dict(worst), seconds, from_disk)


class OutputsSide(CutSearch):
    """The earliest prefix of the node order that shows the bug, outputting every tensor live after it."""

    name, phase, want = "reduce outputs", OUTPUTS, EARLIEST

    @classmethod
    def of(cls, prober: CutProber, store: VerdictStore, divergence: int | None, threads: int) -> OutputsSide:
        """`divergence`: the position of the comparison's first divergence, probed first."""
        graph = prober.graph

        def prefix(position: int) -> Cut:
            live = graph.live_after(position)
            return Cut(tuple(graph.ancestors(live)), tuple(live))

        return cls(prober, store, CutOrder(graph, range(len(graph)), prefix), divergence, threads)

    def nothing_off_passes(self) -> bool:
        """The whole model must show the bug: else nothing to reduce, said in one line (`nothing_to_reduce`)."""
        if self.known_end.passed:
            raise PreconditionError(self.cut_prober.nothing_to_reduce(self.known_end))
        return False


class InputsSide(CutSearch):
    """The latest start from which `outputs` still show the bug, what comes before read from the reference."""

    name, phase, want = "reduce inputs", INPUTS, LATEST

    @classmethod
    def of(cls, prober: CutProber, store: VerdictStore, outputs: tuple[str, ...],
           hint: Callable[[Sequence[int]], int | None], threads: int) -> InputsSide:
        """`hint(needed)`: the index among the positions the outputs need of the start probed first."""
        graph = prober.graph
        needed = graph.ancestors(outputs)
        cuts = CutOrder(graph, needed, lambda start: Cut(tuple(graph.ancestors(outputs, start)), outputs))
        return cls(prober, store, cuts, hint(needed), threads)

    def nothing_off_passes(self) -> bool:
        """Whether the outputs, computed from the first node they need, pass after all (the job then searches
        with every output of the cut found: another output had kept a fusion from forming)."""
        return self.known_end.passed
