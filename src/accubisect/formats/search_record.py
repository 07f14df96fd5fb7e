"""search.json: every probe of one bisection's search, in rounds, and what it found (the search job writes it,
`bisection/jobs.py`; the result job and pruning read it).

Versioned: a reader checks the format, so a workspace of another version is a one-line "delete ... and
rerun" error, never a KeyError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record

SEARCH_FORMAT = 1
UNFINISHED = "unfinished"  # a budget ran out: the answer is the best passing configuration so far


class ProbeEntry(TypedDict):
    """One probe as search.json and result.json list it."""

    round: int
    off: list[str]  # the configuration: the candidates switched off
    passed: bool
    samples_passed: list[bool]  # per sample judged, in order
    worst: Mapping[str, float]  # output metrics, worst over those samples
    seconds: float
    from_disk: bool  # its verdict was on disk: this run did not probe it


@dataclass(frozen=True)
class SearchRecord:
    """search.json: every probe of one search, in rounds, and what it found."""

    name: str  # fusion_bisect | precision_bisect
    ranking: tuple[Mapping[str, Any], ...]  # candidates, most suspect first, with the evidence
    probes: tuple[ProbeEntry, ...]
    status: str  # FOUND, NOT_AMONG_CANDIDATES, UNFINISHED, or CUT_FOUND (reduce's sides: culprits, the cut's config)
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

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> SearchRecord:
        return read_record(path, "search record", SEARCH_FORMAT, lambda d: cls(
            d["name"], tuple(d["ranking"]), tuple(d["probes"]), d["status"], tuple(d["culprits"]),
            tuple(tuple(g) for g in d["groups"]), d["stopped_by"], d["floor"]))
