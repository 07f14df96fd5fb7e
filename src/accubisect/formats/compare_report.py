"""report.json: a comparison of two variants' dumps, tensor by tensor, and the model outputs judged (written
by the compare stage, `stages/compare.py`; read by the reports, the bisections and `accubisect judge`).

A tensor's metrics per sample stay a mapping of metric name -> value (`core/metrics.py` names them), with
`reasons` and `passed` once judged; so do the output verdicts `accuracy.judge_outputs` makes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record, record_from

REPORT_FORMAT = 2  # 2: model_sha256, the compared model's (1 had none)
KIND = "compare report"
Metrics = Mapping[str, Any]  # metric name -> value; judged: also `reasons` and `passed`


@dataclass(frozen=True)
class TensorRow:
    """One tensor both dumps hold, with the candidate's node that made it."""

    tensor: str
    index: int  # the node's, in the candidate's topological order
    output: int  # which output of the node it is
    node: str
    op_type: str
    rule: str | None
    rules: tuple[str, ...]
    original_nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    samples: Mapping[str, Metrics]  # sample -> metrics
    passed: bool = False  # judged: every sample passes
    worst: Mapping[str, float] = field(default_factory=dict)  # over samples (`metrics.worst_over`)
    mean: Mapping[str, float] = field(default_factory=dict)
    details: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # sample -> histograms, worst elements
    local: Mapping[str, float] | None = None  # the error its node makes alone (None: not measured)
    unfaithful: str = ""  # why a dump of it is not what the undumped program computes ("": it is; runtime/backends)

    def to_json(self, with_local: bool) -> dict[str, Any]:
        data = {"tensor": self.tensor, "index": self.index, "output": self.output, "node": self.node,
                "op_type": self.op_type, "rule": self.rule, "rules": list(self.rules),
                "original_nodes": list(self.original_nodes), "inputs": list(self.inputs),
                "samples": {sample: dict(metrics) for sample, metrics in self.samples.items()}, "passed": self.passed,
                "worst": dict(self.worst), "mean": dict(self.mean), "details": dict(self.details),
                **({"unfaithful": self.unfaithful} if self.unfaithful else {})}
        return {**data, "local": self.local} if with_local else data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorRow:
        return cls(data["tensor"], data["index"], data["output"], data["node"], data["op_type"], data["rule"],
                   tuple(data["rules"]), tuple(data["original_nodes"]), tuple(data["inputs"]), data["samples"],
                   data["passed"], data["worst"], data["mean"], data["details"], data.get("local"),
                   data.get("unfaithful", ""))


@dataclass(frozen=True)
class SampleVerdict:
    """One sample's model outputs judged (`accuracy.judge_outputs`: passed, reasons, outputs)."""

    sample: str
    against: str  # "golden" or "reference"
    candidate: Mapping[str, Any]
    reference: Mapping[str, Any] | None = None  # the reference judged too, against golden outputs

    def to_json(self) -> dict[str, Any]:
        data = {"sample": self.sample, "against": self.against, "candidate": self.candidate}
        return data if self.reference is None else {**data, "reference": self.reference}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SampleVerdict:
        return cls(data["sample"], data["against"], data["candidate"], data.get("reference"))


@dataclass(frozen=True)
class Divergence:
    """The first failing tensor in topological order: where error first appears."""

    tensor: str
    index: int
    node: str
    op_type: str
    rule: str | None
    rules: tuple[str, ...]
    original_nodes: tuple[str, ...]
    worst: Mapping[str, float]
    failing_samples: tuple[str, ...]

    @classmethod
    def of(cls, row: TensorRow) -> Divergence:
        failing = tuple(sample for sample, result in row.samples.items() if not result["passed"])
        return cls(row.tensor, row.index, row.node, row.op_type, row.rule, row.rules, row.original_nodes, row.worst,
                   failing)

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "index": self.index, "node": self.node, "op_type": self.op_type,
                "rule": self.rule, "rules": list(self.rules), "original_nodes": list(self.original_nodes),
                "worst": dict(self.worst), "failing_samples": list(self.failing_samples)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Divergence:
        return cls(data["tensor"], data["index"], data["node"], data["op_type"], data["rule"], tuple(data["rules"]),
                   tuple(data["original_nodes"]), data["worst"], tuple(data["failing_samples"]))


@dataclass(frozen=True)
class LocalGrowth:
    """The tensor whose mismatch grows most over its inputs': where error is made rather than inherited."""

    tensor: str
    growth: float

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "growth": self.growth}


@dataclass(frozen=True)
class CompareReport:
    """report.json. Measured by `compare.build_report`, judged by `compare.judge_report` (which returns a new
    report, so a saved one can be judged again with other thresholds)."""

    reference: str  # the variants' names
    candidate: str
    accuracy: Mapping[str, Any]  # the config's accuracy section (`AccuracyCheck`), ntol and cosine as last judged
    low_precision: str  # the type whose range the overflow metrics count against
    samples: tuple[str, ...]
    statistics_only: bool
    verdicts: tuple[SampleVerdict, ...]
    tensors: tuple[TensorRow, ...]  # in the candidate's topological order
    passed: bool = False  # judged: the candidate passes the check (`AccuracyCheck.passes` of its samples)
    first_divergence: Divergence | None = None
    worst_local: LocalGrowth | None = None
    local_skipped: tuple[str, ...] | None = None  # nodes without local error; None: local errors not attached
    model_sha256: str = ""  # the user's model both dumps were made from: what explorer-data --model checks

    def to_json(self) -> dict[str, Any]:
        with_local = self.local_skipped is not None
        data = {"format": REPORT_FORMAT, "model_sha256": self.model_sha256, "reference": self.reference,
                "candidate": self.candidate,
                "accuracy": dict(self.accuracy), "low_precision": self.low_precision, "samples": list(self.samples),
                "statistics_only": self.statistics_only, "verdicts": [v.to_json() for v in self.verdicts],
                "tensors": [row.to_json(with_local) for row in self.tensors], "passed": self.passed,
                "first_divergence": self.first_divergence.to_json() if self.first_divergence else None,
                "worst_local": self.worst_local.to_json() if self.worst_local else None}
        return {**data, "local_skipped": list(self.local_skipped)} if with_local else data

    @classmethod
    def from_json(cls, data: Any, source: str | Path) -> CompareReport:
        """`data` read from `source` (named in the error when it is not a compare report of this version)."""
        return record_from(data, source, KIND, REPORT_FORMAT, cls._build)

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> CompareReport:
        divergence, local = data["first_divergence"], data["worst_local"]
        skipped = data.get("local_skipped")
        return cls(data["reference"], data["candidate"], data["accuracy"], data["low_precision"],
                   tuple(data["samples"]), data["statistics_only"],
                   tuple(SampleVerdict.from_json(v) for v in data["verdicts"]),
                   tuple(TensorRow.from_json(row) for row in data["tensors"]), data["passed"],
                   Divergence.from_json(divergence) if divergence is not None else None,
                   LocalGrowth(local["tensor"], local["growth"]) if local is not None else None,
                   tuple(skipped) if skipped is not None else None, data["model_sha256"])

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> CompareReport:
        return read_record(path, KIND, REPORT_FORMAT, cls._build)
