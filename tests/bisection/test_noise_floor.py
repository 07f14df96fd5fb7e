"""The noise floor's decision and its one-line advice, and a probe's early exit, on a real ORT session."""

import logging
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.noise_floor import above_rounding, measure_floor, suggest
from accubisect.core.accuracy import AccuracyCheck
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU

ACCURACY = {"rtol": 1e-3, "atol": 1e-4, "ntol": 0.0, "cosine": None, "min_pass_fraction": 1.0, "val_func": None}
CHECK = AccuracyCheck.from_config(ACCURACY)
NOISE = {"passed": False, "worst": {"max_abs": 0.01, "max_rel": 3.0, "cosine": 0.9999937, "mismatch": 0.0011}}


def test_only_nodes_beyond_rounding_are_kept_in_fp32():
    ranking = [{"name": "sq", "local_error": float("inf"), "overflow": 0.2},
               {"name": "sum", "local_error": 0.02, "overflow": 0.0},
               {"name": "unmeasured", "local_error": None, "overflow": 0.0},
               {"name": "conv", "local_error": 0.0014, "overflow": 0.0}]
    assert above_rounding(ranking, "fp16") == ["sq", "sum", "unmeasured"]  # 10 * 2^-11 = 0.0049
    assert above_rounding(ranking, "bf16") == ["sq", "unmeasured"]  # 10 * 2^-8 = 0.039


def test_suggestions_are_lenient_one_digit_roundings():
    assert suggest(NOISE["worst"], CHECK) == {"ntol": 0.002, "cosine": 0.999993}
    assert suggest({**NOISE["worst"], "mismatch": 0.03}, CHECK)["ntol"] == 0.03
    assert suggest(NOISE["worst"], replace(CHECK, val_func="check:ok")) == {}


@pytest.mark.parametrize(("worst", "expected"), [
    ({"max_abs": 0.013, "max_rel": 9.0, "cosine": 0.97, "mismatch": 0.93}, {"atol": 0.02, "cosine": 0.97}),
    ({"max_abs": 0.013, "max_rel": 9.0, "cosine": -0.95, "mismatch": 1.0}, {"atol": 0.02}),
])
def test_no_suggestion_is_a_check_that_cannot_fail(worst, expected):
    """Most elements outside rtol/atol: `ntol` would round up to 1, which passes any tensor, so the floor's
    largest absolute error is suggested as `atol`; a cosine bound at -1 would pass any tensor too."""
    suggestion = suggest(worst, CHECK)
    assert suggestion == expected
    assert suggestion.get("ntol", 0) < 1 and suggestion.get("cosine", 0) > -1


def test_a_floor_below_the_check_warns_in_one_line(caplog):
    ranking = [{"name": f"conv{i}", "local_error": 0.001, "overflow": 0.0} for i in range(400)]
    with caplog.at_level(logging.WARNING, "accubisect"):
        floor = measure_floor(ranking, "fp16", CHECK, probe=lambda off: NOISE, reduced_verdict=NOISE, key_of=None)
    assert floor["kept_fp32"] == [] and floor["verdict"] is None  # the compare stage's reduced run
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "\n" not in warning and warning == floor["warning"]
    assert warning.startswith("the accuracy check (rtol 0.001, atol 0.0001, ntol 0, min pass fraction 1) is "
                              "tighter than fp16 reaches "
                              "on this model: no node makes more than rounding error")
    assert "accuracy.ntol: 0.002, or accuracy.ntol: 1 with accuracy.cosine: 0.999993" in warning


def test_a_guess_that_passes_means_the_check_is_within_reach(caplog):
    """At rtol 1e-2 a recognizer's fully reduced run fails by one element, and keeping one node in fp32
    passes: no warning, though no node makes more than rounding error."""
    ranking = [{"name": f"conv{i}", "local_error": 0.001, "overflow": 0.0} for i in range(400)]
    probed = []

    def probe(off):
        probed.append(off)
        return {"passed": off == frozenset(["conv0"]), "worst": {}}

    with caplog.at_level(logging.WARNING, "accubisect"):
        floor = measure_floor(ranking, "fp16", CHECK, probe, NOISE, key_of=None)
    assert probed == [frozenset(["conv0"])] and not floor["passed"] and floor["warning"] is None
    assert not caplog.records


def test_a_floor_that_passes_is_silent(caplog):
    ranking = [{"name": "sq", "local_error": float("inf"), "overflow": 0.3},
               {"name": "conv", "local_error": 0.001, "overflow": 0.0}]
    probed = []

    def probe(off):
        probed.append(off)
        return {"passed": True, "worst": {}}

    with caplog.at_level(logging.WARNING, "accubisect"):
        floor = measure_floor(ranking, "fp16", CHECK, probe, NOISE, key_of=lambda off: "k" + "".join(sorted(off)))
    assert probed == [frozenset(["sq"])] and floor["passed"] and floor["warning"] is None
    assert floor["verdict"] == "ksq" and not caplog.records


def scaled_model(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"], name="double")], "g", [x], [y], [two])
    path = tmp_path / "double.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_probe_stops_at_the_first_sample_that_fails(tmp_path):
    """Judged against references for 3 samples, of which the second is wrong: the third is never run."""
    inputs, references = [], []
    for index in range(3):
        x = np.arange(4, dtype=np.float32) + index
        np.savez(tmp_path / f"sample{index}_inputs.npz", x=x)
        np.savez(tmp_path / f"sample{index}_outputs.npz", y=2 * x + (index == 1))
        inputs.append(str(tmp_path / f"sample{index}_inputs.npz"))
        references.append(str(tmp_path / f"sample{index}_outputs.npz"))
    judge = SampleJudge.load(inputs, references, ["y"], ACCURACY)
    session = ort_compile.Runner(scaled_model(tmp_path), ort_compile.CompileOptions("all"), CPU, threads=1).activate()
    early = judge.judge(session)
    assert not early["passed"]
    assert [s["inputs"] for s in early["samples"]] == ["sample0_inputs.npz", "sample1_inputs.npz"]
    whole = judge.judge(session, stop_early=False)
    assert [s["passed"] for s in whole["samples"]] == [True, False, True]
    lenient = SampleJudge.load(inputs, references, ["y"], {**ACCURACY, "min_pass_fraction": 0.6}).judge(session)
    assert lenient["passed"] and len(lenient["samples"]) == 3
