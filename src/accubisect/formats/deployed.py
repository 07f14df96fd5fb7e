"""deployed.json: the precision answer in the deployable model's terms (written by `precision_deploy`,
`bisection/deployable.py`; read by the result job).

The search decides per node of the graph precision was assigned on; the deployable model is the user's own
graph converted to mixed precision. This record says which of the user's nodes stay fp32 in it, how that
set was reached from the search's answer (verified as carried over, made 1-minimal, or searched again on
the user's graph because the carried-over answer failed there), every probe of that pass and the deployable
model's verdict — the answer's verdict. A verdict shows its first failing sample's `reasons`: the outputs'
checks, or, for a configuration failed without a run, the activation it would store beyond the low type's
range (`deployable.LowRange`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.bisect_result import ResultVerdict
from accubisect.formats.files import write_json
from accubisect.formats.finalize_record import FinalizeRecord
from accubisect.formats.record import read_record
from accubisect.formats.search_record import ProbeEntry

DEPLOYED_FORMAT = 2  # 1 held finalize.json's fields with no format of their own
KIND = "record of the deployable answer"
VERIFIED, MINIMIZED, SEARCHED = "verified", "minimized", "searched again"  # `how`


@dataclass(frozen=True)
class DeployedRecord:
    """deployed.json."""

    candidates: tuple[str, ...]  # the user's nodes the deployable model may run reduced, in the model's order
    carried: tuple[str, ...]  # the search's answer carried to the user's nodes: kept fp32
    carried_verdict: ResultVerdict  # its verdict in the deployable model
    how: str  # VERIFIED (already 1-minimal), MINIMIZED (nodes dropped), SEARCHED (the carried answer failed)
    keep: tuple[str, ...]  # the answer: the user's nodes kept fp32
    verdict: ResultVerdict  # the answer's verdict in the deployable model
    probes: tuple[ProbeEntry, ...]  # every probe of this pass, in order
    minimal: bool  # proven 1-minimal in the deployable model
    stopped_by: str | None  # the budget setting that stopped the pass
    mixlist_black: tuple[str, ...]  # op types every reduced node of which must stay fp32 (at least two)
    model: FinalizeRecord  # finalize.json: how model.onnx was made and checked

    def to_json(self) -> dict[str, Any]:
        return {"format": DEPLOYED_FORMAT, "candidates": list(self.candidates), "carried": list(self.carried),
                "carried_verdict": self.carried_verdict.to_json(), "how": self.how, "keep": list(self.keep),
                "verdict": self.verdict.to_json(), "probes": list(self.probes), "minimal": self.minimal,
                "stopped_by": self.stopped_by, "mixlist_black": list(self.mixlist_black), "model": self.model.to_json()}

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> DeployedRecord:
        return read_record(path, KIND, DEPLOYED_FORMAT, lambda d: cls(
            tuple(d["candidates"]), tuple(d["carried"]), ResultVerdict.of(d["carried_verdict"]), d["how"],
            tuple(d["keep"]), ResultVerdict.of(d["verdict"]), tuple(d["probes"]), d["minimal"], d["stopped_by"],
            tuple(d["mixlist_black"]), FinalizeRecord.of(d["model"], path)))
