"""The accuracy check: tolerances that judge metrics, and an optional user `val_func`.

A tensor passes when at most `ntol` of its elements fail |c - r| <= atol + rtol * |r|, it has no NaN
where the reference has none, and (if `cosine` is set) its cosine similarity is at least `cosine`.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accubisect.errors import ConfigError
from accubisect.metrics import ShapeMismatch, tensor_metrics

ValFunc = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], bool]


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    ntol: float
    cosine: float | None = None

    @classmethod
    def from_config(cls, accuracy: Mapping[str, Any]) -> Tolerance:
        return cls(accuracy["rtol"], accuracy["atol"], accuracy["ntol"], accuracy.get("cosine"))

    def failures(self, metrics: Mapping[str, float]) -> list[str]:
        """Why `metrics` fail this tolerance; empty when they pass."""
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


def compare_arrays(reference: np.ndarray, candidate: np.ndarray, tolerance: Tolerance) -> dict[str, Any]:
    """Metrics of one tensor pair plus the verdict; a shape mismatch is a failing row, not a crash."""
    try:
        metrics: dict[str, Any] = tensor_metrics(reference, candidate, tolerance.rtol, tolerance.atol)
    except ShapeMismatch as error:
        metrics = {"shape_mismatch": str(error)}
    reasons = tolerance.failures(metrics)
    return {**metrics, "passed": not reasons, "reasons": reasons}


def judge_outputs(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], tolerance: Tolerance,
                  val_func: ValFunc | None) -> dict[str, Any]:
    """Verdict on a model's outputs for one sample. A `val_func` replaces the tolerances, as in the seeds."""
    outputs = {name: compare_arrays(reference[name], candidate[name], tolerance) for name in reference}
    if val_func is not None:
        passed = bool(val_func(dict(reference), dict(candidate)))
        reasons = [] if passed else ["val_func returned False"]
    else:
        reasons = [f"{name}: {reason}" for name, row in outputs.items() for reason in row["reasons"]]
        passed = not reasons
    return {"passed": passed, "reasons": reasons, "outputs": outputs}


def _look_beside_the_workflow() -> None:
    """`val_func` modules are looked up in the working directory (the workflow's) first."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))


def val_func_source(spec: str | None) -> Path | None:
    """The file defining a `val_func`, found without importing it, so that editing it re-runs a comparison."""
    if spec is None:
        return None
    module = spec.partition(":")[0]
    _look_beside_the_workflow()
    try:
        found = importlib.util.find_spec(module)
    except ImportError:
        found = None
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise ConfigError(f"accuracy.val_func: module '{module}' not found beside the workflow or on sys.path")
    return Path(found.origin)


def load_val_func(spec: str | None) -> ValFunc | None:
    """Imports "module:function"."""
    if spec is None:
        return None
    module_name, _, function_name = spec.partition(":")
    _look_beside_the_workflow()
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"accuracy.val_func: cannot import module '{module_name}' ({error})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"accuracy.val_func: module '{module_name}' has no function '{function_name}'")
    return function
