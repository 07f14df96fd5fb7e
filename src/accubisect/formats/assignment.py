"""assignment.json: which compiled nodes run in reduced precision (written by the precision stage,
`stages/precision_stage.py`; read by local errors, the precision bisection and its finalize job)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record

ASSIGNMENT_FORMAT = 1
KIND = "precision assignment"


@dataclass(frozen=True)
class Assignment:
    """assignment.json."""

    mode: str  # precision.mode
    dtype: str  # the reduced type: fp16 or bf16
    graph: str  # the graph precision was assigned on: compiled or original
    reduced: tuple[str, ...]  # nodes of that graph that run in `dtype`, in topological order
    keep_dtype: tuple[str, ...]  # precision.keep_dtype resolved to that graph's nodes, sorted
    control_flow_fp32: tuple[str, ...]  # If/Loop nodes, kept in fp32, sorted
    lists: Mapping[str, str]  # node -> white, black or gray
    dtypes: Mapping[str, str]  # tensor -> dtype, as ORT types the graph

    def to_json(self) -> dict[str, Any]:
        return {"format": ASSIGNMENT_FORMAT, "mode": self.mode, "dtype": self.dtype, "graph": self.graph,
                "reduced": list(self.reduced), "keep_dtype": list(self.keep_dtype),
                "control_flow_fp32": list(self.control_flow_fp32), "lists": dict(self.lists),
                "dtypes": dict(self.dtypes)}

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> Assignment:
        return cls(data["mode"], data["dtype"], data["graph"], tuple(data["reduced"]), tuple(data["keep_dtype"]),
                   tuple(data["control_flow_fp32"]), dict(data["lists"]), dict(data["dtypes"]))

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> Assignment:
        return read_record(path, KIND, ASSIGNMENT_FORMAT, cls._build)
