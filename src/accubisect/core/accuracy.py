"""The accuracy check: tolerances that judge metrics, and an optional user `val_func`.

A tensor passes when at most `ntol` of its elements fail |c - r| <= atol + rtol * |r|, it has no NaN
where the reference has none, and (if `cosine` is set) its cosine similarity is at least `cosine`.
Elements are judged as numpy.isclose judges them: an infinity matches only the same infinity (rtol * inf
would let anything match it), a finite value never matches an infinity, and a NaN matches nothing.

A user's `val_func` runs inside the workflow's jobs, so whatever goes wrong in it (an import error, an
exception, a result that is not a bool) is reported in one line naming it, never as a traceback.
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

from accubisect.core.errors import ConfigError, ShapeMismatch
from accubisect.core.metrics import tensor_metrics

CALLED_AS = "it is called as function(reference, candidate) with dicts of output name -> array"


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
        passed = val_func(dict(reference), dict(candidate))
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
    except Exception as error:  # a parent package that fails as it is imported
        raise _import_error(spec, error) from None
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise ConfigError(f"accuracy.val_func: module '{module}' not found beside the workflow or on sys.path")
    source = Path(found.origin)
    try:  # a syntax error fails when the workflow is parsed, not after every dump has run
        compile(source.read_bytes(), str(source), "exec")
    except (SyntaxError, ValueError) as error:  # ValueError: a NUL byte in the source
        raise _import_error(spec, error) from None
    return source


@dataclass(frozen=True)
class ValFunc:
    """A user's `val_func`, called so that its failures and non-bool results are one-line ConfigErrors."""

    spec: str  # "module:function"
    function: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], Any]

    def __call__(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> bool:
        try:
            result = self.function(reference, candidate)
        except Exception as error:  # the user's code: any exception is theirs to fix
            raise ConfigError(f"accuracy.val_func {self.spec} raised {_describe(error)}; {CALLED_AS}") from None
        if not isinstance(result, bool | np.bool_):  # bool('False') and bool(array) would judge silently wrong
            shown = " ".join(repr(result).split())
            raise ConfigError(f"accuracy.val_func {self.spec} returned {shown[:80]} ({type(result).__name__}); "
                              "it must return True or False")
        return bool(result)


def load_val_func(spec: str | None) -> ValFunc | None:
    """Imports "module:function"."""
    if spec is None:
        return None
    module_name, _, function_name = spec.partition(":")
    _look_beside_the_workflow()
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a syntax error, a missing import or anything the module raises at import
        raise _import_error(spec, error) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"accuracy.val_func: module '{module_name}' has no function '{function_name}'")
    return ValFunc(spec, function)


def _import_error(spec: str, error: Exception) -> ConfigError:
    return ConfigError(f"accuracy.val_func {spec}: cannot import module '{spec.partition(':')[0]}' "
                       f"({_describe(error)})")


def _describe(error: Exception) -> str:
    """An exception's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
