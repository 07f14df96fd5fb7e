"""What every bisection shares: the search job's loop, and the records it leaves.

A bisection switches candidates *off* — fusion rules switched off, or nodes kept in fp32 — and asks the
pure strategy (`core/strategy.py`) which configurations to probe (docs/glossary.md). The whole search
runs in one job: a round's probes run side by side in its process, sharing what does not change between
probes (the model, the samples and their references), and each verdict is a file whose path is a hash of
the search's inputs and the configuration. A killed run, or one whose budget ran out, continues from the
verdicts on disk, and Snakemake's DAG does not grow with the rounds (a checkpoint per round and a job per
probe cost a process per probe, and minutes of DAG evaluation on resume after 50 rounds). What each search
adds — candidates, ranking, preconditions, how a probe builds its session, its strategy — is the `Search`
protocol (`protocol.py`); `driver.py` runs any of them through this loop.

It leaves two versioned records, verdict.json (`formats/verdict.py`, one probe) and search.json
(`formats/search_record.py`, one search).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from accubisect.core.accuracy import Judged
from accubisect.core.errors import ConfigError, PreconditionError
from accubisect.core.shrink import CUT_FOUND, INPUTS, OUTPUTS
from accubisect.core.strategy import FOUND, Configuration, Outcome, Round, next_probes
from accubisect.formats.config_sections import BisectSection
from accubisect.formats.search_record import UNFINISHED, ProbeEntry, SearchRecord
from accubisect.formats.verdict import VerdictRecord, VerdictStore

log = logging.getLogger("accubisect")

Prober = Callable[[Configuration, int], Judged]  # (configuration, threads) -> its samples judged (`SampleJudge.judge`)


Strategy = Callable[[Sequence[str], Mapping[Configuration, bool], int], Round | Outcome]  # `core.strategy.next_probes`


@dataclass(frozen=True)
class Budget:
    """How much a search may spend: probes in all (verdicts found on disk count too, so a rerun with a
    bigger budget goes on where the last one stopped) and minutes of this run."""

    max_probes: int | None = None
    max_minutes: float | None = None

    @classmethod
    def from_config(cls, bisect: BisectSection) -> Budget:
        return cls(bisect["max_probes"], bisect["max_minutes"])

    def room(self, probes: int, seconds: float) -> tuple[int | None, str | None]:
        """How many more probes may run (None: no limit), and the setting that limits them."""
        if self.max_minutes is not None and seconds >= 60 * self.max_minutes:
            return 0, f"bisect.max_minutes ({self.max_minutes:g})"
        if self.max_probes is not None:
            return max(0, self.max_probes - probes), f"bisect.max_probes ({self.max_probes})"
        return None, None


@dataclass(frozen=True)
class Pace:
    """How a search spends: `parallel` probes a round side by side, on `threads` threads in all, within
    `budget`. The three travel together from a job's step to the loop."""

    parallel: int
    threads: int
    budget: Budget = Budget()

    @classmethod
    def from_config(cls, bisect: BisectSection, threads: int) -> Pace:
        return cls(bisect["parallel"], threads, Budget.from_config(bisect))


def check_budget(bisect: BisectSection) -> None:
    """`max_minutes: .inf` (or `.nan`) would never stop a search and cannot size the job's runtime for a
    cluster; no limit has one spelling, null, the default."""
    minutes = bisect["max_minutes"]
    if minutes is not None and not math.isfinite(minutes):
        raise ConfigError(f"bisect.max_minutes: {minutes} is not a number of minutes; for no time limit leave it "
                          "null (the default)")


def search(name: str, ranking: Sequence[Mapping[str, Any]], nothing_off_passes: bool | None, store: VerdictStore,
           probe: Prober, pace: Pace, strategy: Strategy = next_probes) -> SearchRecord:
    """Runs the strategy (group testing unless told) to its answer, or until the budget runs out, probing what
    the store does not know (nothing off too, where `nothing_off_passes` is None)."""
    candidates = [entry["name"] for entry in ranking]
    known: dict[Configuration, bool] = {} if nothing_off_passes is None else {frozenset(): nothing_off_passes}
    probes: list[ProbeEntry] = []
    progress = Progress(name, len(candidates))
    while not isinstance(step := strategy(candidates, known, pace.parallel), Outcome):
        verdicts = {config: store.read(config) for config in step.probes}
        new = [config for config, verdict in verdicts.items() if verdict is None]
        room, limit = pace.budget.room(len(probes) + len(step.probes) - len(new), progress.seconds())
        running = new if room is None else new[:room]
        progress.round(step, len(running), len(probes))
        started = time.monotonic()
        verdicts.update(run_round(probe, running, store, pace.threads))
        if running:
            progress.probed(time.monotonic() - started)
        for config in step.probes:
            if (verdict := verdicts[config]) is not None:
                probes.append(probe_entry(progress.rounds, verdict, from_disk=config not in new))
                known[config] = verdict.passed
        progress.rounds += 1
        if len(running) < len(new):
            return progress.finished(unfinished(name, ranking, probes, limit))
    return progress.finished(SearchRecord(name, tuple(ranking), tuple(probes), step.status, step.culprits,
                                          step.groups))


def run_round(probe: Prober, configs: Sequence[Configuration], store: VerdictStore,
              threads: int) -> dict[Configuration, VerdictRecord]:
    """The round's probes side by side, each on an equal share of the job's threads; each verdict is on
    disk as soon as it is known."""
    if not configs:
        return {}
    workers = max(1, min(threads, len(configs)))
    run = functools.partial(_probed, probe, store, max(1, threads // workers))
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(configs, pool.map(run, configs), strict=True))


def _probed(probe: Prober, store: VerdictStore, threads: int, config: Configuration) -> VerdictRecord:
    """One probe, timed; its verdict written before it is returned."""
    start = time.perf_counter()
    judged = probe(config, threads)
    verdict = VerdictRecord.of(config, judged, round(time.perf_counter() - start, 3))
    store.write(verdict)
    return verdict


def judged(probe: Prober, store: VerdictStore, threads: int, config: Configuration) -> VerdictRecord:
    """One configuration's verdict: from disk, or probed now with every thread."""
    return store.read(config) or run_round(probe, [config], store, threads)[config]


def probe_entry(round_index: int, verdict: VerdictRecord, from_disk: bool) -> ProbeEntry:
    """A probe as search.json and result.json list it."""
    return {"round": round_index, "off": list(verdict.off), "passed": verdict.passed,
            "samples_passed": [s["passed"] for s in verdict.samples], "worst": verdict.worst,
            "seconds": verdict.seconds, "from_disk": from_disk}


def unfinished(name: str, ranking: Sequence[Mapping[str, Any]], probes: Sequence[ProbeEntry],
               limit: str | None) -> SearchRecord:
    """The search stopped by its budget: the passing configuration with the fewest candidates off, the
    earliest probed among equals, not proven minimal."""
    order = {entry["name"]: index for index, entry in enumerate(ranking)}
    passing = [probe["off"] for probe in probes if probe["passed"]]
    best = min(passing, key=len, default=[])
    return SearchRecord(name, tuple(ranking), tuple(probes), UNFINISHED, tuple(sorted(best, key=order.__getitem__)),
                        stopped_by=limit)


CUT_ENDS = {OUTPUTS: "end", INPUTS: "start"}  # which end of its cut each of reduce's sides looks for


class Progress:
    """The search's console: one line per round with new probes, and one when it ends."""

    def __init__(self, name: str, candidates: int):
        self.name, self.candidates, self.rounds = name, candidates, 0
        self.start = time.monotonic()
        self.probing_seconds, self.probed_rounds = 0.0, 0

    def seconds(self) -> float:
        return time.monotonic() - self.start

    def round(self, step: Round, running: int, done: int) -> None:
        if running:
            log.info("%s round %d: %d probe(s) running, %d done · %s · %s elapsed%s", self.name, self.rounds, running,
                     done, self._state(step), _clock(self.seconds()), self._eta(step))

    def probed(self, seconds: float) -> None:
        self.probing_seconds += seconds
        self.probed_rounds += 1

    def _state(self, step: Round) -> str:
        """Where the search stands: for reduce's sides, where the cut's end or start may still lie; for the
        others, the suspects left and the culprits found so far."""
        if step.phase in CUT_ENDS:
            return f"the cut's {CUT_ENDS[step.phase]} lies among {step.suspects} of {self.candidates} node(s)"
        return f"{self._suspects(step)} · culprits so far: {listed(step.culprits) or 'none'}"

    def _suspects(self, step: Round) -> str:
        if step.phase == "verify":
            return f"checking that switching off the {step.suspects} culprit(s) found passes"
        if step.phase == "groups":
            return f"the culprits found are not enough alone: {step.suspects} suspect(s) left for a partner"
        if step.phase == "minimality":
            return f"checking that each of {step.suspects} culprit(s) is needed"
        return f"{step.suspects} of {self.candidates} suspect(s) left"

    def _eta(self, step: Round) -> str:
        """Rounds left ≈ the splits that still narrow the suspects down, plus the minimality check."""
        if not self.probed_rounds:
            return ""
        rounds_left = math.ceil(math.log2(max(step.suspects, 2))) + 1
        return f", about {_clock(rounds_left * self.probing_seconds / self.probed_rounds)} left"

    def finished(self, record: SearchRecord) -> SearchRecord:
        from_disk = sum(probe["from_disk"] for probe in record.probes)
        ran = f"{len(record.probes)} probe(s)" + (f", {from_disk} of them from disk," if from_disk else "")
        outcome = (_stopped(record) if record.status == UNFINISHED
                   else f"{len(record.culprits)} culprit(s)" if record.status == FOUND
                   else f"the cut found: {listed(record.culprits)}" if record.status == CUT_FOUND
                   else "the culprits are not among the candidates")
        log.info("%s: %s in %d round(s), %s: %s", self.name, ran, self.rounds, _clock(self.seconds()), outcome)
        return record


def _stopped(record: SearchRecord) -> str:
    if not record.culprits:
        return f"stopped by {record.stopped_by} before any configuration passed; raise it and rerun"
    return f"stopped by {record.stopped_by}, best so far: {len(record.culprits)} off (not proven minimal)"


def answer_status(record: SearchRecord, unit: str) -> str:
    """The summary's line on how far the search got: proven 1-minimal, or the budget that stopped it."""
    if record.status != UNFINISHED:
        return f"{len(record.probes)} probe(s) in {len({p['round'] for p in record.probes})} round(s)"
    if not record.culprits:
        raise PreconditionError(f"{record.stopped_by} ran out after {len(record.probes)} probe(s), before any "
                                f"configuration passed; raise it and rerun: the search goes on from the "
                                f"{len(record.probes)} verdict(s) on disk")
    return (f"not proven minimal: {record.stopped_by} ran out after {len(record.probes)} probe(s); this is the "
            f"best passing configuration so far ({len(record.culprits)} {unit}(s) off); raise the budget and rerun "
            "to go on from the verdicts on disk")


def listed(names: Sequence[str], limit: int = 8) -> str:
    """Names for a summary line: a search may keep hundreds of nodes in fp32; result.json lists them all."""
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _clock(seconds: float) -> str:
    minutes, rest = divmod(int(seconds + 0.5), 60)
    return f"{minutes}:{rest:02d}"
