"""What every bisection shares: the search job's loop, and the records it leaves.

A bisection switches candidates *off* — fusion rules switched off, or nodes kept in fp32 — and asks the
pure strategy (`core/strategy.py`) which configurations to probe (docs/glossary.md). The whole search
runs in one job: a round's probes run side by side in its process, sharing what does not change between
probes (the model, the samples and their references), and each verdict is a file whose path is a hash of
the search's inputs and the configuration. A killed run, or one whose budget ran out, continues from the
verdicts on disk, and Snakemake's DAG does not grow with the rounds (a checkpoint per round and a job per
probe cost a process per probe, and minutes of DAG evaluation on resume after 50 rounds). What the fusion
and precision bisections add — candidates, ranking, how a probe builds its session, the answer files — is
the `Bisection` protocol (`protocol.py`); `jobs.py` drives either.

Two versioned records: verdict.json (`VerdictRecord`, one probe) and search.json (`SearchRecord`, one
search). A reader checks the version, so a workspace of another version is a one-line "delete ... and
rerun" error, never a KeyError.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.core.errors import ConfigError, PreconditionError
from accubisect.core.strategy import FOUND, Answer, Config, Round, next_probes
from accubisect.formats.digest import stage_key
from accubisect.formats.files import read_json, write_json
from accubisect.formats.paths import verdict_file
from accubisect.formats.record import read_record, record_from

log = logging.getLogger("accubisect")

SEARCH_FORMAT = 1
VERDICT_FORMAT = 1  # verdict.json written before the field existed has none: the same layout, read as 1
UNFINISHED = "unfinished"  # a budget ran out: the answer is the best passing configuration so far
Prober = Callable[[Config, int], dict[str, Any]]  # (configuration, threads) -> judged samples (`SampleJudge.judge`)


@dataclass(frozen=True)
class Budget:
    """How much a search may spend: probes in all (verdicts found on disk count too, so a rerun with a
    bigger budget goes on where the last one stopped) and minutes of this run."""

    max_probes: int | None = None
    max_minutes: float | None = None

    @classmethod
    def from_config(cls, bisect: Mapping[str, Any]) -> Budget:
        return cls(bisect["max_probes"], bisect["max_minutes"])

    def room(self, probes: int, seconds: float) -> tuple[int | None, str | None]:
        """How many more probes may run (None: no limit), and the setting that limits them."""
        if self.max_minutes is not None and seconds >= 60 * self.max_minutes:
            return 0, f"bisect.max_minutes ({self.max_minutes:g})"
        if self.max_probes is not None:
            return max(0, self.max_probes - probes), f"bisect.max_probes ({self.max_probes})"
        return None, None


def check_budget(bisect: Mapping[str, Any]) -> None:
    """`max_minutes: .inf` (or `.nan`) would never stop a search and cannot size the job's runtime for a
    cluster; no limit has one spelling, null, the default."""
    minutes = bisect["max_minutes"]
    if minutes is not None and not math.isfinite(minutes):
        raise ConfigError(f"bisect.max_minutes: {minutes} is not a number of minutes; for no time limit leave it "
                          "null (the default)")


@dataclass(frozen=True)
class VerdictRecord:
    """verdict.json: one probe's verdict on one configuration."""

    off: tuple[str, ...]  # the configuration: the candidates switched off, sorted
    passed: bool
    samples: tuple[Mapping[str, Any], ...]  # per sample run, in order, until the verdict was certain
    worst: Mapping[str, float]  # output metrics, worst over those samples
    seconds: float  # the probe's wall time

    @classmethod
    def of(cls, config: Config, judged: Mapping[str, Any], seconds: float) -> VerdictRecord:
        """The record of a probe: `judged` is what `SampleJudge.judge` returns."""
        return cls(tuple(sorted(config)), judged["passed"], tuple(judged["samples"]), judged["worst"], seconds)

    def to_json(self) -> dict[str, Any]:
        return {"format": VERDICT_FORMAT, "off": list(self.off), "passed": self.passed, "samples": list(self.samples),
                "worst": dict(self.worst), "seconds": self.seconds}

    @classmethod
    def read(cls, path: Path) -> VerdictRecord:
        data = read_json(path)
        if isinstance(data, dict):  # written before the field existed: the same layout, format 1
            data = {"format": VERDICT_FORMAT, **data}
        return record_from(data, path, "verdict", VERDICT_FORMAT, lambda d: cls(
            tuple(d["off"]), d["passed"], tuple(d["samples"]), d["worst"], d["seconds"]))


@dataclass(frozen=True)
class VerdictStore:
    """Verdict files in the workspace, one per configuration, at `root/<verdict key>/verdict.json`, the key
    a hash of the search's inputs and the configuration: any run of a search with the same inputs finds
    them, whatever its budget or round structure."""

    root: Path
    key: Mapping[str, Any]  # what decides a verdict besides the configuration: model, samples, check, ...

    def key_of(self, off: Config) -> str:
        return stage_key(**self.key, off=sorted(off))  # `off`: verdicts already on disk keep their keys

    def path(self, off: Config) -> Path:
        return verdict_file(self.root, self.key_of(off))

    def read(self, off: Config) -> VerdictRecord | None:
        path = self.path(off)
        return VerdictRecord.read(path) if path.exists() else None

    def write(self, verdict: VerdictRecord) -> None:
        write_json(self.path(frozenset(verdict.off)), verdict.to_json())

    def to_json(self) -> dict[str, Any]:
        return {"root": str(self.root), "key": dict(self.key)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerdictStore:
        return cls(Path(data["root"]), data["key"])


@dataclass(frozen=True)
class SearchRecord:
    """search.json: every probe of one search, in rounds, and what it found."""

    name: str  # fusion_bisect | precision_bisect
    ranking: tuple[Mapping[str, Any], ...]  # candidates, most suspect first, with the evidence
    probes: tuple[Mapping[str, Any], ...]  # round, off, passed, samples_passed, worst, seconds, from_disk
    status: str  # FOUND, NOT_AMONG_CANDIDATES, or UNFINISHED
    culprits: tuple[str, ...]  # switch these off; under UNFINISHED, the best passing configuration so far
    groups: tuple[tuple[str, ...], ...] = ()
    stopped_by: str | None = None  # the budget setting that ran out
    floor: Mapping[str, Any] | None = None  # precision_bisect's noise floor (`noise_floor.py`)

    @property
    def candidates(self) -> list[str]:
        return [entry["name"] for entry in self.ranking]

    @property
    def kept(self) -> list[str]:
        """The candidates the answer leaves as they were: fusions that stay on, nodes that stay reduced."""
        return [name for name in self.candidates if name not in self.culprits]

    @property
    def minimal(self) -> bool:
        """Proven 1-minimal: false when a budget stopped the search."""
        return self.status != UNFINISHED

    def final_verdict(self, nothing_off: Mapping[str, Any]) -> dict[str, Any]:
        """The verdict of the answer: its probe, or `nothing_off` (the compare stage's verdict, shaped like a
        probe's) when nothing is switched off."""
        if not self.culprits:
            return {"off": [], **nothing_off}
        probe = next(p for p in self.probes if sorted(p["off"]) == sorted(self.culprits))
        return {key: probe[key] for key in ("off", "passed", "samples_passed", "worst")}

    def to_json(self) -> dict[str, Any]:
        return {"format": SEARCH_FORMAT, "name": self.name, "ranking": list(self.ranking), "probes": list(self.probes),
                "status": self.status, "culprits": list(self.culprits), "groups": [list(g) for g in self.groups],
                "stopped_by": self.stopped_by, "floor": self.floor}

    @classmethod
    def read(cls, path: str | Path) -> SearchRecord:
        return read_record(path, "search record", SEARCH_FORMAT, lambda d: cls(
            d["name"], tuple(d["ranking"]), tuple(d["probes"]), d["status"], tuple(d["culprits"]),
            tuple(tuple(g) for g in d["groups"]), d["stopped_by"], d["floor"]))


def search(name: str, ranking: Sequence[Mapping[str, Any]], nothing_off_passes: bool, store: VerdictStore,
           probe: Prober, parallel: int, threads: int, budget: Budget) -> SearchRecord:
    """Runs the strategy to its answer, or until the budget runs out, probing what the disk does not know."""
    candidates = [entry["name"] for entry in ranking]
    known: dict[Config, bool] = {frozenset(): nothing_off_passes}
    probes: list[dict[str, Any]] = []
    progress = Progress(name, len(candidates))
    while not isinstance(step := next_probes(candidates, known, parallel), Answer):
        verdicts = {config: store.read(config) for config in step.probes}
        new = [config for config, verdict in verdicts.items() if verdict is None]
        room, limit = budget.room(len(probes) + len(step.probes) - len(new), progress.seconds())
        running = new if room is None else new[:room]
        progress.round(step, len(running), len(probes))
        started = time.monotonic()
        verdicts.update(run_round(probe, running, store, threads))
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


def run_round(probe: Prober, configs: Sequence[Config], store: VerdictStore,
              threads: int) -> dict[Config, VerdictRecord]:
    """The round's probes side by side, each on an equal share of the job's threads; each verdict is on
    disk as soon as it is known."""
    if not configs:
        return {}
    workers = max(1, min(threads, len(configs)))
    run = functools.partial(_probed, probe, store, max(1, threads // workers))
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(configs, pool.map(run, configs), strict=True))


def _probed(probe: Prober, store: VerdictStore, threads: int, config: Config) -> VerdictRecord:
    """One probe, timed; its verdict written before it is returned."""
    start = time.perf_counter()
    judged = probe(config, threads)
    verdict = VerdictRecord.of(config, judged, round(time.perf_counter() - start, 3))
    store.write(verdict)
    return verdict


def judged(probe: Prober, store: VerdictStore, threads: int, config: Config) -> VerdictRecord:
    """One configuration's verdict: from disk, or probed now with every thread."""
    return store.read(config) or run_round(probe, [config], store, threads)[config]


def probe_entry(round_index: int, verdict: VerdictRecord, from_disk: bool) -> dict[str, Any]:
    """A probe as search.json and result.json list it."""
    return {"round": round_index, "off": list(verdict.off), "passed": verdict.passed,
            "samples_passed": [s["passed"] for s in verdict.samples], "worst": verdict.worst,
            "seconds": verdict.seconds, "from_disk": from_disk}


def unfinished(name: str, ranking: Sequence[Mapping[str, Any]], probes: Sequence[Mapping[str, Any]],
               limit: str | None) -> SearchRecord:
    """The search stopped by its budget: the passing configuration with the fewest candidates off, the
    earliest probed among equals, not proven minimal."""
    order = {entry["name"]: index for index, entry in enumerate(ranking)}
    passing = [probe["off"] for probe in probes if probe["passed"]]
    best = min(passing, key=len, default=[])
    return SearchRecord(name, tuple(ranking), tuple(probes), UNFINISHED, tuple(sorted(best, key=order.__getitem__)),
                        stopped_by=limit)


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
            log.info("%s round %d: %d probe(s) running, %d done · %s · culprits so far: %s · %s elapsed%s",
                     self.name, self.rounds, running, done, self._suspects(step), listed(step.culprits) or "none",
                     _clock(self.seconds()), self._eta(step))

    def probed(self, seconds: float) -> None:
        self.probing_seconds += seconds
        self.probed_rounds += 1

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
