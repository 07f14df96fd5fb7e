"""verdict.json: one probe's verdict on one configuration, and the store that keeps one file per
configuration (`VerdictStore`), so that any run of a search with the same inputs finds the verdicts on disk.

Versioned: a reader checks the format, so a workspace of another version is a one-line "delete ... and
rerun" error, never a KeyError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.core.accuracy import Judged
from accubisect.core.strategy import Configuration
from accubisect.formats.digest import stage_key
from accubisect.formats.files import read_json, write_json
from accubisect.formats.paths import verdict_file
from accubisect.formats.record import record_from

VERDICT_FORMAT = 1  # verdict.json written before the field existed has none: the same layout, read as 1


@dataclass(frozen=True)
class VerdictRecord:
    """verdict.json: one probe's verdict on one configuration."""

    off: tuple[str, ...]  # the configuration: the candidates switched off, sorted
    passed: bool
    samples: tuple[Mapping[str, Any], ...]  # per sample run, in order, until the verdict was certain
    worst: Mapping[str, float]  # output metrics, worst over those samples
    seconds: float  # the probe's wall time
    not_applied: tuple[str, ...] = ()  # candidates the backend would not switch off (OpenVINO: marks it dropped)

    @classmethod
    def of(cls, config: Configuration, judged: Judged, seconds: float) -> VerdictRecord:
        """The record of a probe: `judged` is what `SampleJudge.judge` returns, with what the backend did not
        apply where it says."""
        return cls(tuple(sorted(config)), judged["passed"], tuple(judged["samples"]), judged["worst"], seconds,
                   tuple(judged.get("not_applied", ())))

    @property
    def reasons(self) -> tuple[str, ...]:
        """The first failing sample's reasons (the outputs' checks, or a tensor beyond the low type's range that
        failed it without a run); none when every sample judged passed."""
        return next((tuple(sample.get("reasons", ())) for sample in self.samples if not sample["passed"]), ())

    def to_json(self) -> dict[str, Any]:
        """The layout; `not_applied` only where a backend left something out, so ORT's files keep theirs."""
        applied = {"not_applied": list(self.not_applied)} if self.not_applied else {}
        return {"format": VERDICT_FORMAT, "off": list(self.off), "passed": self.passed, "samples": list(self.samples),
                "worst": dict(self.worst), "seconds": self.seconds, **applied}

    @classmethod
    def read(cls, path: Path) -> VerdictRecord:
        data = read_json(path)
        if isinstance(data, dict):  # written before the field existed: the same layout, format 1
            data = {"format": VERDICT_FORMAT, **data}
        return record_from(data, path, "verdict", VERDICT_FORMAT, lambda d: cls(
            tuple(d["off"]), d["passed"], tuple(d["samples"]), d["worst"], d["seconds"],
            tuple(d.get("not_applied", ()))))


@dataclass(frozen=True)
class VerdictStore:
    """Verdict files in the workspace, one per configuration, at `root/<verdict key>/verdict.json`, the key
    a hash of the search's inputs and the configuration: any run of a search with the same inputs finds
    them, whatever its budget or round structure."""

    root: Path
    key: Mapping[str, Any]  # what decides a verdict besides the configuration: model, samples, check, ...

    def key_of(self, off: Configuration) -> str:
        return stage_key(**self.key, off=sorted(off))  # `off`: verdicts already on disk keep their keys

    def path(self, off: Configuration) -> Path:
        return verdict_file(self.root, self.key_of(off))

    def read(self, off: Configuration) -> VerdictRecord | None:
        path = self.path(off)
        return VerdictRecord.read(path) if path.exists() else None

    def write(self, verdict: VerdictRecord) -> None:
        write_json(self.path(frozenset(verdict.off)), verdict.to_json())

    def to_json(self) -> dict[str, Any]:
        return {"root": str(self.root), "key": dict(self.key)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerdictStore:
        return cls(Path(data["root"]), data["key"])
