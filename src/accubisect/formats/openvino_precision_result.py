"""result.json of precision_bisect on `backend: openvino-cpu` (written by `bisection/openvino_precision.py`):
the executed nodes kept in f32, the ONNX nodes they stand for, every probe and the published IR's verdict.

Versioned like every stage record, so a result of another accubisect version is a one-line "delete ... and
rerun" error, never a KeyError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record

OPENVINO_PRECISION_FORMAT = 1


@dataclass(frozen=True)
class OpenVinoPrecisionResult:
    """result.json."""

    status: str  # nothing to fix | fixed (an answer that fails read back stops the job: nothing is written)
    dtype: str  # precision.dtype
    candidates: int  # executed nodes the plugin runs in the reduced type
    ranking: tuple[Mapping[str, Any], ...]  # per executed node, most suspect first: name, added_error, original_nodes
    not_keepable: tuple[str, ...]  # executed nodes whose `precise` mark the plugin drops
    kept_fp32: tuple[str, ...]  # the answer: executed nodes kept in f32
    keep_dtype: tuple[str, ...]  # the answer as the user's ONNX nodes (keep_dtype.txt)
    probes: tuple[Mapping[str, Any], ...]  # every probe, in order
    seconds: float
    final_verdict: Mapping[str, Any]  # the published IR's: passed, worst, dropped (marks the plugin dropped)

    def to_json(self) -> dict[str, Any]:
        return {"format": OPENVINO_PRECISION_FORMAT, "status": self.status, "backend": "openvino-cpu",
                "dtype": self.dtype, "candidates": self.candidates, "ranking": list(self.ranking),
                "not_keepable": list(self.not_keepable), "kept_fp32": list(self.kept_fp32),
                "keep_dtype": list(self.keep_dtype), "probes": list(self.probes), "seconds": self.seconds,
                "final_verdict": dict(self.final_verdict)}

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> OpenVinoPrecisionResult:
        return read_record(path, "OpenVINO precision_bisect result", OPENVINO_PRECISION_FORMAT, lambda d: cls(
            d["status"], d["dtype"], int(d["candidates"]), tuple(d["ranking"]), tuple(d["not_keepable"]),
            tuple(d["kept_fp32"]), tuple(d["keep_dtype"]), tuple(d["probes"]), d["seconds"], d["final_verdict"]))
