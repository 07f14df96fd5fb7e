"""reduce.json: the subgraph `snakemake reduce` cut the original model down to, every probe of its search
and the repro run both ways (written by the reduce job, `bisection/reduce.py`).

Each probe names its verdict's key in the reduce probe store, so pruning keeps the verdicts the last reduce
used (`workflow/workspace.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record

REDUCE_FORMAT = 1
KIND = "reduce record"


@dataclass(frozen=True)
class ReduceProbe:
    """One step of the search: a subgraph probed (or its verdict read from disk)."""

    phase: str  # outputs | inputs: which side of the model the step cuts
    key: str  # its verdict's key in the reduce probe store
    nodes: int  # how many nodes of the original it keeps
    outputs: tuple[str, ...]
    passed: bool  # true where it does not show the bug
    worst: Mapping[str, Any]
    seconds: float
    from_disk: bool

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "key": self.key, "nodes": self.nodes, "outputs": list(self.outputs),
                "passed": self.passed, "worst": dict(self.worst), "seconds": self.seconds, "from_disk": self.from_disk}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReduceProbe:
        return cls(data["phase"], data["key"], data["nodes"], tuple(data["outputs"]), data["passed"], data["worst"],
                   data["seconds"], data["from_disk"])


@dataclass(frozen=True)
class ReproRun:
    """repro.py run as a user runs it."""

    command: str  # e.g. "python repro.py --fusion-switch <answer>"
    exit: int
    last_line: str  # of its output

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "exit": self.exit, "last_line": self.last_line}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReproRun:
        return cls(data["command"], data["exit"], data["last_line"])


@dataclass(frozen=True)
class ReduceRecord:
    """reduce.json."""

    bisection: str  # fusion | precision: whose candidate the repro is cut from
    model: str  # the user's model
    model_nodes: int
    nodes: tuple[str, ...]  # the repro's nodes, in the original's order
    outputs: tuple[str, ...]  # the repro's outputs
    inputs: tuple[str, ...]  # fed per sample from the reference
    constants: tuple[str, ...]  # boundary tensors baked into the repro as initializers
    computed: tuple[str, ...]  # reference tensors computed by running the model (no dump held them whole)
    from_dump: tuple[str, ...]  # reference tensors read from the reference dumps
    first_divergence: str | None  # the comparison's, where the search started
    steps: tuple[ReduceProbe, ...]
    as_written: ReproRun  # must exit 1
    with_answer: ReproRun  # must exit 0
    seconds: float

    @property
    def repro_nodes(self) -> int:
        return len(self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {"format": REDUCE_FORMAT, "bisection": self.bisection, "model": self.model,
                "model_nodes": self.model_nodes, "repro_nodes": self.repro_nodes, "nodes": list(self.nodes),
                "outputs": list(self.outputs), "inputs": list(self.inputs), "constants": list(self.constants),
                "computed": list(self.computed), "from_dump": list(self.from_dump),
                "first_divergence": self.first_divergence, "steps": [step.to_json() for step in self.steps],
                "verification": {"as_written": self.as_written.to_json(), "with_answer": self.with_answer.to_json()},
                "seconds": self.seconds}

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> ReduceRecord:
        verification = data["verification"]
        return cls(data["bisection"], data["model"], data["model_nodes"], tuple(data["nodes"]), tuple(data["outputs"]),
                   tuple(data["inputs"]), tuple(data["constants"]), tuple(data["computed"]), tuple(data["from_dump"]),
                   data["first_divergence"], tuple(ReduceProbe.from_json(step) for step in data["steps"]),
                   ReproRun.from_json(verification["as_written"]), ReproRun.from_json(verification["with_answer"]),
                   data["seconds"])

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> ReduceRecord:
        return read_record(path, KIND, REDUCE_FORMAT, cls._build)
