import math
from dataclasses import replace

import numpy as np
import pytest

from accubisect.core.accuracy import AccuracyCheck, ValFunc
from accubisect.core.metrics import (
    BLOCK,
    Pair,
    ShapeMismatch,
    block_metrics,
    cosine_similarity,
    kl_divergence,
    mismatch_fraction,
    pair_metrics,
    range_fractions,
    relative_euclidean,
    sqnr_db,
    tensor_metrics,
    worst_value,
)

TOL = AccuracyCheck(rtol=1e-3, atol=1e-4, ntol=0.0)


def test_hand_computed_values():
    ref = np.array([1.0, 2.0, -2.0, 4.0], np.float32)
    got = np.array([1.0, 2.5, -2.0, 3.0], np.float32)
    m = tensor_metrics(ref, got, rtol=0.1, atol=0.0)
    assert m["max_abs"] == 1.0
    assert m["mean_abs"] == pytest.approx(1.5 / 4)
    assert m["rmse"] == pytest.approx(math.sqrt((0.25 + 1.0) / 4))
    assert m["max_rel"] == pytest.approx(0.25)  # 0.5 / 2 and 1 / 4
    assert m["mismatch"] == pytest.approx(0.5)  # errors 0.5 > 0.2 and 1.0 > 0.4
    assert m["cosine"] == pytest.approx(np.dot(ref, got) / (np.linalg.norm(ref) * np.linalg.norm(got)))


def test_identical_tensors_including_infinities_have_no_error():
    ref = np.array([0.0, np.inf, -np.inf, 3.0])
    m = tensor_metrics(ref, ref.copy(), rtol=0, atol=0)
    assert (m["max_abs"], m["mismatch"], m["cosine"]) == (0.0, 0.0, 1.0)
    assert m["inf_ref"] == m["inf_cand"] == 2


def test_nan_makes_errors_nan_and_always_fails():
    ref = np.array([1.0, 2.0])
    got = np.array([1.0, np.nan])
    m = tensor_metrics(ref, got, rtol=1, atol=1)
    assert math.isnan(m["max_abs"]) and math.isnan(m["cosine"])
    assert m["mismatch"] == 0.5 and m["nan_cand"] == 1
    row = AccuracyCheck(rtol=1, atol=1, ntol=0.9).compare_arrays(ref, got)
    assert not row["passed"] and "1 new NaN" in row["reasons"]


def test_infinity_against_a_finite_value_is_an_infinite_error():
    m = tensor_metrics(np.array([1.0, 2.0]), np.array([1.0, np.inf]), rtol=1e-3, atol=1e-4)
    assert m["max_abs"] == math.inf and m["mismatch"] == 0.5 and m["inf_cand"] == 1


AWKWARD_PAIRS = [  # (reference, candidate) element by element
    ([np.inf, -np.inf, np.inf, -np.inf], [np.inf, -np.inf, -np.inf, np.inf]),
    ([np.inf, np.inf, -np.inf, 1e308], [5.0, 1e308, -1e308, np.inf]),
    ([np.nan, np.nan, 1.0, 0.0], [np.nan, 1.0, np.nan, 0.0]),
    ([0.0, 1.0, -2.0, 3.0], [1e-4, 1.001, -2.0021, 3.0]),
]


@pytest.mark.parametrize(("rtol", "atol"), [(1e-3, 1e-4), (0.0, 0.0), (1.0, 1.0)])
@pytest.mark.parametrize(("ref", "got"), AWKWARD_PAIRS)
def test_elements_are_judged_as_numpy_isclose_judges_them(ref, got, rtol, atol):
    """|c - r| <= atol + rtol * |r| element by element, where an infinity is close only to the same infinity
    (rtol * inf would let anything match it) and NaN is close to nothing."""
    ref, got = np.array(ref), np.array(got)
    expected = 1 - np.count_nonzero(np.isclose(got, ref, rtol=rtol, atol=atol)) / ref.size
    assert mismatch_fraction(ref, got, rtol, atol) == pytest.approx(expected)


@pytest.mark.parametrize("got", [-np.inf, 5.0, 1e308])
def test_an_infinite_reference_fails_anything_but_the_same_infinity(got):
    row = AccuracyCheck(rtol=0.5, atol=1.0, ntol=0.0).compare_arrays(np.array([1.0, np.inf]), np.array([1.0, got]))
    assert not row["passed"] and row["mismatch"] == 0.5
    assert row["max_abs"] == row["max_rel"] == math.inf and row["rel_euclidean"] == math.inf
    assert row["sqnr_db"] == -math.inf and math.isnan(row["cosine"])


def test_a_matched_infinity_does_not_hide_the_error_elsewhere():
    """[inf, 1] against [inf, 2]: the infinities agree, so the tensor's error is 1 against a signal of 1."""
    m = tensor_metrics(np.array([np.inf, 1.0]), np.array([np.inf, 2.0]), rtol=1e-3, atol=1e-4)
    assert m["mismatch"] == 0.5 and m["max_abs"] == m["max_rel"] == 1.0
    assert m["rel_euclidean"] == 1.0 and m["sqnr_db"] == 0.0


def test_zero_reference_uses_the_relative_floor():
    m = tensor_metrics(np.zeros(3), np.array([0.0, 1e-6, 0.0]), rtol=0, atol=1e-5)
    assert m["max_rel"] == pytest.approx(1e-6 / 1e-12)
    assert m["mismatch"] == 0.0  # within atol


@pytest.mark.parametrize(
    ("ref", "got", "expected"),
    [(np.zeros(4), np.zeros(4), 1.0), (np.zeros(4), np.ones(4), 0.0), (np.full(4, 3.0), np.full(4, 5.0), 1.0),
     (np.array([1.0, 0.0]), np.array([0.0, 1.0]), 0.0), (np.array([1.0, 2.0]), -np.array([1.0, 2.0]), -1.0)],
)
def test_cosine_on_zero_and_constant_tensors(ref, got, expected):
    assert cosine_similarity(ref, got) == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_, np.float64])
def test_metrics_accept_any_dtype(dtype):
    ref = np.array([1, 0, 1, 1]).astype(dtype)
    assert tensor_metrics(ref, ref.copy(), 0, 0)["max_abs"] == 0.0


def test_empty_tensors_pass():
    m = tensor_metrics(np.zeros((0, 3)), np.zeros((0, 3)), 0, 0)
    assert (m["max_abs"], m["mismatch"], m["cosine"]) == (0.0, 0.0, 1.0)


def test_shape_mismatch_is_a_failing_row_not_a_crash():
    with pytest.raises(ShapeMismatch):
        mismatch_fraction(np.zeros(3), np.zeros(4), 0, 0)
    row = TOL.compare_arrays(np.zeros(3), np.zeros(4))
    assert not row["passed"] and row["reasons"] == ["shapes differ"]


def test_ntol_allows_a_fraction_of_mismatches():
    ref, got = np.zeros(10), np.array([1.0] + [0.0] * 9)
    assert not AccuracyCheck(1e-3, 1e-4, ntol=0.05).compare_arrays(ref, got)["passed"]
    assert AccuracyCheck(1e-3, 1e-4, ntol=0.1).compare_arrays(ref, got)["passed"]


def test_cosine_threshold_is_judged_separately():
    ref, got = np.array([1.0, 0.0]), np.array([1.0, 0.5])
    row = AccuracyCheck(rtol=1, atol=1, ntol=0, cosine=0.99).compare_arrays(ref, got)
    assert not row["passed"] and row["reasons"][0].startswith("cosine 0.894")


def test_val_func_replaces_the_tolerances():
    ref, got = {"y": np.array([1.0, 2.0])}, {"y": np.array([1.0, 3.0])}
    assert not TOL.judge_outputs(ref, got, None)["passed"]
    same_argmax = ValFunc("checks:same_argmax", lambda r, c: r["y"].argmax() == c["y"].argmax())  # numpy.bool_
    verdict = replace(TOL, val_func=same_argmax.spec).judge_outputs(ref, got, same_argmax)
    assert verdict["passed"] and verdict["outputs"]["y"]["max_abs"] == 1.0


def test_hand_computed_distance_metrics():
    ref, got = np.array([3.0, 4.0]), np.array([3.0, 3.0])
    assert relative_euclidean(ref, got) == pytest.approx(1 / 5)
    assert sqnr_db(ref, got) == pytest.approx(10 * math.log10(25 / 1))
    p, q = np.array([3, 4]) / 7, np.array([3, 3]) / 6
    assert kl_divergence(ref, got) == pytest.approx(float(np.sum(p * np.log(p / q))))


@pytest.mark.parametrize(
    ("ref", "got", "rel", "sqnr", "kl"),
    [
        (np.zeros(3), np.zeros(3), 0.0, math.inf, 0.0),
        (np.zeros(3), np.ones(3), math.inf, -math.inf, math.inf),
        (np.ones(3), np.zeros(3), 1.0, 0.0, math.inf),
        (np.full(3, 2.0), np.full(3, 2.0), 0.0, math.inf, 0.0),
        (np.array([1.0, np.nan]), np.array([1.0, 1.0]), math.nan, math.nan, math.nan),
        (np.array([1.0, 2.0]), np.array([1.0, np.inf]), math.inf, -math.inf, math.nan),
    ],
)
def test_distance_metrics_on_awkward_tensors(ref, got, rel, sqnr, kl):
    computed = (relative_euclidean(ref, got), sqnr_db(ref, got), kl_divergence(ref, got))
    for value, expected in zip(computed, (rel, sqnr, kl), strict=True):
        assert (math.isnan(value) and math.isnan(expected)) or value == pytest.approx(expected)


def test_low_precision_range_fractions():
    values = np.array([0.0, 1e-6, -1e-5, 1.0, 65504.0, -7e4, np.inf, 3.0])
    assert range_fractions(values, "fp16") == (3 / 8, 2 / 8)  # 65504, -7e4, inf / 1e-6, -1e-5
    assert range_fractions(values, "bf16") == (1 / 8, 0.0)  # only inf is beyond bf16's range
    m = tensor_metrics(values, values, 0, 0, low_precision="fp16")
    assert m["overflow_ref"] == m["overflow_cand"] == 3 / 8


def test_calc_statistics_min_and_max_of_each_side():
    m = tensor_metrics(np.array([1.0, -2.0, np.nan]), np.array([3.0, np.inf, 0.0]), 0, 0)
    assert (m["min_ref"], m["max_ref"], m["min_cand"], m["max_cand"]) == (-2.0, 1.0, 0.0, np.inf)
    empty = tensor_metrics(np.zeros(0), np.zeros(0), 0, 0)
    assert math.isnan(empty["min_ref"]) and math.isnan(empty["max_cand"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
def test_block_by_block_metrics_are_the_whole_pair_metrics(dtype):
    """Over several blocks, with zeros on either side, values beyond fp16's range and below its normals."""
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 100, 2 * BLOCK + 123)
    ref[::7], ref[5], ref[6], ref[-1] = 0.0, 65504.0, 1e-6, -65504.0
    got = ref * (1 + rng.normal(0, 1e-3, ref.size))
    got[::11], got[5], got[-1] = 0.0, 65504.0, -6e4
    ref, got = ref.astype(dtype).reshape(-1, 1), got.astype(dtype).reshape(-1, 1)
    for low_precision in ("fp16", "bf16"):
        blocks = block_metrics(ref, got, 1e-3, 1e-2, low_precision)
        whole = pair_metrics(Pair(ref, got), 1e-3, 1e-2, low_precision)
        assert blocks.keys() == whole.keys()
        for name, value in whole.items():
            assert blocks[name] == pytest.approx(value, rel=1e-9, abs=1e-15), name
    errors = block_metrics(ref, got, 0, 0, error_only=True)
    assert errors == {name: blocks[name] for name in ("cosine", "max_abs", "max_rel", "rel_euclidean")}


def test_block_metrics_leave_empty_and_non_finite_pairs_to_the_whole_pair():
    assert block_metrics(np.zeros(0), np.zeros(0), 0, 0) is None
    assert block_metrics(np.array([1.0, np.nan]), np.ones(2), 0, 0) is None
    assert block_metrics(np.array([np.inf, 1.0]), np.array([np.inf, 1.0]), 0, 0) is None
    assert block_metrics(np.full(4, 1e200), np.full(4, 2e200), 0, 0) is None  # sums of squares overflow
    with pytest.raises(ShapeMismatch):
        block_metrics(np.zeros(2), np.zeros(3), 0, 0)


def test_worst_value_is_nan_wherever_a_nan_is_and_else_the_worst_for_its_metric():
    assert math.isnan(worst_value([math.nan, 2.0], "max_rel")) and math.isnan(worst_value([2.0, math.nan], "max_rel"))
    assert worst_value([0.1, 0.3, 0.2], "rel_euclidean") == 0.3
    assert worst_value([0.99, 0.5, 0.9], "cosine") == 0.5
