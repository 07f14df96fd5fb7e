"""The accuracy check: one `AccuracyCheck`, built once from the config's `accuracy` section, that every
stage asks: compare, both bisections and their instances, reduce, finalize, `accubisect judge` and (as
data in candidate.json) the repro.py that reduce writes. Two places deciding "the samples pass" each their
own way gave a run that said FAIL in compare and "nothing to bisect" in the bisection (issue 21).

A tensor passes when at most `ntol` of its elements fail |c - r| <= atol + rtol * |r|, it has no NaN
where the reference has none, and (if `cosine` is set) its cosine similarity is at least `cosine`.
Elements are judged as numpy.isclose judges them: an infinity matches only the same infinity (rtol * inf
would let anything match it), a finite value never matches an infinity, and a NaN matches nothing.
A sample passes when its model outputs pass, or, with a `val_func`, when the val_func says so (as in the
seeds, it replaces the tolerances). A configuration passes when at least `min_pass_fraction` of its
samples pass.

The check names its `val_func` ("module:function"); importing it is I/O on the user's code and happens
outside the core (`formats.val_func`), which hands the loaded `ValFunc` to `judge_outputs`. A user's
val_func runs inside the workflow's jobs, so whatever goes wrong in it (an exception, a result that is not
a bool) is reported in one line naming it, never as a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, NotRequired, TypedDict

import numpy as np

from accubisect.core.errors import ConfigError, ShapeMismatch
from accubisect.core.metrics import tensor_metrics, worst_over

CALLED_AS = "it is called as function(reference, candidate) with dicts of output name -> array"
OUTPUT_METRICS = ("max_abs", "max_rel", "cosine", "mismatch")  # a verdict's `worst`


class SampleJudged(TypedDict):
    """One sample's outputs judged (`AccuracyCheck.judge_outputs`); a probe names the sample's `inputs`."""

    passed: bool
    reasons: list[str]
    outputs: dict[str, dict[str, Any]]  # per model output: its metrics and reasons (`compare_arrays`)
    inputs: NotRequired[str]


class Judged(TypedDict):
    """A configuration judged on its samples (`AccuracyCheck.judge`): what a verdict.json records."""

    passed: bool
    samples: list[SampleJudged]  # those judged, in order
    worst: dict[str, float]  # OUTPUT_METRICS, worst over the samples' outputs
    not_applied: NotRequired[list[str]]  # candidates the backend would not switch off (OpenVINO's dropped marks)


@dataclass(frozen=True)
class AccuracyCheck:
    """The check's settings; `from_config` reads the validated `accuracy` section, `to_config` gives it back
    (report.json and candidate.json keep it so that a saved result is judged again the same way)."""

    rtol: float
    atol: float
    ntol: float
    cosine: float | None = None
    val_func: str | None = None  # "module:function", loaded by formats.val_func
    min_pass_fraction: float = 1.0

    @classmethod
    def from_config(cls, accuracy: Mapping[str, Any]) -> AccuracyCheck:
        cosine, fraction = accuracy.get("cosine"), accuracy.get("min_pass_fraction", 1.0)
        return cls(float(accuracy["rtol"]), float(accuracy["atol"]), float(accuracy["ntol"]),
                   None if cosine is None else float(cosine), accuracy.get("val_func"), float(fraction))

    def to_config(self) -> dict[str, Any]:
        return asdict(self)

    def on_tensors(self) -> AccuracyCheck:
        """The check of tensors that are not the model's outputs (a repro's, `snakemake reduce`): the tolerances
        alone, since a val_func is written for the model's outputs."""
        return replace(self, val_func=None)

    def failures(self, metrics: Mapping[str, float]) -> list[str]:
        """Why one tensor's `metrics` fail the tolerances; empty when they pass."""
        reasons = []
        if metrics.get("shape_mismatch"):
            reasons.append("shapes differ")
        elif metrics["nan_cand"] > metrics["nan_ref"]:
            reasons.append(f"{metrics['nan_cand'] - metrics['nan_ref']} new NaN")
        if "mismatch" in metrics and metrics["mismatch"] > self.ntol:
            reasons.append(f"{metrics['mismatch']:.2%} of elements outside rtol={self.rtol:g}, atol={self.atol:g}")
        if self.cosine is not None and not metrics.get("cosine", math.nan) >= self.cosine:
            reasons.append(f"cosine {metrics.get('cosine', math.nan):.6g} < {self.cosine:g}")
        return reasons

    def compare_arrays(self, reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
        """Metrics of one tensor pair plus its verdict; a shape mismatch is a failing row, not a crash."""
        try:
            metrics: dict[str, Any] = tensor_metrics(reference, candidate, self.rtol, self.atol)
        except ShapeMismatch as error:
            metrics = {"shape_mismatch": str(error)}
        reasons = self.failures(metrics)
        return {**metrics, "passed": not reasons, "reasons": reasons}

    def judge_outputs(self, reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                      val_func: ValFunc | None) -> SampleJudged:
        """One sample's verdict on the model's outputs; `val_func` is this check's, loaded."""
        if (val_func.spec if val_func else None) != self.val_func:
            raise ConfigError(f"accuracy.val_func {self.val_func}: judged with "
                              f"{val_func.spec if val_func else 'no val_func'} loaded; load the check's own")
        outputs = {name: self.compare_arrays(reference[name], candidate[name]) for name in reference}
        if val_func is not None:
            passed = val_func(dict(reference), dict(candidate))
            reasons = [] if passed else ["val_func returned False"]
        else:
            reasons = [f"{name}: {reason}" for name, row in outputs.items() for reason in row["reasons"]]
            passed = not reasons
        return {"passed": passed, "reasons": reasons, "outputs": outputs}

    def passes(self, sample_verdicts: Sequence[bool]) -> bool:
        """Whether a configuration passes: at least `min_pass_fraction` of its samples (none is no pass)."""
        return bool(sample_verdicts) and sum(sample_verdicts) >= self.min_pass_fraction * len(sample_verdicts)

    def decided(self, sample_verdicts: Sequence[bool], total: int) -> bool:
        """Whether the samples not judged yet (of `total`) could no longer make the verdict pass."""
        best_case = sum(sample_verdicts) + total - len(sample_verdicts)
        return best_case < self.min_pass_fraction * total

    def judge(self, samples: Sequence[SampleJudged], total: int | None = None) -> Judged:
        """A configuration's verdict from its samples' (`judge_outputs`, each with `passed`): `passed`, the
        samples, and the `worst` output metrics. Of `total` samples, those not judged count as failing (a
        probe that stopped once its verdict was certain)."""
        verdicts = [bool(sample["passed"]) for sample in samples]
        verdicts += [False] * ((total or len(verdicts)) - len(verdicts))
        return {"passed": self.passes(verdicts), "samples": list(samples), "worst": worst_outputs(samples)}

    def describe(self) -> str:
        """The check in the words the pages and the warnings use."""
        shown: list[str] = [f"rtol {self.rtol:g}", f"atol {self.atol:g}", f"ntol {self.ntol:g}"]
        if self.cosine is not None:
            shown.append(f"cosine ≥ {self.cosine:g}")
        if self.val_func:
            shown.append(f"val_func {self.val_func}")
        shown.append(f"min pass fraction {self.min_pass_fraction:g}")
        return ", ".join(shown)


def worst_outputs(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """OUTPUT_METRICS worst over every output of every sample (`metrics.worst_over`: NaN counts as worst);
    outputs of mismatched shapes have no metrics."""
    return worst_over([row for sample in samples for row in sample["outputs"].values() if "max_abs" in row],
                      OUTPUT_METRICS)


@dataclass(frozen=True)
class ValFunc:
    """A user's `val_func`, called so that its failures and non-bool results are one-line ConfigErrors."""

    spec: str  # "module:function"
    function: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], Any]

    def __call__(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> bool:
        try:
            result = self.function(reference, candidate)
        except Exception as error:  # the user's code: any exception is theirs to fix
            raise ConfigError(f"accuracy.val_func {self.spec} raised {describe_error(error)}; {CALLED_AS}") from None
        if not isinstance(result, bool | np.bool_):  # bool('False') and bool(array) would judge silently wrong
            shown = " ".join(repr(result).split())
            raise ConfigError(f"accuracy.val_func {self.spec} returned {shown[:80]} ({type(result).__name__}); "
                              "it must return True or False")
        return bool(result)


def describe_error(error: Exception) -> str:
    """An exception's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
