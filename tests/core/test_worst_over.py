"""Worst over samples, computed in one place (`metrics.worst_over`) with one NaN rule: NaN counts as worst,
whatever the order of the samples. Python's max(1.0, nan) is 1.0 but max(nan, 1.0) is nan, which is how
the comparison's rows, the probes' verdicts and the local errors each used to depend on sample order."""

from __future__ import annotations

import math

import pytest

from accubisect.core.accuracy import worst_outputs
from accubisect.core.metrics import METRICS, worst_over

NAN = math.nan
GOOD = {"cosine": 0.99, "max_abs": 0.5, "max_rel": 0.1, "mismatch": 0.0, "min_ref": -2.0, "sqnr_db": 40.0}
BROKEN = {"cosine": NAN, "max_abs": NAN, "max_rel": NAN, "mismatch": 1.0, "min_ref": NAN, "sqnr_db": NAN}


@pytest.mark.parametrize("order", ["nan first", "nan last"])
def test_a_nan_in_any_sample_is_the_worst_whatever_the_order(order):
    results = [BROKEN, GOOD] if order == "nan first" else [GOOD, BROKEN]
    worst = worst_over(results)
    assert all(math.isnan(worst[metric]) for metric in ("cosine", "max_abs", "max_rel", "min_ref", "sqnr_db"))
    assert worst["mismatch"] == 1.0


def test_lower_is_worse_for_cosine_sqnr_and_minima_higher_for_the_rest():
    other = {"cosine": 0.5, "max_abs": 0.25, "max_rel": 0.3, "mismatch": 0.2, "min_ref": -1.0, "sqnr_db": 60.0}
    assert worst_over([GOOD, other]) == {"cosine": 0.5, "max_abs": 0.5, "max_rel": 0.3, "sqnr_db": 40.0,
                                         "mismatch": 0.2, "min_ref": -2.0}


def test_keys_follow_the_metrics_order_and_only_metrics_every_result_has():
    worst = worst_over([{"mismatch": 0.1, "cosine": 1.0, "shape_mismatch": "x"}, {"cosine": 0.9, "mismatch": 0.0,
                                                                                    "max_abs": 3.0}])
    assert list(worst) == [m for m in METRICS if m in ("cosine", "mismatch")]
    assert worst_over([GOOD], ("mismatch", "cosine")) == {"mismatch": 0.0, "cosine": 0.99}
    assert worst_over([]) == {}


def test_infinities_are_ordinary_extremes():
    assert worst_over([{"max_abs": math.inf, "cosine": -math.inf}, {"max_abs": 1.0, "cosine": 1.0}]) == {
        "cosine": -math.inf, "max_abs": math.inf}


def _outputs(metrics):
    return {"passed": False, "reasons": [], "outputs": {"y": metrics}}


@pytest.mark.parametrize("order", ["nan first", "nan last"])
def test_a_probes_worst_output_counts_a_nan_sample_whatever_the_order(order):
    good = _outputs({"max_abs": 0.5, "max_rel": 0.1, "cosine": 0.99, "mismatch": 0.0})
    broken = _outputs({"max_abs": NAN, "max_rel": NAN, "cosine": NAN, "mismatch": 1.0})
    worst = worst_outputs([broken, good] if order == "nan first" else [good, broken])
    assert list(worst) == ["max_abs", "max_rel", "cosine", "mismatch"]
    assert math.isnan(worst["max_abs"]) and math.isnan(worst["max_rel"]) and math.isnan(worst["cosine"])
    assert worst["mismatch"] == 1.0


def test_a_probes_worst_output_leaves_out_outputs_of_another_shape():
    assert worst_outputs([_outputs({"shape_mismatch": "(2,) vs (3,)"})]) == {}
