"""result.json of fusion_bisect and precision_bisect on ONNX Runtime (written by the result job,
`bisection/jobs.py`): every probe, the answer and its verdict; each kind adds its own fields.

Versioned like every stage record, so a result of another accubisect version is a one-line "delete ... and
rerun" error, never a KeyError. The keys keep the order users and the golden files read them in: the format
first, then each kind's own order (`FUSION_KEYS`, `PRECISION_KEYS`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.finalize_record import FinalizeRecord
from accubisect.formats.record import read_record
from accubisect.formats.search_record import ProbeEntry

BISECT_RESULT_FORMAT = 1
COMMON_KEYS = ("candidates", "ranking", "ranking_use", "probes", "culprits", "groups", "minimal", "search",
               "final_verdict", "kept")
FUSION_KEYS = ("candidates", "ranking", "ranking_use", "probes", "culprits", "groups", "minimal", "search",
               "final_verdict", "fusion_on_verdict", "kept", "already_off")
PRECISION_KEYS = ("status", "mode", "dtype", "graph", "candidates", "ranking", "ranking_use", "floor", "probes",
                  "culprits", "groups", "minimal", "search", "kept", "kept_fp32", "keep_dtype", "final_verdict",
                  "reduced_verdict", "mixlist_black", "assigned", "deployed", "model")


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
    final_verdict: Mapping[str, Any]  # the answer's: `off`, `passed`, `samples_passed`, `worst` (a probe's shape)
    kept: tuple[str, ...]  # the candidates left as they were

    def to_json(self) -> dict[str, Any]:
        return self._ordered(COMMON_KEYS, {})

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    def _ordered(self, keys: Sequence[str], own: Mapping[str, Any]) -> dict[str, Any]:
        """The file's JSON: the format, then the common fields and the kind's `own`, in the order `keys`."""
        fields = {"candidates": list(self.candidates), "ranking": list(self.ranking), "ranking_use": self.ranking_use,
                  "probes": list(self.probes), "culprits": list(self.culprits),
                  "groups": [list(group) for group in self.groups], "minimal": self.minimal, "search": self.search,
                  "final_verdict": dict(self.final_verdict), "kept": list(self.kept), **own}
        return {"format": BISECT_RESULT_FORMAT, **{key: fields[key] for key in keys}}


def common_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """The fields every kind's result.json has, as `BisectResult` takes them."""
    return {"candidates": tuple(d["candidates"]), "ranking": tuple(d["ranking"]), "ranking_use": d["ranking_use"],
            "probes": tuple(d["probes"]), "culprits": tuple(d["culprits"]),
            "groups": tuple(tuple(group) for group in d["groups"]), "minimal": d["minimal"], "search": d["search"],
            "final_verdict": d["final_verdict"], "kept": tuple(d["kept"])}


@dataclass(frozen=True)
class FusionResult(BisectResult):
    """fusion_bisect's result.json."""

    fusion_on_verdict: Mapping[str, Any]  # nothing switched off: the comparison's `passed` and `worst`
    already_off: tuple[str, ...]  # the rules compile.fusion_switch switched off before the search

    def to_json(self) -> dict[str, Any]:
        return self._ordered(FUSION_KEYS, {"fusion_on_verdict": dict(self.fusion_on_verdict),
                                           "already_off": list(self.already_off)})

    @classmethod
    def read(cls, path: str | Path) -> FusionResult:
        return read_record(path, "fusion_bisect result", BISECT_RESULT_FORMAT, lambda d: cls(
            **common_fields(d), fusion_on_verdict=d["fusion_on_verdict"], already_off=tuple(d["already_off"])))


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
    reduced_verdict: Mapping[str, Any]  # nothing kept in fp32: the comparison's `passed` and `worst`
    mixlist_black: tuple[str, ...]
    assigned: Mapping[str, Any]  # the search's own answer on the graph precision was assigned on
    deployed: Mapping[str, Any]  # how the answer became the deployable one (deployed.json's `how`, `carried`, ...)
    model: FinalizeRecord  # model.onnx (finalize.json)

    def to_json(self) -> dict[str, Any]:
        return self._ordered(PRECISION_KEYS, {
            "status": self.status, "mode": self.mode, "dtype": self.dtype, "graph": self.graph, "floor": self.floor,
            "kept_fp32": self.kept_fp32, "keep_dtype": list(self.keep_dtype),
            "reduced_verdict": dict(self.reduced_verdict), "mixlist_black": list(self.mixlist_black),
            "assigned": dict(self.assigned), "deployed": dict(self.deployed), "model": self.model.to_json()})

    @classmethod
    def read(cls, path: str | Path) -> PrecisionResult:
        return read_record(path, "precision_bisect result", BISECT_RESULT_FORMAT, lambda d: cls(
            **common_fields(d), status=d["status"], mode=d["mode"], dtype=d["dtype"], graph=d["graph"],
            floor=d["floor"], kept_fp32=d["kept_fp32"], keep_dtype=tuple(d["keep_dtype"]),
            reduced_verdict=d["reduced_verdict"], mixlist_black=tuple(d["mixlist_black"]), assigned=d["assigned"],
            deployed=d["deployed"], model=FinalizeRecord.of(d["model"], path)))
