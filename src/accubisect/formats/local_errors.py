"""local.json: the error each compiled node makes run alone on the reference's own tensors (written by the
local-error stage, `stages/local_error.py`; attached to the compare report's rows)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record, record_from

LOCAL_FORMAT = 1
KIND = "local-error record"


@dataclass(frozen=True)
class LocalErrors:
    """local.json. No tolerance is involved, so changing rtol/atol does not recompute it."""

    nodes: Mapping[str, Mapping[str, float]]  # node -> its metrics, worst over samples (`metrics.worst_over`)
    skipped: tuple[str, ...]  # nodes whose tensors a reference dump lacks, sorted

    def to_json(self) -> dict[str, Any]:
        return {"format": LOCAL_FORMAT, "nodes": {node: dict(m) for node, m in self.nodes.items()},
                "skipped": list(self.skipped)}

    @classmethod
    def from_json(cls, data: Any, source: str | Path) -> LocalErrors:
        """`data` read from `source` (named in the error when it is not a record of this version)."""
        return record_from(data, source, KIND, LOCAL_FORMAT, cls._build)

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> LocalErrors:
        return cls(dict(data["nodes"]), tuple(data["skipped"]))

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> LocalErrors:
        return read_record(path, KIND, LOCAL_FORMAT, cls._build)
