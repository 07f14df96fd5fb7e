"""accuracy.min_pass_fraction: a configuration passes when at least that fraction of the samples passes. It
decides a probe's verdict (judged on a real ORT session here), whether a bisection has anything to do, and
whether the reference itself fails, so that a bisection is refused."""

import numpy as np
import pytest
from conftest import compare_report, sample_verdict, save_model
from onnx import TensorProto, helper, numpy_helper

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.protocol import nothing_off_passes
from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import PreconditionError
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU

ACCURACY = {"rtol": 1e-3, "atol": 1e-4, "ntol": 0.0, "cosine": None, "val_func": None, "min_pass_fraction": 1.0}


@pytest.mark.parametrize(("verdicts", "fraction", "expected"), [
    ([True] * 4, 1.0, True),
    ([True, True, True, False], 1.0, False),  # the default: one failing sample fails the configuration
    ([True, True, True, False], 0.75, True),  # exactly the fraction passes
    ([False, True, True, False], 0.75, False),
    ([True] * 7 + [False] * 13, 0.35, True),  # 7 of 20 is exactly 0.35
    ([True] * 6 + [False] * 14, 0.35, False),
    ([True] + [False] * 99, 0.01, True),
    ([], 0.5, False),  # no verdict is no pass
    ([], 1.0, False),
])
def test_a_configuration_passes_when_at_least_the_fraction_of_samples_passes(verdicts, fraction, expected):
    assert check(fraction).passes(verdicts) is expected


def check(fraction: float) -> AccuracyCheck:
    return AccuracyCheck.from_config({**ACCURACY, "min_pass_fraction": fraction})


def report(reference: list[bool] | None, candidate: list[bool]):
    """A compare report's verdicts: each sample's candidate, and its reference where golden outputs judged it."""
    judged = reference or [None] * len(candidate)
    return compare_report([sample_verdict(i, ok, ref) for i, (ok, ref) in enumerate(zip(candidate, judged,
                                                                                        strict=True))])


@pytest.mark.parametrize(("reference", "candidate", "fraction", "nothing_to_do"), [
    (None, [True, True, False, True], 1.0, False),  # against the reference dumps: no reference verdict
    (None, [True, True, False, True], 0.75, True),
    ([True] * 4, [True] * 4, 1.0, True),
    ([True, False, True, True], [False] * 4, 0.75, False),  # the reference passes at 3 of 4: bisect
])
def test_a_bisection_has_nothing_to_do_when_the_candidate_passes_at_the_fraction(reference, candidate, fraction,
                                                                                  nothing_to_do):
    assert nothing_off_passes(report(reference, candidate), check(fraction), "not the cause") is nothing_to_do


@pytest.mark.parametrize(("reference", "fraction"), [([True, False, True, True], 1.0),
                                                      ([True, False, False, True], 0.75)])
def test_a_reference_failing_below_the_fraction_refuses_the_bisection(reference, fraction):
    with pytest.raises(PreconditionError, match="^fusion is not the cause$"):
        nothing_off_passes(report(reference, [True] * 4), check(fraction), "fusion is not the cause")


@pytest.fixture
def session(tmp_path):
    """x ─ Mul(2) ─ y, on a real ORT session"""
    two = numpy_helper.from_array(np.asarray(2.0, np.float32), "two")
    path = save_model([helper.make_node("Mul", ["x", "two"], ["y"], name="double")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [two], tmp_path / "double.onnx")
    return ort_compile.Runner(path, ort_compile.CompileOptions("off"), CPU, threads=1).activate()


def samples(folder, right: list[bool]) -> tuple[list[str], list[str]]:
    """One sample of y = 2x per entry of `right`, whose golden output is 2x where it is True and 2x + 1 (a
    failing sample) where it is False."""
    folder.mkdir(exist_ok=True)
    inputs, references = [], []
    rng = np.random.default_rng(0)
    for index, ok in enumerate(right):
        x = rng.normal(size=4).astype(np.float32)
        np.savez(folder / f"sample{index}_inputs.npz", x=x)
        np.savez(folder / f"sample{index}_outputs.npz", y=2 * x + (0 if ok else 1))
        inputs.append(str(folder / f"sample{index}_inputs.npz"))
        references.append(str(folder / f"sample{index}_outputs.npz"))
    return inputs, references


def judged(session, files, fraction: float, stop_early: bool = True) -> dict:
    judge = SampleJudge.load(*files, ["y"], {**ACCURACY, "min_pass_fraction": fraction})
    return judge.judge(session, stop_early)


@pytest.mark.parametrize(("right", "fraction", "passed", "run"), [
    ([False, True, True, True], 1.0, False, 1),  # the default stops at the first failing sample
    ([False, False, True, True], 0.5, True, 4),  # 2 of 4 may still pass: every sample is run
    ([False, False, False, True], 0.5, False, 3),  # after the third failure 2 of 4 can no longer pass
    ([False, False, False, True], 0.25, True, 4),
    ([True, True, False, False], 0.5, True, 4),
    ([True, True, True, True], 1.0, True, 4),
])
def test_a_probe_runs_samples_until_the_fraction_decides_its_verdict(tmp_path, session, right, fraction, passed, run):
    verdict = judged(session, samples(tmp_path / "samples", right), fraction)
    assert verdict["passed"] is passed
    assert [sample["passed"] for sample in verdict["samples"]] == right[:run]


def test_stopping_early_never_changes_the_verdict(tmp_path, session):
    """Every order of 2 passing and 3 failing samples, at every fraction that matters: the verdict of the
    early-stopping probe is the verdict on all samples."""
    orders = sorted({tuple(bit == "1" for bit in f"{n:05b}") for n in range(32) if f"{n:05b}".count("1") == 2})
    for number, order in enumerate(orders):
        files = samples(tmp_path / f"order{number}", list(order))
        for fraction in (0.2, 0.4, 0.5, 1.0):
            early, whole = judged(session, files, fraction), judged(session, files, fraction, stop_early=False)
            assert early["passed"] is whole["passed"] is (2 / 5 >= fraction), (order, fraction)
