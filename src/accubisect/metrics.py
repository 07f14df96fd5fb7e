"""Metrics compute numbers; they never judge. `accuracy.Tolerance` judges them.

All arithmetic is in float64 whatever the tensors' dtype. Conventions, also stated in the README:
- An element where reference and candidate are equal (including the same infinity) has error 0.
- A NaN on either side makes the error metrics and the cosine NaN: a NaN never passes.
- Relative error divides by max(|reference|, REL_FLOOR), so an exact zero in the reference does not
  divide by zero; a nonzero error against a zero reference is then very large, as it should be.
- Empty tensors have zero error and cosine 1.
- Low-precision range: overflow is the fraction of values with |x| >= the type's largest finite value
  (infinities included), underflow the fraction of nonzero values with |x| below its smallest normal.
"""

from __future__ import annotations

import math

import numpy as np

METRICS = ("cosine", "max_abs", "mean_abs", "max_rel", "rmse", "rel_euclidean", "kl", "sqnr_db", "mismatch",
           "nan_ref", "nan_cand", "inf_ref", "inf_cand", "overflow_ref", "overflow_cand", "underflow_ref",
           "underflow_cand")
LOWER_IS_WORSE = {"cosine", "sqnr_db"}
REL_FLOOR = 1e-12
KL_FLOOR = 1e-12
LOW_PRECISION = {  # largest finite value, smallest normal value
    "fp16": (65504.0, 2.0**-14),
    "bf16": (3.3895313892515355e38, 2.0**-126),
}


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


def relative_euclidean(reference: np.ndarray, candidate: np.ndarray) -> float:
    """||c - r|| / ||r||; 0 when both are zero, inf when only the reference is."""
    noise = float(np.linalg.norm(abs_error(reference, candidate)))
    signal = float(np.linalg.norm(_as_float64(reference, candidate)[0]))
    if noise == 0 or math.isnan(noise):
        return noise
    return math.inf if signal == 0 else noise / signal


def sqnr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """10 log10(sum r^2 / sum (r - c)^2): inf when identical, -inf when the reference is all zeros."""
    error = abs_error(reference, candidate)
    noise = float(np.sum(np.square(error)))
    signal = float(np.sum(np.square(_as_float64(reference, candidate)[0])))
    if math.isnan(noise):
        return math.nan
    if noise == 0:
        return math.inf
    return -math.inf if signal == 0 or math.isinf(noise) else 10 * math.log10(signal / noise)


def kl_divergence(reference: np.ndarray, candidate: np.ndarray) -> float:
    """KL(p || q) in nats, with p = |r| / sum |r| and q = |c| / sum |c|: each tensor's magnitudes read as a
    distribution over its elements. q is floored at KL_FLOOR; 0 when both are all zeros, inf when one is."""
    ref, got = (np.abs(a) for a in _as_float64(reference, candidate))
    if not (np.isfinite(ref).all() and np.isfinite(got).all()):
        return math.nan
    total_ref, total_got = ref.sum(), got.sum()
    if total_ref == 0 or total_got == 0:
        return 0.0 if total_ref == total_got else math.inf
    p, q = ref / total_ref, np.maximum(got / total_got, KL_FLOOR)
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def range_fractions(values: np.ndarray, dtype: str) -> tuple[float, float]:
    """(overflow, underflow) fractions of `values` for the low-precision `dtype` ("fp16" or "bf16")."""
    largest, smallest_normal = LOW_PRECISION[dtype]
    magnitude = np.abs(np.asarray(values, np.float64).ravel())
    if magnitude.size == 0:
        return 0.0, 0.0
    overflow = np.count_nonzero(magnitude >= largest) / magnitude.size
    underflow = np.count_nonzero((magnitude > 0) & (magnitude < smallest_normal)) / magnitude.size
    return float(overflow), float(underflow)


def tensor_metrics(reference: np.ndarray, candidate: np.ndarray, rtol: float, atol: float,
                   low_precision: str = "fp16") -> dict[str, float]:
    """Every metric of one tensor pair; raises ShapeMismatch if the shapes differ."""
    ref, got = _as_float64(reference, candidate)
    error = abs_error(reference, candidate)
    empty = error.size == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = error / np.maximum(np.abs(ref), REL_FLOOR)
    overflow_ref, underflow_ref = range_fractions(ref, low_precision)
    overflow_cand, underflow_cand = range_fractions(got, low_precision)
    return {
        "cosine": cosine_similarity(reference, candidate),
        "max_abs": 0.0 if empty else float(np.max(error)),
        "mean_abs": 0.0 if empty else float(np.mean(error)),
        "max_rel": 0.0 if empty else float(np.max(relative)),
        "rmse": 0.0 if empty else float(np.sqrt(np.mean(np.square(error)))),
        "rel_euclidean": relative_euclidean(reference, candidate),
        "kl": kl_divergence(reference, candidate),
        "sqnr_db": sqnr_db(reference, candidate),
        "mismatch": mismatch_fraction(reference, candidate, rtol, atol),
        "nan_ref": int(np.isnan(ref).sum()),
        "nan_cand": int(np.isnan(got).sum()),
        "inf_ref": int(np.isinf(ref).sum()),
        "inf_cand": int(np.isinf(got).sum()),
        "overflow_ref": overflow_ref,
        "overflow_cand": overflow_cand,
        "underflow_ref": underflow_ref,
        "underflow_cand": underflow_cand,
    }
