"""Instance-level fusion bisection: the hybrid graph surgery (`core/hybrid.py`) on real ORT-compiled graphs
and on hand-built ones, the instance ranking and search over fake verdicts (`bisection/instances.py`), and
instances.json. The real `snakemake fusion_bisect` runs are in test_instances_e2e.py."""

import dataclasses
import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EXAMPLE_MODEL, GELU_APPROXIMATION, compare_report, sample_verdict
from gelu_sites import SCALES, gelu_sites_model
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from accubisect.bisection.driver import drive
from accubisect.bisection.fusion_bisect import FusionBisection
from accubisect.bisection.instances import (
    InstanceProbe,
    InstanceSearch,
    instance_errors,
    judged_rule_level,
    no_hybrid,
    rank_instances,
    rule_level_answer,
    summary,
)
from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.search import Pace
from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import PreconditionError, RevertError, WorkspaceError
from accubisect.core.hybrid import Instance, Surgeon, instances_of, nested_instances
from accubisect.core.strategy import FOUND, NOT_AMONG_CANDIDATES
from accubisect.formats.files import write_json
from accubisect.formats.graph_record import GraphNode, GraphRecord, NestedNode
from accubisect.formats.instances import InstanceEntry, InstancesRecord
from accubisect.formats.linked_weights import WeightsFolder
from accubisect.formats.local_errors import LocalErrors
from accubisect.formats.search_record import UNFINISHED, SearchRecord
from accubisect.formats.verdict import VerdictStore
from accubisect.runtime.backends import backend_named
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.graph import GraphStep, write_graph

ACCURACY = {"rtol": 1e-3, "atol": 1e-4, "ntol": 0.0, "cosine": None, "min_pass_fraction": 1.0, "val_func": None}
FUSION_ON = {"name": "fusion_on", "level": "all", "session_config": GELU_APPROXIMATION, "rules_off": []}


def compiled_and_graph(model, folder):
    compile_variant(CompileStep(model, FUSION_ON, "ort-cpu", folder / "model.onnx", folder / "compile.json"))
    write_graph(GraphStep(model, folder / "model.onnx", folder / "compile.json", folder / "graph.json"))
    return onnx.load(folder / "model.onnx"), GraphRecord.read(folder / "graph.json")


def surgeon_of(compiled, model, graph):
    return Surgeon(compiled, onnx.load(model), {name for node in graph.nodes for name in node.original_nodes})


def run(model, feeds, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    for key, value in GELU_APPROXIMATION.items():
        options.add_session_config_entry(key, value)
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """The five-Gelu-site model compiled at level all with approximate Gelu, its graph and a sample."""
    folder = tmp_path_factory.mktemp("sites")
    model = gelu_sites_model(folder / "sites.onnx")
    compiled, graph = compiled_and_graph(model, folder)
    feeds = {"x": np.random.default_rng(0).normal(0, 1.5, (1, 8, 16)).astype(np.float32)}
    return model, compiled, graph, feeds


def test_the_saved_graph_run_unoptimized_gives_the_fusion_on_outputs_bit_for_bit(sites):
    model, compiled, graph, feeds = sites
    fusion_on = run(model, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    unchanged = surgeon_of(compiled, model, graph).hybrid([])
    assert [node.op_type for node in unchanged.graph.node].count("FastGelu") == len(SCALES)
    for got, want in zip(run(unchanged, feeds), fusion_on, strict=True):
        np.testing.assert_array_equal(got, want)


def test_each_gelu_site_is_one_instance_of_both_rules(sites):
    model, compiled, graph, _ = sites
    instances = instances_of(graph.nodes, ["GeluApproximation"])
    assert len(instances) == len(SCALES)
    assert all(len(i.nodes) == 1 and graph.by_name[i.name].op_type == "FastGelu" for i in instances)
    assert sorted(i.original_nodes[0].split("/")[0] for i in instances) == [f"site{n}" for n in range(len(SCALES))]
    assert all(i.rules == ("GeluFusion", "GeluApproximation") for i in instances)
    assert instances_of(graph.nodes, ["ConvBNFusion"]) == []


def test_a_reverted_site_computes_as_the_original_model_and_the_others_stay_fused(sites):
    """Reverting site 1's FastGelu gives y1 of the original model bit for bit; every other output stays the
    fusion-on one."""
    model, compiled, graph, feeds = sites
    surgeon = surgeon_of(compiled, model, graph)
    site1 = next(i for i in instances_of(graph.nodes, ["GeluApproximation"]) if i.original_nodes[0] == "site1/gelu/div")
    hybrid = surgeon.hybrid([site1])
    assert [node.op_type for node in hybrid.graph.node].count("FastGelu") == len(SCALES) - 1
    assert {node.name for node in hybrid.graph.node} >= set(site1.original_nodes)
    original, fusion_on = run(model, feeds), run(model, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    got = run(hybrid, feeds)
    np.testing.assert_array_equal(got[1], original[1])
    assert not np.array_equal(got[1], fusion_on[1])
    for index in (0, 2, 3, 4):
        np.testing.assert_array_equal(got[index], fusion_on[index])


def test_every_instance_of_the_example_reverts_to_a_model_that_runs(tmp_path):
    """Each instance of every rule fired on the bundled example (a Gemm with its Reshapes, a FusedConv that
    absorbed a BatchNorm, SkipLayerNormalization) reverts alone and all together; reverting the
    GeluApproximation instance brings the outputs back to fusion-off's within float rounding."""
    compiled, graph = compiled_and_graph(EXAMPLE_MODEL, tmp_path)
    surgeon = surgeon_of(compiled, EXAMPLE_MODEL, graph)
    feeds = dict(np.load(EXAMPLE_MODEL.parent / "samples" / "sample0_inputs.npz"))
    original = run(EXAMPLE_MODEL, feeds)[0]
    gemm = instances_of(graph.nodes, ["MatMulAddFusion"])
    assert any(len(i.nodes) == 3 and graph.by_name[i.name].op_type == "Gemm" for i in gemm)  # Reshape, Gemm, Reshape
    for rule in graph.fired_rules:
        instances = instances_of(graph.nodes, [rule])
        assert all(surgeon.why_not(instance) is None for instance in instances)
        assert run(surgeon.hybrid(instances), feeds)[0].shape == original.shape
    gelu = instances_of(graph.nodes, ["GeluApproximation"])
    assert np.abs(run(surgeon.hybrid(gelu), feeds)[0] - original).max() < 1e-5
    assert np.abs(run(surgeon.hybrid([]), feeds)[0] - original).max() > 1e-4


def const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def model_of(nodes, initializers=(), inputs=("x",), outputs=("y",)):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in outputs],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def fused(name, originals, rules=("R",), index=0, op_type="Fused", inputs=(), outputs=()):
    return GraphNode(index, name, op_type, "ai.onnx", tuple(inputs), tuple(outputs), tuple(originals),
                     rules[-1] if rules else None, tuple(rules))


def test_a_constant_the_instance_reads_is_copied_in_with_it():
    """x ─ Add(c) ─ Relu ─ y, c a Constant node; compiled: x ─ Fused(Add+Relu, reading its own folded c) ─ y.
    Reverting copies the Add, the Relu and the Constant that ORT had folded away."""
    original = model_of([helper.make_node("Constant", [], ["c"], value=const("v", [1, -2, 3, -4]), name="c"),
                         helper.make_node("Add", ["x", "c"], ["t"], name="add"),
                         helper.make_node("Relu", ["t"], ["y"], name="relu")])
    compiled = model_of([helper.make_node("Add", ["x", "c_folded"], ["y"], name="fused")],
                        [const("c_folded", [1, 0, 3, 0])])
    instance = Instance("fused", ("fused",), ("add", "relu"), ("R",))
    hybrid = Surgeon(compiled, original, {"add", "relu"}).hybrid([instance])
    assert sorted(node.name for node in hybrid.graph.node) == ["add", "c", "relu"]
    assert [tensor.name for tensor in hybrid.graph.initializer] == []  # c_folded was read only by the fused node
    x = np.array([1, 1, -5, 5], np.float32)
    np.testing.assert_array_equal(ReferenceEvaluator(hybrid).run(None, {"x": x})[0], [2, 0, 0, 1])


def test_an_original_initializer_the_compiled_graph_dropped_is_copied_in():
    original = model_of([helper.make_node("Mul", ["x", "w"], ["y"], name="mul")], [const("w", [2, 2, 2, 2])])
    compiled = model_of([helper.make_node("Add", ["x", "x"], ["y"], name="rewritten")])
    hybrid = Surgeon(compiled, original, {"mul"}).hybrid([Instance("rewritten", ("rewritten",), ("mul",), ("R",))])
    assert [tensor.name for tensor in hybrid.graph.initializer] == ["w"]
    assert ReferenceEvaluator(hybrid).run(None, {"x": np.ones(4, np.float32)})[0].tolist() == [2, 2, 2, 2]


def test_an_instance_whose_output_is_a_layout_tensor_cannot_be_reverted_alone():
    """x ─ A ─ t ─ B ─ y compiled as x ─ A' ─ blocked ─ B' ─ y: `blocked` is no tensor of the original model."""
    original = model_of([helper.make_node("Relu", ["x"], ["t"], name="a"), helper.make_node("Relu", ["t"], ["y"],
                                                                                            name="b")])
    compiled = model_of([helper.make_node("Relu", ["x"], ["blocked"], name="a_nchwc"),
                         helper.make_node("Relu", ["blocked"], ["y"], name="b_nchwc")])
    surgeon = Surgeon(compiled, original, {"a", "b"})
    first = Instance("a_nchwc", ("a_nchwc",), ("a",), ("R",))
    assert "its output 'blocked' is no tensor of the original model" in surgeon.why_not(first)
    with pytest.raises(RevertError, match="cannot be reverted alone"):
        surgeon.hybrid([first])
    both = surgeon.hybrid([first, Instance("b_nchwc", ("b_nchwc",), ("b",), ("R",))])
    assert [node.name for node in both.graph.node] == ["a", "b"]


def test_an_instance_reading_a_tensor_inside_another_fused_node_cannot_be_reverted():
    """x ─ A ─ t ─ B ─ u and t ─ C ─ y; compiled: F (A and B) makes u, G (C) reads x: C's input t is inside F."""
    original = model_of([helper.make_node("Relu", ["x"], ["t"], name="a"),
                         helper.make_node("Neg", ["t"], ["u"], name="b"),
                         helper.make_node("Abs", ["t"], ["y"], name="c")], outputs=("u", "y"))
    compiled = model_of([helper.make_node("Neg", ["x"], ["u"], name="f"),
                         helper.make_node("Abs", ["x"], ["y"], name="g")], outputs=("u", "y"))
    surgeon = Surgeon(compiled, original, {"a", "b", "c"})
    reason = surgeon.why_not(Instance("g", ("g",), ("c",), ("R",)))
    assert "it reads 't', which the compiled graph lacks: it is computed inside another fused node" in reason
    assert surgeon.why_not(Instance("f", ("f",), ("a", "b"), ("R",))) is None


def test_an_if_node_reverts_with_what_its_branches_read_from_outside():
    """x ─ Add(w) ─ t ─ If(c: then Neg(t) / else Abs(t)) ─ y, compiled with the Add folded into the If's
    branches (`fused` reads x): reverting copies the Add and the initializer w its branches need outside."""
    branch = lambda op, name: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["t"], [f"{name}_out"]), helper.make_node("Relu", [f"{name}_out"], [f"{name}_y"])],
        name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [4])])
    condition = numpy_helper.from_array(np.array(True), "c")
    branches = {"then_branch": branch("Neg", "then"), "else_branch": branch("Abs", "else")}
    original = model_of([helper.make_node("Add", ["x", "w"], ["t"], name="add"),
                         helper.make_node("If", ["c"], ["y"], name="if", **branches)], [const("w", [1] * 4), condition])
    compiled = model_of([helper.make_node("Neg", ["x"], ["y"], name="fused")], [condition])
    hybrid = Surgeon(compiled, original, {"add", "if"}).hybrid([Instance("fused", ("fused",), ("add", "if"), ("R",))])
    assert [node.name for node in hybrid.graph.node] == ["add", "if"]
    assert sorted(tensor.name for tensor in hybrid.graph.initializer) == ["c", "w"]
    x = np.array([1, -3, 0, 2], np.float32)
    np.testing.assert_array_equal(ReferenceEvaluator(hybrid).run(None, {"x": x})[0], [0, 2, 0, 0])


def test_instances_group_compiled_nodes_that_share_original_nodes():
    nodes = [fused("reshape_in", ["mm", "add"], ["MatMulAddFusion"], 0, "Reshape"),
             fused("gemm", ["mm", "add"], ["MatMulAddFusion"], 1, "Gemm"),
             fused("reshape_out", ["mm", "add"], ["MatMulAddFusion"], 2, "Reshape"),
             fused("reorder", ["conv"], [], 3, "ReorderInput"),
             fused("conv_nchwc", ["conv", "relu"], ["ConvActivationFusion"], 4, "Conv"),
             fused("plain", ["other"], [], 5, "Relu")]
    found = instances_of(nodes, ["MatMulAddFusion", "ConvActivationFusion"])
    assert [(i.name, i.nodes) for i in found] == [("gemm", ("reshape_in", "gemm", "reshape_out")),
                                                 ("conv_nchwc", ("reorder", "conv_nchwc"))]
    assert found[1].original_nodes == ("conv", "relu") and found[1].rules == ("ConvActivationFusion",)
    assert instances_of(nodes, ["GeluFusion"]) == []


def test_instances_inside_subgraphs_group_by_subgraph_and_say_they_cannot_be_reverted():
    """In the then_branch of If `branch`: a Gemm between Reshapes joined by fused-only tensors (one instance) and
    two FastGelu joined by a tensor of the original model (two); a FastGelu in a Loop body (one more)."""
    def inner(owner, subgraph, index, name, op, inputs, outputs, rules):
        return NestedNode(owner, subgraph, index, name, op, "", tuple(inputs), tuple(outputs), tuple(rules))
    mm = ["MatMulAddFusion"]
    gelu = ["GeluFusion", "GeluApproximation"]
    nodes = [inner("branch", "then_branch", 0, "r0", "Reshape", ["x"], ["t0"], mm),
             inner("branch", "then_branch", 1, "gemm", "Gemm", ["t0"], ["t1"], mm),
             inner("branch", "then_branch", 2, "r1", "Reshape", ["t1"], ["h"], mm),
             inner("branch", "then_branch", 3, "FastGelu", "FastGelu", ["h"], ["g"], gelu),
             inner("branch", "then_branch", 4, "FastGelu_1", "FastGelu", ["g"], ["g2"], gelu),
             inner("loop", "body", 0, "FastGelu", "FastGelu", ["v"], ["w"], gelu)]
    found = nested_instances(nodes, ["MatMulAddFusion", "GeluApproximation"], {"x", "h", "g", "g2", "v", "w"})
    assert [(i.name, i.nodes) for i, _ in found] == [
        ("branch/then_branch/gemm", ("branch/then_branch/r0", "branch/then_branch/gemm", "branch/then_branch/r1")),
        ("branch/then_branch/FastGelu", ("branch/then_branch/FastGelu",)),
        ("branch/then_branch/FastGelu_1", ("branch/then_branch/FastGelu_1",)),
        ("loop/body/FastGelu", ("loop/body/FastGelu",))]
    assert found[3][1] == ("instance loop/body/FastGelu: inside the body of loop: an instance inside a subgraph (If "
                           "branch, Loop or Scan body) cannot be reverted alone today")
    assert [i.name for i, _ in nested_instances(nodes, ["MatMulAddFusion"], {"x", "h", "g", "g2"})] == [
        "branch/then_branch/gemm"]


def test_an_nchwc_chain_joined_by_blocked_tensors_is_one_instance():
    """x ─ ReorderInput ─ b0 ─ conv1 ─ b1 ─ conv2 ─ b2 ─ ReorderOutput ─ y, then Relu: b0..b2 are blocked
    tensors the original model lacks, so the chain reverts only whole; the Relu is its own instance."""
    nodes = [fused("reorder_in", ["c1"], [], 0, "ReorderInput", ["x"], ["b0"]),
             fused("conv1", ["c1"], ["NchwcTransformer"], 1, "Conv", ["b0"], ["b1"]),
             fused("conv2", ["c2", "r2"], ["ConvActivationFusion", "NchwcTransformer"], 2, "Conv", ["b1"], ["b2"]),
             fused("reorder_out", ["c2", "r2"], [], 3, "ReorderOutput", ["b2"], ["t"]),
             fused("relu", ["relu"], ["NchwcTransformer"], 4, "Relu", ["t"], ["y"])]
    original_tensors = {"x", "c1_out", "c2_out", "t", "y"}
    chain, relu = instances_of(nodes, ["NchwcTransformer"], original_tensors)
    assert chain.name == "conv1" and chain.nodes == ("reorder_in", "conv1", "conv2", "reorder_out")
    assert chain.original_nodes == ("c1", "c2", "r2") and chain.rules == ("NchwcTransformer", "ConvActivationFusion")
    assert relu.nodes == ("relu",)
    assert len(instances_of(nodes, ["NchwcTransformer"])) == 3  # joined by original nodes only: conv1 | conv2 | relu


def test_instances_are_ranked_by_local_error_ties_and_unmeasured_in_graph_order():
    instances = [Instance(name, (name,), (), ("R",)) for name in ("a", "b", "c", "d")]
    local = LocalErrors({"a": {"rel_euclidean": 1e-6}, "b": {"rel_euclidean": 1e-3}, "d": {"rel_euclidean": 1e-6}}, ())
    errors = instance_errors(instances, local)
    assert errors == {"a": 1e-6, "b": 1e-3, "c": None, "d": 1e-6}
    assert [entry["name"] for entry in rank_instances(instances, errors)] == ["b", "a", "d", "c"]


@pytest.mark.parametrize("seed", range(200))
def test_the_search_finds_exactly_the_breaking_instances(tmp_path, seed):
    """Fake verdicts: a hybrid passes when every breaking instance is reverted. Whatever the number of
    instances, which of them break and how well local error ranks them, the search as the job runs it (the
    driver over `InstanceSearch`) names exactly those, and never probes an instance that cannot be reverted."""
    rng = random.Random(seed)
    names = [f"Gelu_{i}" for i in range(rng.randint(1, 40))]
    breaking = set(rng.sample(names, rng.randint(1, min(4, len(names)))))
    errors = {name: rng.random() * (10 if name in breaking and rng.random() < 0.7 else 1) for name in names}
    instances = [Instance(name, (name,), (), ("R",)) for name in [*names, "stuck"]]
    reasons = {**dict.fromkeys(names), "stuck": "instance stuck: cannot be reverted alone"}
    calls = []

    def probe(off, threads, stop_early=True):
        calls.append(off)
        passed = breaking <= off
        return {"passed": passed, "samples": [{"passed": passed}], "worst": {}}

    fusion_on_fails = InstanceSearch(compare_report([sample_verdict(0, False, True)]), AccuracyCheck.from_config(
        ACCURACY), tuple(instances), reasons, {**errors, "stuck": 100.0}, probe)
    store = VerdictStore(tmp_path / "instance_probe", {"stage": "instance_probe", "seed": seed})
    found = drive(fusion_on_fails, store, Pace(rng.randint(1, 4), 1))
    assert found.status == FOUND and set(found.culprits) == breaking
    assert [entry["name"] for entry in found.ranking] == [entry["name"] for entry in rank_instances(
        instances[:-1], errors)]
    assert len(set(calls)) == len(calls) and not any("stuck" in off for off in calls)  # none twice, none stuck
    k = len(breaking)
    assert len(calls) <= 2 * (k * np.log2(max(len(names) / k, 2)) + k) + 2 * k + 2


def record():
    return InstancesRecord(
        ("GeluApproximation", "CastChainElimination"),
        (InstanceEntry("FastGelu", ("FastGelu",), ("div", "erf"), ("GeluFusion", "GeluApproximation"), 1e-4, None,
                       True),
         InstanceEntry("FastGelu_token_1", ("FastGelu_token_1",), ("div_1",), ("GeluFusion", "GeluApproximation"),
                       1e-7, None, False),
         InstanceEntry("conv", ("reorder", "conv"), ("conv",), ("GeluApproximation",), None,
                       "instance conv: its output 'blocked' is no tensor of the original model", None)),
        {"status": "found", "culprits": ["FastGelu"], "minimal": True, "search": "3 probe(s) in 2 round(s)"},
        {"reverted": ["FastGelu"], "passed": True})


def test_instances_json_reads_back_as_written_and_says_which_instances_break(tmp_path):
    path = tmp_path / "instances.json"
    record().write(path)
    assert InstancesRecord.read(path) == record()
    rules = InstancesRecord.read(path).to_json()["rules"]
    assert rules["GeluApproximation"]["break"] == ["FastGelu"]
    assert rules["GeluApproximation"]["fused_nodes"]["FastGelu"] == {"FastGelu": ["div", "erf"]}
    assert rules["CastChainElimination"] == {"instances": 0, "break": [], "not_revertable": [], "fused_nodes": {}}
    assert record().summary_lines() == [
        "rule GeluApproximation: 1 of 3 instances breaks accuracy: FastGelu (1 cannot be reverted alone and stay "
        "fused: conv)",
        "rule CastChainElimination: 0 of 0 instances break accuracy"]
    budget = dataclasses.replace(record(), search={**record().search, "status": "unfinished", "minimal": False})
    assert budget.summary_lines()[0].startswith("rule GeluApproximation: reverting 1 of 3 instances passes (not "
                                                "proven minimal): FastGelu")
    healthy = InstancesRecord((), (), {"status": "found", "culprits": [], "minimal": True},
                              {"reverted": [], "passed": True})
    assert healthy.summary_lines() == ["no culprit rules: fusion_bisect switched no rule off, so no instance is "
                                       "searched"]


def test_instances_json_of_another_format_is_refused_in_one_line(tmp_path):
    path = tmp_path / "key" / "instances.json"
    write_json(path, {**record().to_json(), "format": 0})
    with pytest.raises(WorkspaceError, match=f"not a record of fused instances of this accubisect version .*delete "
                                             f"{tmp_path / 'key'}"):
        InstancesRecord.read(path)


def test_the_instance_search_words_a_failing_reference_as_fusion_bisect_does():
    """One precondition line for every search that starts from the fusion comparison (`ComparedSearch`)."""
    fusion_words = (FusionBisection.cause, FusionBisection.reference_words, FusionBisection.advice)
    assert (InstanceSearch.cause, InstanceSearch.reference_words, InstanceSearch.advice) == fusion_words

    def comparing(*passed):  # its preconditions alone are asked: no instance, a probe never called
        return InstanceSearch(compare_report([sample_verdict(0, *passed)]), AccuracyCheck.from_config(ACCURACY), (),
                              {}, {}, lambda off, threads, stop_early=True: pytest.fail("probed"))

    with pytest.raises(PreconditionError, match=r"^the model fails even with fusion off \(fusion_off fails against "
                                                r"the golden outputs\): fusion is not the cause; check the golden "
                                                r"outputs and the accuracy check$"):
        comparing(False, False).nothing_off_passes()
    assert comparing(True, True).nothing_off_passes()
    assert not comparing(False, True).nothing_off_passes()


def test_no_hybrid_names_why_the_search_found_none_that_passes():
    """Reverting every revertable instance still fails, or the budget ran out before any hybrid passed: the
    reason instances.json and instances.txt give; a search that found a passing hybrid has none."""
    probe = {"round": 0, "off": ["a", "b"], "passed": False}
    stuck = SearchRecord("fusion_instances", ({"name": "a"}, {"name": "b"}), (probe,), NOT_AMONG_CANDIDATES, ())
    assert no_hybrid(stuck, 2, 1) == ("reverting all 2 revertable instance(s) still fails; 1 cannot be reverted "
                                      "alone", "1 probe(s) in 1 round(s)")
    budget = SearchRecord("fusion_instances", ({"name": "a"},), (probe,), UNFINISHED, (),
                          stopped_by="bisect.max_probes (1)")
    reason, line = no_hybrid(budget, 1, 0)
    assert reason == line == ("bisect.max_probes (1) ran out after 1 probe(s), before any hybrid passed; raise it and "
                              "rerun to go on from the verdicts on disk")
    found = SearchRecord("fusion_instances", ({"name": "a"},), ({**probe, "passed": True},), FOUND, ("a",))
    assert no_hybrid(found, 1, 0) == (None, "1 probe(s) in 1 round(s)")
    best_so_far = dataclasses.replace(budget, culprits=("a",))
    assert no_hybrid(best_so_far, 1, 0)[0] is None


def test_with_no_hybrid_that_passes_the_record_says_what_is_known_and_names_the_rule_level_answer(tmp_path):
    """Every instance's verdict is unknown, the stuck ones are named, and the last line says hybrid.onnx is the
    fusion-on graph compiled with the culprit rules off; such a record reads back as written."""
    reason = "reverting all 2 revertable instance(s) still fails; 1 cannot be reverted alone"
    unknown = tuple(dataclasses.replace(entry, breaks=None) for entry in record().instances)
    fallback = dataclasses.replace(
        record(), instances=unknown,
        search={"status": NOT_AMONG_CANDIDATES, "culprits": [], "minimal": True, "search": "2 probe(s) in 1 round(s)"},
        hybrid={"reverted": [], "passed": True, "fallback": reason, "rules_off": ["GeluApproximation"]})
    fallback.write(tmp_path / "instances.json")
    assert InstancesRecord.read(tmp_path / "instances.json") == fallback and fallback.fallback == reason
    assert summary(fallback).splitlines() == [
        "rule GeluApproximation: which of its 3 instances break accuracy is not known (1 cannot be reverted alone: "
        "conv)",
        "rule CastChainElimination: which of its 0 instances break accuracy is not known",
        f"no hybrid of reverted instances passes ({reason}): hybrid.onnx is the rule-level answer: the fusion-on "
        "graph compiled with GeluApproximation, CastChainElimination off (run it with graph optimization off)"]
    assert record().fallback is None  # a file written before the field existed, or a hybrid that passes
    assert summary(record()).splitlines()[-1].startswith("3 probe(s) in 2 round(s); hybrid.onnx reverts 1 instance(s)")


def test_the_rule_level_answer_is_the_fusion_on_variant_compiled_with_the_culprits_off_and_must_pass(tmp_path):
    """What hybrid.onnx is when no hybrid of reverted instances passes: the five-site model compiled as fusion-on
    with GeluApproximation off keeps every Gelu exact (com.microsoft Gelu, no FastGelu) and passes on every
    sample run unoptimized; an answer that switched off a rule that is not the cause fails, and is refused in
    one line."""
    model = gelu_sites_model(tmp_path / "sites.onnx")
    compiled, graph = compiled_and_graph(model, tmp_path)
    reference, rng, inputs, references = ReferenceEvaluator(str(model)), np.random.default_rng(3), [], []
    for index in range(2):
        x = rng.normal(0, 1.5, (1, 8, 16)).astype(np.float32)
        inputs.append(tmp_path / f"sample{index}_inputs.npz")
        references.append(tmp_path / f"sample{index}_outputs.npz")
        np.savez(inputs[-1], x=x)
        np.savez(references[-1], **{f"y{site}": y for site, y in enumerate(reference.run(None, {"x": x}))})
    judge = SampleJudge.load(inputs, references, [f"y{site}" for site in range(len(SCALES))], ACCURACY)
    weights = WeightsFolder(tmp_path / "weights")
    probe = InstanceProbe(surgeon_of(compiled, model, graph), {}, judge, backend_named("ort-cpu"), weights.folder)
    answer, rules_off = rule_level_answer(model, tmp_path / "compile.json", "ort-cpu", ["GeluApproximation"], 1,
                                          weights)
    ops = [node.op_type for node in answer.graph.node]
    assert rules_off == ["GeluApproximation"] and ops.count("Gelu") == len(SCALES) and "FastGelu" not in ops
    verified = judged_rule_level(probe, answer, ["GeluApproximation"], "why", 1)
    assert verified["passed"] and [sample["passed"] for sample in verified["samples"]] == [True, True]
    assert not probe.judged(compiled, 1)["passed"]  # the fusion-on graph itself fails on these samples
    wrong, _ = rule_level_answer(model, tmp_path / "compile.json", "ort-cpu", ["CastElimination"], 1, weights)
    refused = (r"^the rule-level answer does not hold: the fusion-on graph compiled with CastElimination off fails "
               r"on 2 sample\(s\) run with graph optimization off, and no hybrid of reverted instances passes \(why\)$")
    with pytest.raises(PreconditionError, match=refused):
        judged_rule_level(probe, wrong, ["CastElimination"], "why", 1)
