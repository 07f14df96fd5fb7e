"""What a bisection searches and in which order: `bisect.rules` narrows fusion_bisect's candidates, and both
bisections rank them most suspect first, ties keeping the order the rules fired in (fusion) or the
topological order (precision), so that the first probe, and the answer's `ranking`, do not depend on chance."""

import itertools
import math

import pytest
from conftest import compare_report, tensor_row

from accubisect.bisection.fusion_bisect import candidates_of, rank_rules
from accubisect.bisection.precision_bisect import rank_nodes
from accubisect.core.errors import AccubisectError, ConfigError
from accubisect.workflow.plan import check_bisect_rules

FIRED = ["ConvBNFusion", "MatMulAddFusion", "GeluFusion", "GeluApproximation"]


def row(index, node, rule=None, passed=True, mismatch=0.0, local=None, overflow=None):
    """One tensor row of a compare report, with the fields a ranking reads."""
    worst = {"mismatch": mismatch, **({"overflow_cand": overflow} if overflow is not None else {})}
    measured = {"rel_euclidean": local, "max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0} if local is not None else None
    return tensor_row(index, node, rule, passed, worst, measured)


def names(ranking):
    return [entry["name"] for entry in ranking]


def test_bisect_rules_unset_searches_every_rule_that_fired():
    assert candidates_of(FIRED, None) == FIRED


def test_bisect_rules_keeps_the_order_the_rules_fired_in():
    assert candidates_of(FIRED, ["GeluApproximation", "ConvBNFusion"]) == ["ConvBNFusion", "GeluApproximation"]


def test_a_rule_in_bisect_rules_that_did_not_fire_is_one_line_naming_the_rules_that_did():
    with pytest.raises(ConfigError) as error:
        candidates_of(FIRED, ["GeluApproximation", "LayerNormFusion"])
    message = str(error.value)
    assert message.startswith("bisect.rules: ['LayerNormFusion'] did not fire on this model")
    assert all(rule in message for rule in FIRED) and "\n" not in message


@pytest.mark.parametrize(("rules", "message"), [
    (["GeluApprox"], "bisect.rules: unknown fusion rule 'GeluApprox' for ONNX Runtime 1."),
    (["GeluFusionL2"], "bisect.rules: 'GeluFusionL2' is one level of rule 'GeluFusion'; switch that rule"),
])
def test_a_rule_unknown_to_the_installed_onnx_runtime_is_refused_before_anything_runs(rules, message):
    with pytest.raises(AccubisectError) as error:
        check_bisect_rules({"bisect": {"rules": rules}})
    assert str(error.value).startswith(message)
    if rules == ["GeluApprox"]:
        assert "closest: GeluApproximation" in str(error.value)


def test_known_rules_and_no_rules_pass_the_check():
    check_bisect_rules({"bisect": {"rules": ["GeluApproximation", "MatMulAddFusion"]}})
    check_bisect_rules({"bisect": {"rules": None}})


@pytest.mark.parametrize("fired", list(itertools.permutations(["A", "B", "C"])))
def test_rules_with_the_same_evidence_keep_the_order_they_fired_in(fired):
    report = compare_report(tensors=[row(0, "a", "A", mismatch=0.1), row(1, "b", "B", mismatch=0.1),
                                     row(2, "c", "C", mismatch=0.1)])
    assert names(rank_rules(list(fired), report)) == list(fired)
    assert names(rank_rules(list(fired), compare_report())) == list(fired)  # no evidence at all


def test_local_error_ranks_before_the_first_failing_tensor_and_it_before_the_mismatch():
    report = compare_report(tensors=[
        row(0, "early", "Early", passed=False, mismatch=0.01),
        row(1, "local", "Local", passed=False, mismatch=0.01, local=1e-3),
        row(2, "big", "Big", passed=False, mismatch=0.9),
        row(3, "late", "Late", passed=False, mismatch=0.5),
        row(4, "clean", "Clean", passed=True, mismatch=0.0),
    ])
    fired = ["Clean", "Silent", "Late", "Big", "Early", "Local"]
    ranking = rank_rules(fired, report)
    assert names(ranking) == ["Local", "Early", "Big", "Late", "Clean", "Silent"]
    assert ranking[0] == {"name": "Local", "local_error": 1e-3, "first_failing_index": 1, "worst_mismatch": 0.01}
    assert ranking[-1] == {"name": "Silent", "local_error": None, "first_failing_index": None,
                           "worst_mismatch": None}


def test_among_failing_rules_the_larger_mismatch_breaks_a_tie_on_the_first_failing_tensor():
    report = compare_report(tensors=[row(3, "x", "Small", passed=False, mismatch=0.1),
                                     row(3, "x2", "Large", passed=False, mismatch=0.4)])
    assert names(rank_rules(["Small", "Large"], report)) == ["Large", "Small"]


def test_a_nan_local_error_ranks_first():
    report = compare_report(tensors=[row(0, "a", "Finite", passed=False, local=0.5),
                                     row(1, "b", "Nan", local=math.nan)])
    ranking = rank_rules(["Finite", "Nan"], report)
    assert names(ranking) == ["Nan", "Finite"] and ranking[0]["local_error"] == math.inf


def test_a_rules_evidence_is_the_worst_of_all_its_nodes():
    report = compare_report(tensors=[row(0, "g1", "MatMulAddFusion", local=1e-6),
                                     row(5, "g2", "MatMulAddFusion", local=1e-2),
                                     row(2, "gelu", "GeluApproximation", passed=False, local=1e-3)])
    ranking = rank_rules(["GeluApproximation", "MatMulAddFusion"], report)
    assert names(ranking) == ["MatMulAddFusion", "GeluApproximation"] and ranking[0]["local_error"] == 1e-2


@pytest.mark.parametrize("topological", list(itertools.permutations(["n0", "n1", "n2"])))
def test_nodes_with_the_same_evidence_keep_the_topological_order(topological):
    report = compare_report(tensors=[row(i, name, local=1e-3, overflow=0.0) for i, name in enumerate(topological)])
    assert names(rank_nodes(list(topological), report)) == list(topological)


def test_nodes_rank_by_local_error_then_by_overflow_in_the_reduced_run():
    report = compare_report(tensors=[row(0, "quiet"), row(1, "overflows", overflow=0.3), row(2, "worse", local=0.2),
                                     row(3, "bad", local=0.1, overflow=0.9),
                                     row(4, "also_bad", local=0.1, overflow=0.1)])
    ranking = rank_nodes(["quiet", "overflows", "worse", "bad", "also_bad", "unmeasured"], report)
    assert names(ranking) == ["worse", "bad", "also_bad", "overflows", "quiet", "unmeasured"]
    assert ranking[-1] == {"name": "unmeasured", "local_error": None, "overflow": 0.0}
