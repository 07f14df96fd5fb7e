"""finalize.json: how the deployable model.onnx was made and checked (written by `precision_deploy`,
`bisection/deploy_publish.py`; carried in deployed.json and the precision result's `model`).

Versioned like every stage record, so a finalize.json of another accubisect version is a one-line "delete ...
and rerun" error, never a KeyError. `passed` and `worst` exist only where ONNX Runtime ran the model (a bf16
model on the CPU is only checked by `onnx.checker`), so the file holds them only then.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record, record_from

FINALIZE_FORMAT = 1
KIND = "record of the mixed-precision model"


@dataclass(frozen=True)
class FinalizeRecord:
    """finalize.json."""

    model: str  # the user's model file name
    dtype: str  # the low type: fp16 or bf16
    graph: str  # the graph precision was assigned on: compiled or original
    reduced_original_nodes: int  # the user's nodes that compute in the low type
    original_nodes: int  # every node of the user's model
    checked: str  # how the model was verified, one phrase
    passed: bool | None  # its verdict on every sample; None where ORT cannot run it
    worst: Mapping[str, float] | None  # its worst output metrics; None where ORT cannot run it

    def to_json(self) -> dict[str, Any]:
        run = {} if self.passed is None else {"passed": self.passed, "worst": dict(self.worst or {})}
        return {"format": FINALIZE_FORMAT, "model": self.model, "dtype": self.dtype, "graph": self.graph,
                "reduced_original_nodes": self.reduced_original_nodes, "original_nodes": self.original_nodes,
                "checked": self.checked, **run}

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> FinalizeRecord:
        return read_record(path, KIND, FINALIZE_FORMAT, cls._build)

    @classmethod
    def of(cls, data: Any, source: str | Path) -> FinalizeRecord:
        """The record held inside another file (deployed.json's `model`), `source` naming that file."""
        return record_from(data, source, KIND, FINALIZE_FORMAT, cls._build)

    @classmethod
    def _build(cls, d: dict[str, Any]) -> FinalizeRecord:
        return cls(d["model"], d["dtype"], d["graph"], int(d["reduced_original_nodes"]), int(d["original_nodes"]),
                   d["checked"], d.get("passed"), d.get("worst"))
