"""Metrics compute numbers; they never judge. `accuracy.AccuracyCheck` judges them.

All arithmetic is in float64 whatever the tensors' dtype. Conventions, also stated in docs/metrics.md:
- An element where reference and candidate are equal (including the same infinity) has error 0.
- Infinities are judged as numpy.isclose judges them: an infinity matches only the same infinity, and a
  finite value against an infinite one (or -inf against +inf) is an infinite error, never within rtol.
- A NaN on either side makes the error metrics and the cosine NaN: a NaN never passes, not even
  against a NaN.
- Relative error divides by max(|reference|, REL_FLOOR), so an exact zero in the reference does not
  divide by zero; a nonzero error against a zero reference is then very large, as it should be.
- Empty tensors have zero error and cosine 1.
- Low-precision range: overflow is the fraction of values with |x| >= the type's largest finite value
  (infinities included), underflow the fraction of nonzero values with |x| below its smallest normal.
- Worst over samples (`worst_over`, the one place it is computed): the smallest value of a metric where lower
  is worse, the largest of any other, and NaN counts as worst: one NaN makes the worst NaN, whatever the
  order of the samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np

from accubisect.core.errors import ShapeMismatch

METRICS = ("cosine", "max_abs", "mean_abs", "max_rel", "rmse", "rel_euclidean", "kl", "sqnr_db", "mismatch",
           "nan_ref", "nan_cand", "inf_ref", "inf_cand", "overflow_ref", "overflow_cand", "underflow_ref",
           "underflow_cand", "min_ref", "max_ref", "min_cand", "max_cand")
LOWER_IS_WORSE = {"cosine", "sqnr_db"}
REL_FLOOR = 1e-12
KL_FLOOR = 1e-12
LOW_PRECISION = {  # largest finite value, smallest normal value
    "fp16": (65504.0, 2.0**-14),
    "bf16": (3.3895313892515355e38, 2.0**-126),
}


class Pair:
    """A reference/candidate pair as flat float64 arrays, with the element-wise error, made once so that
    every metric of the pair shares them (memory stays a small multiple of the pair), and the sums several
    metrics read, each computed once. `finite` marks the usual pair, every value and the error sum finite:
    the NaN/Inf conventions cannot apply there, so the metrics skip the passes that look for them."""

    def __init__(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        if reference.shape != candidate.shape:
            raise ShapeMismatch(reference.shape, candidate.shape)
        self.shape = reference.shape
        self.ref = np.asarray(reference, np.float64).ravel()
        self.got = np.asarray(candidate, np.float64).ravel()
        with np.errstate(invalid="ignore", over="ignore"):
            self.error = np.subtract(self.got, self.ref)
            np.abs(self.error, out=self.error)
            self.error_sum = float(self.error.sum())  # NaN or inf unless every value is finite
        self.finite = math.isfinite(self.error_sum)
        if not self.finite:
            self.error[self.ref == self.got] = 0.0  # the same infinity on both sides is no error
            self.error_sum = float(self.error.sum())
        self._scratch = np.empty_like(self.ref)

    @property
    def size(self) -> int:
        return self.ref.size

    @cached_property
    def max_abs(self) -> float:
        return 0.0 if self.size == 0 else float(np.max(self.error))

    @cached_property
    def noise(self) -> float:
        """Sum of squared errors."""
        return float(np.dot(self.error, self.error))

    @cached_property
    def signal(self) -> float:
        """Sum of squares of the reference's finite values."""
        return _finite_energy(self.ref)

    def bounds(self, side: str) -> tuple[float, float]:
        """(min, max) of `ref` or `got`, NaN ignored; NaN when there is no such value."""
        return self._bounds[side]

    @cached_property
    def _bounds(self) -> dict[str, tuple[float, float]]:
        bounds = {}
        for side, values in (("ref", self.ref), ("got", self.got)):
            if values.size == 0 or (not self.finite and np.isnan(values).all()):
                bounds[side] = (math.nan, math.nan)
            elif self.finite:
                bounds[side] = (float(values.min()), float(values.max()))
            else:
                bounds[side] = (float(np.nanmin(values)), float(np.nanmax(values)))
        return bounds

    def magnitude(self, values: np.ndarray) -> np.ndarray:
        """|values| in the pair's scratch buffer: valid until the next call."""
        return np.abs(values, out=self._scratch)


def cosine_similarity(reference: np.ndarray, candidate: np.ndarray) -> float:
    return _cosine(Pair(reference, candidate))


def _cosine(pair: Pair) -> float:
    if pair.size == 0 or pair.max_abs == 0:  # an error of 0 everywhere: no NaN on either side
        return 1.0
    if not (pair.finite or (np.isfinite(pair.ref).all() and np.isfinite(pair.got).all())):
        return math.nan
    norm_ref, norm_got = math.sqrt(pair.signal), math.sqrt(float(np.dot(pair.got, pair.got)))
    if norm_ref == 0 or norm_got == 0:
        return 0.0  # one side is all zeros, the other is not
    return float(np.dot(pair.ref, pair.got)) / (norm_ref * norm_got)


def mismatch_fraction(reference: np.ndarray, candidate: np.ndarray, rtol: float, atol: float) -> float:
    """Fraction of elements failing |candidate - reference| <= atol + rtol * |reference| (NaN fails)."""
    return _mismatch(Pair(reference, candidate), rtol, atol)


def _mismatch(pair: Pair, rtol: float, atol: float) -> float:
    if pair.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        bound = pair.magnitude(pair.ref)
        bound *= rtol
        bound += atol
        close = pair.error <= bound
        if not pair.finite:
            close &= np.isfinite(pair.ref)  # rtol * inf is inf: only error 0 matches an infinite reference
            close |= pair.error == 0
    return float(1.0 - np.count_nonzero(close) / pair.size)


def relative_euclidean(reference: np.ndarray, candidate: np.ndarray) -> float:
    """||c - r|| / ||r||; 0 when both are zero, inf when only the reference is."""
    return _relative_euclidean(Pair(reference, candidate))


def _relative_euclidean(pair: Pair) -> float:
    noise = math.sqrt(pair.noise)
    if noise == 0 or not math.isfinite(noise):
        return noise
    signal = math.sqrt(pair.signal)
    return math.inf if signal == 0 else noise / signal


def _finite_energy(values: np.ndarray) -> float:
    """Sum of squares of the finite values: an infinity that the other side matches carries no error, so it
    must not make every other element's error look small against it."""
    energy = float(np.dot(values, values))
    if math.isinf(energy):
        finite = values[np.isfinite(values)]
        energy = float(np.dot(finite, finite))
    return energy


def sqnr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """10 log10(sum r^2 / sum (r - c)^2): inf when identical, -inf when the reference is all zeros."""
    return _sqnr_db(Pair(reference, candidate))


def _sqnr_db(pair: Pair) -> float:
    noise = pair.noise
    if math.isnan(noise):
        return math.nan
    if noise == 0:
        return math.inf
    if math.isinf(noise):
        return -math.inf
    signal = pair.signal
    return -math.inf if signal == 0 else 10 * math.log10(signal / noise)


def kl_divergence(reference: np.ndarray, candidate: np.ndarray) -> float:
    """KL(p || q) in nats, with p = |r| / sum |r| and q = |c| / sum |c|: each tensor's magnitudes read as a
    distribution over its elements. q is floored at KL_FLOOR; 0 when both are all zeros, inf when one is."""
    return _kl(Pair(reference, candidate))


def _kl(pair: Pair) -> float:
    total_ref, total_got = float(pair.magnitude(pair.ref).sum()), float(pair.magnitude(pair.got).sum())
    if not (math.isfinite(total_ref) and math.isfinite(total_got)):
        return math.nan
    if total_ref == 0 or total_got == 0:
        return 0.0 if total_ref == total_got else math.inf
    p = np.abs(pair.ref)
    p /= total_ref
    q = pair.magnitude(pair.got)
    q /= total_got
    np.maximum(q, KL_FLOOR, out=q)
    present = p > 0
    np.divide(p, q, out=q, where=present)  # log(p / q), only where p > 0 contributes
    np.log(q, out=q, where=present)
    q[~present] = 0.0
    return float(np.dot(p, q))


def range_fractions(values: np.ndarray, dtype: str, magnitude: np.ndarray | None = None,
                    peak: float = math.inf) -> tuple[float, float]:
    """(overflow, underflow) fractions of `values` for the low-precision `dtype` ("fp16" or "bf16");
    `magnitude`, if given, is |values| already computed; `peak`, if given, is its largest (finite) value,
    which spares counting overflow below the type's largest value."""
    largest, smallest_normal = LOW_PRECISION[dtype]
    if magnitude is None:
        magnitude = np.abs(np.asarray(values, np.float64).ravel())
    if magnitude.size == 0:
        return 0.0, 0.0
    overflow = np.count_nonzero(magnitude >= largest) / magnitude.size if not peak < largest else 0.0
    underflow = (np.count_nonzero(magnitude < smallest_normal) - np.count_nonzero(magnitude == 0)) / magnitude.size
    return float(overflow), float(underflow)


def tensor_metrics(reference: np.ndarray, candidate: np.ndarray, rtol: float, atol: float,
                   low_precision: str = "fp16") -> dict[str, float]:
    """Every metric of one tensor pair; raises ShapeMismatch if the shapes differ."""
    metrics = block_metrics(reference, candidate, rtol, atol, low_precision)
    return pair_metrics(Pair(reference, candidate), rtol, atol, low_precision) if metrics is None else metrics


def error_metrics(pair: Pair) -> dict[str, float]:
    """The error metrics alone (cosine, max_abs, max_rel, rel_euclidean), as `pair_metrics` computes them."""
    return {"cosine": _cosine(pair), "max_abs": pair.max_abs, "max_rel": _max_rel(pair),
            "rel_euclidean": _relative_euclidean(pair)}


def _max_rel(pair: Pair) -> float:
    if not math.isfinite(pair.max_abs):
        return pair.max_abs  # NaN stays NaN; an infinite error is infinitely relative (inf / inf reads NaN)
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.maximum(pair.magnitude(pair.ref), REL_FLOOR, out=pair.magnitude(pair.ref))
        return 0.0 if pair.size == 0 else float(np.max(np.divide(pair.error, relative, out=relative)))


def pair_metrics(pair: Pair, rtol: float, atol: float, low_precision: str = "fp16") -> dict[str, float]:
    empty = pair.size == 0
    overflow_ref, underflow_ref = range_fractions(pair.ref, low_precision, pair.magnitude(pair.ref),
                                                  _peak(pair, "ref"))
    overflow_cand, underflow_cand = range_fractions(pair.got, low_precision, pair.magnitude(pair.got),
                                                    _peak(pair, "got"))
    return {
        "cosine": _cosine(pair),
        "max_abs": pair.max_abs,
        "mean_abs": 0.0 if empty else pair.error_sum / pair.size,
        "max_rel": _max_rel(pair),
        "rmse": 0.0 if empty else math.sqrt(pair.noise / pair.size),
        "rel_euclidean": _relative_euclidean(pair),
        "kl": _kl(pair),
        "sqnr_db": _sqnr_db(pair),
        "mismatch": _mismatch(pair, rtol, atol),
        "nan_ref": 0 if pair.finite else int(np.isnan(pair.ref).sum()),
        "nan_cand": 0 if pair.finite else int(np.isnan(pair.got).sum()),
        "inf_ref": 0 if pair.finite else int(np.isinf(pair.ref).sum()),
        "inf_cand": 0 if pair.finite else int(np.isinf(pair.got).sum()),
        "overflow_ref": overflow_ref,
        "overflow_cand": overflow_cand,
        "underflow_ref": underflow_ref,
        "underflow_cand": underflow_cand,
        "min_ref": pair.bounds("ref")[0],
        "max_ref": pair.bounds("ref")[1],
        "min_cand": pair.bounds("got")[0],
        "max_cand": pair.bounds("got")[1],
    }


BLOCK = 1 << 15  # elements per block of `block_metrics`: its float64 buffers stay in the CPU's cache
TINY = np.finfo(np.float64).tiny  # stands in for p / q = 0, where p = 0 and the term p log(p / q) is 0


def block_metrics(reference: np.ndarray, candidate: np.ndarray, rtol: float, atol: float,
                  low_precision: str = "fp16", error_only: bool = False) -> dict[str, float] | None:
    """Every metric of `pair_metrics`, the same definitions in float64, computed block by block from the
    arrays as stored (float32 mostly): a block of BLOCK elements is copied to float64 and every sum, count
    and extreme of it is taken while it sits in the cache (`_BlockSums`), and KL divergence, which needs both
    sides' totals, takes a second such walk. Whole-tensor float64 copies made each of the ~30 passes a walk
    through main memory: 5x the cost of the plain cosine and max abs on a 10 M element tensor. Sums are added
    block by block, so values can differ from `pair_metrics`' in the last digits. Returns None for an empty
    pair and for one where some value, error or sum of squares is not finite: the NaN/Inf conventions are
    `pair_metrics`' work.
    `error_only`: only the metrics `error_metrics` returns, skipping the passes the others need."""
    if reference.shape != candidate.shape:
        raise ShapeMismatch(reference.shape, candidate.shape)
    ref, got = np.ravel(reference), np.ravel(candidate)
    if ref.size == 0:
        return None
    sums = _BlockSums(min(BLOCK, ref.size), rtol, atol, *LOW_PRECISION[low_precision])
    for start in range(0, ref.size, sums.length):
        if not sums.add(ref[start:start + sums.length], got[start:start + sums.length], error_only):
            return None
    if not sums.finite():
        return None  # sums of squares beyond float64 (values near 1e154): the whole-pair path
    if error_only:
        return sums.error_metrics()
    return sums.metrics(ref, got)


class _BlockSums:
    """What `block_metrics` adds up over the blocks of one pair, in float64 buffers reused block after block:
    the error's sums, the energies cosine needs, and per side the magnitudes, extremes, and the values beyond
    the low type's range (`largest`) or below its smallest normal."""

    def __init__(self, length: int, rtol: float, atol: float, largest: float, smallest_normal: float) -> None:
        self.length, self.rtol, self.atol = length, rtol, atol
        self.largest, self.smallest_normal = largest, smallest_normal
        self.buffers = tuple(np.empty(length) for _ in range(5))  # ref, cand, error, magnitude, tolerance
        self.error_sum = self.noise = self.signal = self.got_energy = self.cross = 0.0
        self.max_error = self.max_rel = 0.0
        self.close = 0
        self.ref, self.got = _SideSums(), _SideSums()

    def add(self, ref: np.ndarray, got: np.ndarray, error_only: bool) -> bool:
        """One block of the pair (float32 mostly, copied to float64); False where its error is not finite."""
        count = ref.size
        r, c, e, s, t = (buffer[:count] for buffer in self.buffers)
        np.copyto(r, ref, casting="unsafe")
        np.copyto(c, got, casting="unsafe")
        if not self._add_error(r, c, e):
            return False
        np.abs(r, out=s)
        if error_only:
            np.maximum(s, REL_FLOOR, out=s)
            self.max_rel = max(self.max_rel, float(np.divide(e, s, out=s).max()))
            return True
        self.ref.add(r, s, self.largest, self.smallest_normal)
        np.multiply(s, self.rtol, out=t)
        t += self.atol
        self.close += int(np.count_nonzero(e <= t))
        np.maximum(s, REL_FLOOR, out=s)
        np.divide(e, s, out=s)
        self.max_rel = max(self.max_rel, float(s.max()))
        np.abs(c, out=s)
        self.got.add(c, s, self.largest, self.smallest_normal)
        return True

    def _add_error(self, r: np.ndarray, c: np.ndarray, e: np.ndarray) -> bool:
        """The block's absolute error into `e`, and its sums; False where it is not finite."""
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(c, r, out=e)
            np.abs(e, out=e)
            block_error = float(e.sum())
        if not math.isfinite(block_error):
            return False
        self.error_sum += block_error
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow sends the pair to `pair_metrics`
            self.noise += float(np.dot(e, e))
            self.signal += float(np.dot(r, r))
            self.got_energy += float(np.dot(c, c))
            self.cross += float(np.dot(r, c))
        self.max_error = max(self.max_error, float(e.max()))
        return True

    def finite(self) -> bool:
        return all(math.isfinite(total) for total in (self.noise, self.signal, self.got_energy, self.cross))

    def cosine(self) -> float:
        if self.max_error == 0:
            return 1.0
        if self.signal == 0 or self.got_energy == 0:
            return 0.0
        return self.cross / (math.sqrt(self.signal) * math.sqrt(self.got_energy))

    def error_metrics(self) -> dict[str, float]:
        return {"cosine": self.cosine(), "max_abs": self.max_error, "max_rel": self.max_rel,
                "rel_euclidean": _euclidean_ratio(self.noise, self.signal)}

    def metrics(self, ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
        """Every metric; `ref` and `got` are the whole pair again, raveled: its size, and KL's second walk."""
        size = ref.size
        r_buf, c_buf, _, s_buf, _ = self.buffers
        return {
            "cosine": self.cosine(),
            "max_abs": self.max_error,
            "mean_abs": self.error_sum / size,
            "max_rel": self.max_rel,
            "rmse": math.sqrt(self.noise / size),
            "rel_euclidean": _euclidean_ratio(self.noise, self.signal),
            "kl": _block_kl(ref, got, self.ref.magnitude, self.got.magnitude, (r_buf, c_buf, s_buf)),
            "sqnr_db": _sqnr_from_sums(self.noise, self.signal),
            "mismatch": float(1.0 - self.close / size),
            "nan_ref": 0, "nan_cand": 0, "inf_ref": 0, "inf_cand": 0,
            "overflow_ref": self.ref.over / size,
            "overflow_cand": self.got.over / size,
            "underflow_ref": self.ref.under / size,
            "underflow_cand": self.got.under / size,
            "min_ref": self.ref.low, "max_ref": self.ref.high, "min_cand": self.got.low, "max_cand": self.got.high,
        }


class _SideSums:
    """One side's sums over the blocks: the sum of magnitudes (KL's total), its extremes, and how many values
    lie beyond the low type's largest or below its smallest normal."""

    def __init__(self) -> None:
        self.magnitude = 0.0
        self.low, self.high = math.inf, -math.inf
        self.over = self.under = 0

    def add(self, values: np.ndarray, magnitude: np.ndarray, largest: float, smallest_normal: float) -> None:
        low, high = float(values.min()), float(values.max())
        self.low, self.high = min(self.low, low), max(self.high, high)
        self.magnitude += float(magnitude.sum())
        self.under += _underflow_count(magnitude, smallest_normal)
        if max(-low, high) >= largest:
            self.over += int(np.count_nonzero(magnitude >= largest))


def _underflow_count(magnitude: np.ndarray, smallest_normal: float) -> int:
    below = int(np.count_nonzero(magnitude < smallest_normal))
    return below - (magnitude.size - int(np.count_nonzero(magnitude))) if below else 0  # zeros are not underflow


def _euclidean_ratio(noise: float, signal: float) -> float:
    if noise == 0 or not math.isfinite(noise):
        return math.sqrt(noise)
    return math.inf if signal == 0 else math.sqrt(noise) / math.sqrt(signal)


def _sqnr_from_sums(noise: float, signal: float) -> float:
    if noise == 0:
        return math.inf
    if math.isinf(noise):
        return -math.inf
    return -math.inf if signal == 0 else 10 * math.log10(signal / noise)


def _block_kl(ref: np.ndarray, got: np.ndarray, total_ref: float, total_got: float,
              buffers: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
    """KL(p || q) as `_kl` defines it, block by block: with R, C the totals of |r| and |c| and s = |r| C / R,
    p / q = s / max(|c|, KL_FLOOR C) and KL = sum(s ln(p / q)) / C. In float64: the terms are first order in
    the error and cancel to a second-order sum, so float32's 6e-8 rounding of p / q would swamp a KL of
    1e-12, which a fusion's rounding-level error gives."""
    if not (math.isfinite(total_ref) and math.isfinite(total_got)):
        return math.nan
    if total_ref == 0 or total_got == 0:
        return 0.0 if total_ref == total_got else math.inf
    r_buf, c_buf, s_buf = buffers
    scale, floor = total_got / total_ref, KL_FLOOR * total_got
    result = 0.0
    for start in range(0, ref.size, r_buf.size):
        count = min(r_buf.size, ref.size - start)
        r, c, s = r_buf[:count], c_buf[:count], s_buf[:count]
        np.copyto(r, ref[start:start + count], casting="unsafe")
        np.copyto(c, got[start:start + count], casting="unsafe")
        np.abs(r, out=s)
        s *= scale
        np.abs(c, out=c)
        np.maximum(c, floor, out=c)
        np.divide(s, c, out=c)
        np.maximum(c, TINY, out=c)  # p = 0: ln(TINY) is finite and multiplies 0
        np.log(c, out=c)
        result += float(np.dot(s, c))
    return result / total_got


def _peak(pair: Pair, side: str) -> float:
    """The largest magnitude on `side` of a finite pair, from its bounds; inf (unknown) otherwise."""
    return max(-pair.bounds(side)[0], pair.bounds(side)[1]) if pair.finite and pair.size else math.inf


def local_error(local: dict[str, float] | None) -> float:
    """A node's local error for ranking: its relative Euclidean distance, NaN as infinitely bad."""
    if not local:
        return 0.0
    value = local["rel_euclidean"]
    return math.inf if math.isnan(value) else value


def lower_is_worse(metric: str) -> bool:
    return metric in LOWER_IS_WORSE or metric.startswith("min_")


def worst_over(results: Sequence[Mapping[str, float]], metrics: Sequence[str] = METRICS) -> dict[str, float]:
    """Each of `metrics` that every one of `results` holds (in the order of `metrics`), worst over them: the
    smallest where lower is worse (cosine, sqnr_db, min_*), else the largest. NaN counts as worst: a NaN in
    any result makes that metric's worst NaN, independent of the results' order (Python's max(1.0, nan) is
    1.0 but max(nan, 1.0) is nan). Empty when `results` is."""
    worst: dict[str, float] = {}
    for metric in metrics:
        if not results or any(metric not in result for result in results):
            continue
        worst[metric] = worst_value([result[metric] for result in results], metric)
    return worst


def worst_value(values: Sequence[float], metric: str) -> float:
    """The worst of one metric's `values` (not empty): the smallest where lower is worse, else the largest;
    NaN if any is NaN, whatever their order (Python's max(1.0, nan) is 1.0 but max(nan, 1.0) is nan)."""
    if any(math.isnan(value) for value in values):
        return math.nan
    return min(values) if lower_is_worse(metric) else max(values)
