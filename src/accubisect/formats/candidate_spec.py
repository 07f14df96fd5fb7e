"""candidate.json: how the repro.py that `snakemake reduce` writes compiles and judges its subgraph as the
failing candidate was (written by the reduce job, `bisection/reduce.py`).

Its one reader is that repro.py, a program of its own that carries its copy of the format number
(`bisection/repro_script.py`) and refuses another, so the record here is written, never read back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json

CANDIDATE_FORMAT = 2  # 2: the check as `check`


@dataclass(frozen=True)
class LowPrecision:
    """A precision candidate's part: the subgraph's nodes it runs in `dtype` on `backend`, and each tensor's
    dtype in the original model (what lowering needs)."""

    backend: str
    dtype: str | None
    low: tuple[str, ...]  # sorted
    dtypes: Mapping[str, str]  # tensor -> dtype, sorted by tensor

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "dtype": self.dtype, "low": list(self.low), "dtypes": dict(self.dtypes)}


@dataclass(frozen=True)
class CandidateSpec:
    kind: str  # fusion | precision: the bisection whose answer repro.py applies
    level: str  # ORT's optimization level
    session_config: Mapping[str, str]  # sorted
    disabled_optimizers: tuple[str, ...]  # ORT names: the rules the candidate has off, sorted
    providers: tuple[str, ...]
    samples: tuple[str, ...]
    check: Mapping[str, Any]  # `AccuracyCheck.to_config()`: the probes' check
    rules: Mapping[str, Mapping[str, Any]]  # every switchable rule: its `section` and ORT `optimizers`
    low_precision: LowPrecision | None = None  # None: a fusion candidate

    def to_json(self) -> dict[str, Any]:
        spec = {"format": CANDIDATE_FORMAT, "kind": self.kind, "level": self.level,
                "session_config": dict(self.session_config), "disabled_optimizers": list(self.disabled_optimizers),
                "providers": list(self.providers), "samples": list(self.samples), "check": dict(self.check),
                "rules": {rule: dict(names) for rule, names in self.rules.items()}}
        return spec if self.low_precision is None else {**spec, **self.low_precision.to_json()}

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())
