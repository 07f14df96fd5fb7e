"""Judging a session against the samples: what a probe, and the verification of a deployable model, ask.

The samples, what each is judged against, the accuracy check and its val_func are loaded once and judge
many sessions: a bisection probes dozens of configurations in one process. A probe stops at the first
sample that decides its verdict (`AccuracyCheck.decided`), since with `min_pass_fraction` 1 (the default)
one failing sample fails it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accubisect.core.accuracy import AccuracyCheck, Judged, SampleJudged, ValFunc
from accubisect.formats.config_sections import AccuracySection
from accubisect.formats.dump_file import DumpReader
from accubisect.formats.samples import load_arrays, load_golden
from accubisect.formats.val_func import load_val_func
from accubisect.runtime import ort_compile


@dataclass(frozen=True)
class SampleArrays:
    """One sample loaded for judging: its input arrays and the reference outputs it is judged against (its
    files are a `formats.samples.Sample`)."""

    name: str
    inputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]


@dataclass(frozen=True)
class SampleJudge:
    samples: tuple[SampleArrays, ...]
    output_names: tuple[str, ...]
    check: AccuracyCheck
    val_func: ValFunc | None  # the check's, loaded

    @classmethod
    def load(cls, sample_inputs: Sequence[str | Path], references: Sequence[str | Path], output_names: Sequence[str],
             accuracy: AccuracySection) -> SampleJudge:
        samples = tuple(SampleArrays(Path(inputs).name, load_arrays(Path(inputs)),
                               load_reference(Path(reference), output_names))
                        for inputs, reference in zip(sample_inputs, references, strict=True))
        check = AccuracyCheck.from_config(accuracy)
        return cls(samples, tuple(output_names), check, load_val_func(check))

    def judge(self, runner: ort_compile.Runner, stop_early: bool = True) -> Judged:
        """`passed`, per-sample verdicts and the `worst` output metrics; with `stop_early`, samples are run
        only until the verdict is certain, and `samples` holds those that were."""
        judged: list[SampleJudged] = []
        for sample in self.samples:
            outputs = runner.infer(sample.inputs, self.output_names)
            judged.append({"inputs": sample.name,
                           **self.check.judge_outputs(sample.reference, outputs, self.val_func)})
            if stop_early and self.check.decided([s["passed"] for s in judged], len(self.samples)):
                break
        return self.check.judge(judged, len(self.samples))


def load_reference(path: Path, output_names: Sequence[str]) -> dict[str, np.ndarray]:
    """Golden outputs (.npz) or the model outputs held in a reference dump."""
    if path.suffix == ".npz":
        return load_golden(path)
    with DumpReader(path) as dump:
        return {name: dump.read_output(name) for name in output_names}
