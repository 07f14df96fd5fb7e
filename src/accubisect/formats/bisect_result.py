"""result.json of fusion_bisect and precision_bisect on ONNX Runtime (written by the result job,
`bisection/jobs.py`): every probe, the answer and its verdict; each kind adds its own fields.

Versioned like every stage record, so a result of another accubisect version is a one-line "delete ... and
rerun" error, never a KeyError. The keys keep the order users and the golden files read them in: the format
first, then each kind's own order of its fields (`keys`), each field written as `_json` shows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from accubisect.formats.files import write_json
from accubisect.formats.finalize_record import FinalizeRecord
from accubisect.formats.record import read_record
from accubisect.formats.search_record import ProbeEntry
from accubisect.formats.verdict import VerdictRecord

BISECT_RESULT_FORMAT = 1


@dataclass(frozen=True)
class ResultVerdict:
    """A verdict as result.json shows it: the answer's (`final_verdict`, a probe's shape: with the configuration
    `off` and each sample's `samples_passed`, and in precision_bisect the first failing sample's `reasons`),
    or the comparison's with nothing changed (`fusion_on_verdict`, `reduced_verdict`: `passed` and `worst`).
    Not verdict.json's record: that one keeps every sample's metrics and the probe's time. A field a verdict
    does not have is None and absent from the file."""

    passed: bool
    worst: Mapping[str, float]  # output metrics, worst over the samples judged
    off: tuple[str, ...] | None = None
    samples_passed: tuple[bool, ...] | None = None
    reasons: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        fields = {"off": _listed(self.off), "passed": self.passed, "samples_passed": _listed(self.samples_passed),
                  "worst": dict(self.worst), "reasons": _listed(self.reasons)}
        return {key: value for key, value in fields.items() if value is not None}

    @classmethod
    def of_record(cls, verdict: VerdictRecord) -> ResultVerdict:
        """A probe's verdict record as result.json shows it: its configuration, each sample's verdict, the worst
        metrics and the first failing sample's reasons (precision_bisect's answers, which can fail by range
        without a run)."""
        return cls(verdict.passed, dict(verdict.worst), verdict.off, tuple(s["passed"] for s in verdict.samples),
                   verdict.reasons)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ResultVerdict:
        """A verdict as JSON shows it: result.json's and deployed.json's, a search record's probe, the
        comparison's."""
        return cls(data["passed"], dict(data["worst"]), _tupled(data.get("off")), _tupled(data.get("samples_passed")),
                   _tupled(data.get("reasons")))


def _listed(values: tuple[Any, ...] | None) -> list[Any] | None:
    return None if values is None else list(values)


def _tupled(values: Sequence[Any] | None) -> tuple[Any, ...] | None:
    return None if values is None else tuple(values)


@dataclass(frozen=True)
class AssignedAnswer:
    """precision_bisect's `assigned`: the search's own answer, on the graph precision was assigned on."""

    candidates: int  # how many nodes that graph runs reduced
    culprits: tuple[str, ...]  # its nodes the search keeps in fp32
    status: str  # the search record's (`search_record.py`)

    def to_json(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "culprits": list(self.culprits), "status": self.status}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> AssignedAnswer:
        return cls(int(data["candidates"]), tuple(data["culprits"]), data["status"])


@dataclass(frozen=True)
class DeployedAnswer:
    """precision_bisect's `deployed`: how the search's answer became the deployable one (deployed.json's)."""

    carried: tuple[str, ...]  # the search's answer carried to the user's nodes
    carried_verdict: ResultVerdict  # its verdict in the deployable model
    how: str  # verified, minimized or searched again (`deployed.py`)
    probes: tuple[Mapping[str, Any], ...]  # every probe of the deploy job, in order
    stopped_by: str | None  # the budget setting that stopped it

    def to_json(self) -> dict[str, Any]:
        return {"carried": list(self.carried), "carried_verdict": self.carried_verdict.to_json(), "how": self.how,
                "probes": list(self.probes), "stopped_by": self.stopped_by}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> DeployedAnswer:
        return cls(tuple(data["carried"]), ResultVerdict.of(data["carried_verdict"]), data["how"],
                   tuple(data["probes"]), data["stopped_by"])


@dataclass(frozen=True)
class BisectResult:
    """result.json, what every kind writes; each kind adds its own fields (`FusionResult`, `PrecisionResult`)."""

    candidates: tuple[str, ...]
    ranking: tuple[Mapping[str, Any], ...]  # per candidate, most suspect first: `name` and the evidence
    ranking_use: str  # how the ranking ordered the search, in words
    probes: tuple[ProbeEntry, ...]
    culprits: tuple[str, ...]  # the answer: switched off (fusion), kept in fp32 (precision)
    groups: tuple[tuple[str, ...], ...]  # culprits that fail only together
    minimal: bool
    search: str  # how far the search got (`answer_status`)
    final_verdict: ResultVerdict  # the answer's
    kept: tuple[str, ...]  # the candidates left as they were

    keys: ClassVar[tuple[str, ...]] = ("candidates", "ranking", "ranking_use", "probes", "culprits", "groups",
                                       "minimal", "search", "final_verdict", "kept")  # every field, in file order

    def to_json(self) -> dict[str, Any]:
        """The file's JSON: the format, then every field in the order `keys`."""
        return {"format": BISECT_RESULT_FORMAT, **{key: _json(getattr(self, key)) for key in self.keys}}

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())


def _json(value: Any) -> Any:
    """A field as result.json shows it: a record's own JSON, a tuple as a list (tuples within it too)."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json(item) for item in value]
    return value


def common_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """The fields every kind's result.json has, as `BisectResult` takes them."""
    return {"candidates": tuple(d["candidates"]), "ranking": tuple(d["ranking"]), "ranking_use": d["ranking_use"],
            "probes": tuple(d["probes"]), "culprits": tuple(d["culprits"]),
            "groups": tuple(tuple(group) for group in d["groups"]), "minimal": d["minimal"], "search": d["search"],
            "final_verdict": ResultVerdict.of(d["final_verdict"]), "kept": tuple(d["kept"])}


@dataclass(frozen=True)
class FusionResult(BisectResult):
    """fusion_bisect's result.json."""

    fusion_on_verdict: ResultVerdict  # nothing switched off: the comparison's
    already_off: tuple[str, ...]  # the rules compile.fusion_switch switched off before the search

    keys = ("candidates", "ranking", "ranking_use", "probes", "culprits", "groups", "minimal", "search",
            "final_verdict", "fusion_on_verdict", "kept", "already_off")

    @classmethod
    def read(cls, path: str | Path) -> FusionResult:
        return read_record(path, "fusion_bisect result", BISECT_RESULT_FORMAT, lambda d: cls(
            **common_fields(d), fusion_on_verdict=ResultVerdict.of(d["fusion_on_verdict"]),
            already_off=tuple(d["already_off"])))


@dataclass(frozen=True)
class PrecisionResult(BisectResult):
    """precision_bisect's result.json: the answer in the deployable model (`bisection/deployable.py`)."""

    status: str  # fixed | nothing to fix
    mode: str
    dtype: str
    graph: str  # the graph precision was assigned on
    floor: Mapping[str, Any] | None  # the noise floor (`bisection/noise_floor.py`)
    kept_fp32: str  # "<n> of <candidates> nodes"
    keep_dtype: tuple[str, ...]
    reduced_verdict: ResultVerdict  # nothing kept in fp32: the comparison's
    mixlist_black: tuple[str, ...]
    assigned: AssignedAnswer
    deployed: DeployedAnswer
    model: FinalizeRecord  # model.onnx (finalize.json)

    keys = ("status", "mode", "dtype", "graph", "candidates", "ranking", "ranking_use", "floor", "probes",
            "culprits", "groups", "minimal", "search", "kept", "kept_fp32", "keep_dtype", "final_verdict",
            "reduced_verdict", "mixlist_black", "assigned", "deployed", "model")

    @classmethod
    def read(cls, path: str | Path) -> PrecisionResult:
        return read_record(path, "precision_bisect result", BISECT_RESULT_FORMAT, lambda d: cls(
            **common_fields(d), status=d["status"], mode=d["mode"], dtype=d["dtype"], graph=d["graph"],
            floor=d["floor"], kept_fp32=d["kept_fp32"], keep_dtype=tuple(d["keep_dtype"]),
            reduced_verdict=ResultVerdict.of(d["reduced_verdict"]), mixlist_black=tuple(d["mixlist_black"]),
            assigned=AssignedAnswer.of(d["assigned"]), deployed=DeployedAnswer.of(d["deployed"]),
            model=FinalizeRecord.of(d["model"], path)))
