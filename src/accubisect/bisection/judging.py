"""Judging a session against the samples: what a probe, and the verification of a deployable model, ask.

The samples, what each is judged against, the tolerance and the val_func are loaded once and judge many
sessions: a bisection probes dozens of configurations in one process. A probe stops at the first sample
that decides its verdict, since with `min_pass_fraction` 1 (the default) one failing sample fails it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accubisect.core.accuracy import Tolerance, ValFunc, judge_outputs, load_val_func
from accubisect.core.metrics import worst_over
from accubisect.formats.dump_file import DumpReader
from accubisect.formats.samples import load_arrays, load_golden
from accubisect.runtime import ort_compile


@dataclass(frozen=True)
class Sample:
    name: str
    inputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]


@dataclass(frozen=True)
class SampleJudge:
    samples: tuple[Sample, ...]
    output_names: tuple[str, ...]
    tolerance: Tolerance
    val_func: ValFunc | None
    min_pass_fraction: float

    @classmethod
    def load(cls, sample_inputs: Sequence[str | Path], references: Sequence[str | Path], output_names: Sequence[str],
             accuracy: Mapping[str, Any]) -> SampleJudge:
        samples = tuple(Sample(Path(inputs).name, load_arrays(Path(inputs)),
                               load_reference(Path(reference), output_names))
                        for inputs, reference in zip(sample_inputs, references, strict=True))
        return cls(samples, tuple(output_names), Tolerance.from_config(accuracy),
                   load_val_func(accuracy.get("val_func")), accuracy["min_pass_fraction"])

    def judge(self, runner: ort_compile.Runner, stop_early: bool = True) -> dict[str, Any]:
        """`passed`, per-sample verdicts and the `worst` output metrics; with `stop_early`, samples are run
        only until the verdict is certain, and `samples` holds those that were."""
        judged: list[dict[str, Any]] = []
        for sample in self.samples:
            outputs = runner.infer(sample.inputs, self.output_names)
            judged.append({"inputs": sample.name,
                           **judge_outputs(sample.reference, outputs, self.tolerance, self.val_func)})
            if stop_early and self._decided(judged):
                break
        passed = passes([s["passed"] for s in judged], self.min_pass_fraction) and len(judged) == len(self.samples)
        return {"passed": passed, "samples": judged, "worst": worst_outputs(judged)}

    def _decided(self, judged: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the samples not run yet could no longer make the verdict pass."""
        best_case = sum(s["passed"] for s in judged) + len(self.samples) - len(judged)
        return best_case < self.min_pass_fraction * len(self.samples)


def passes(sample_verdicts: Sequence[bool], min_pass_fraction: float) -> bool:
    return bool(sample_verdicts) and sum(sample_verdicts) / len(sample_verdicts) >= min_pass_fraction


def load_reference(path: Path, output_names: Sequence[str]) -> dict[str, np.ndarray]:
    """Golden outputs (.npz) or the model outputs held in a reference dump."""
    if path.suffix == ".npz":
        return load_golden(path)
    with DumpReader(path) as dump:
        return {name: dump.read_output(name) for name in output_names}


OUTPUT_METRICS = ("max_abs", "max_rel", "cosine", "mismatch")  # a verdict's `worst`


def worst_outputs(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """OUTPUT_METRICS worst over every output of every sample (`metrics.worst_over`: NaN counts as worst);
    outputs of mismatched shapes have no metrics."""
    return worst_over([row for sample in samples for row in sample["outputs"].values() if "max_abs" in row],
                      OUTPUT_METRICS)
