"""Metrics compute numbers; they never judge. `accuracy.Tolerance` judges them.

All arithmetic is in float64 whatever the tensors' dtype. Conventions, also stated in the README:
- An element where reference and candidate are equal (including the same infinity) has error 0.
- A NaN on either side makes the error metrics and the cosine NaN: a NaN never passes.
- Relative error divides by max(|reference|, REL_FLOOR), so an exact zero in the reference does not
  divide by zero; a nonzero error against a zero reference is then very large, as it should be.
- Empty tensors have zero error and cosine 1.
"""

from __future__ import annotations

import math

import numpy as np

REL_FLOOR = 1e-12


class ShapeMismatch(ValueError):
    def __init__(self, reference: tuple[int, ...], candidate: tuple[int, ...]) -> None:
        super().__init__(f"shapes differ: reference {list(reference)}, candidate {list(candidate)}")


def _as_float64(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if reference.shape != candidate.shape:
        raise ShapeMismatch(reference.shape, candidate.shape)
    return np.asarray(reference, np.float64).ravel(), np.asarray(candidate, np.float64).ravel()


def abs_error(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    ref, got = _as_float64(reference, candidate)
    with np.errstate(invalid="ignore"):
        return np.where(ref == got, 0.0, np.abs(got - ref))


def cosine_similarity(reference: np.ndarray, candidate: np.ndarray) -> float:
    ref, got = _as_float64(reference, candidate)
    if np.array_equal(ref, got):
        return 1.0
    if not (np.isfinite(ref).all() and np.isfinite(got).all()):
        return math.nan
    norm_ref, norm_got = np.linalg.norm(ref), np.linalg.norm(got)
    if norm_ref == 0 or norm_got == 0:
        return 0.0  # one side is all zeros, the other is not
    return float(np.dot(ref, got) / (norm_ref * norm_got))


def mismatch_fraction(reference: np.ndarray, candidate: np.ndarray, rtol: float, atol: float) -> float:
    """Fraction of elements failing |candidate - reference| <= atol + rtol * |reference| (NaN fails)."""
    ref, _ = _as_float64(reference, candidate)
    if ref.size == 0:
        return 0.0
    error = abs_error(reference, candidate)
    with np.errstate(invalid="ignore"):
        close = (error == 0) | (error <= atol + rtol * np.abs(ref))  # 0 * inf would be NaN
    return float(1.0 - np.count_nonzero(close) / ref.size)


def tensor_metrics(reference: np.ndarray, candidate: np.ndarray, rtol: float, atol: float) -> dict[str, float]:
    """Every metric of one tensor pair; raises ShapeMismatch if the shapes differ."""
    ref, got = _as_float64(reference, candidate)
    error = abs_error(reference, candidate)
    empty = error.size == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = error / np.maximum(np.abs(ref), REL_FLOOR)
    return {
        "cosine": cosine_similarity(reference, candidate),
        "max_abs": 0.0 if empty else float(np.max(error)),
        "mean_abs": 0.0 if empty else float(np.mean(error)),
        "max_rel": 0.0 if empty else float(np.max(relative)),
        "rmse": 0.0 if empty else float(np.sqrt(np.mean(np.square(error)))),
        "mismatch": mismatch_fraction(reference, candidate, rtol, atol),
        "nan_ref": int(np.isnan(ref).sum()),
        "nan_cand": int(np.isnan(got).sum()),
        "inf_ref": int(np.isinf(ref).sum()),
        "inf_cand": int(np.isinf(got).sum()),
    }
