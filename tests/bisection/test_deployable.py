"""The deploy pass on real ONNX Runtime sessions (`bisection/deployable.py`): the search's answer carried to the
user's nodes is made 1-minimal there, or searched again there when it fails, each configuration judged both as
model.onnx (the user's graph converted, run by ORT) and as keep_dtype.txt handed to the compiler, its verdict
kept on disk."""

import os
import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import save_model
from deploy_models import conv_batchnorm, shifted_sum
from onnx import TensorProto, helper, numpy_helper

from accubisect.bisection.deploy_probes import LOW_MAX, BothRoutes, Deployable, low_range
from accubisect.bisection.deploy_settle import InYourModel, Settle, constant_overflow, ranked
from accubisect.bisection.driver import drive
from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.precision_bisect import PrecisionProbe, deployed_line
from accubisect.bisection.search import Budget, Pace
from accubisect.core.strategy import FOUND
from accubisect.core.walk import given_back
from accubisect.formats.bisect_result import AssignedAnswer, DeployedAnswer, PrecisionResult, ResultVerdict
from accubisect.formats.deployed import MINIMIZED, SEARCHED, VERIFIED
from accubisect.formats.finalize_record import FinalizeRecord
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.search_record import UNFINISHED, SearchRecord
from accubisect.formats.verdict import VerdictStore
from accubisect.runtime.backends import CPU
from accubisect.runtime.finalize import finalize, store_low_constants
from accubisect.runtime.ort_compile import CompileOptions, Runner, unoptimized
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.graph import GraphStep, write_graph
from accubisect.stages.precision_stage import tensor_dtypes

BISECT = {"parallel": 1, "max_probes": None, "max_minutes": None}
ACCURACY = {"rtol": 1e-2, "atol": 5e-2, "ntol": 0.0, "min_pass_fraction": 1.0}
FUSION_ON = {"name": "fusion_on", "level": "all", "session_config": {}, "rules_off": []}


def routes(tmp_path, build, shape):
    """The model `build` makes, compiled at level `all` and mapped by the graph stage, two samples with its fp32
    outputs as golden outputs; every node, original or compiled, reduced."""
    path = build(tmp_path / "model.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs, goldens = [], []
    for index in range(2):
        x = np.random.default_rng(index).normal(0, 1, shape).astype(np.float32)
        np.savez(inputs_path := tmp_path / f"sample{index}_inputs.npz", x=x)
        np.savez(golden := tmp_path / f"sample{index}_outputs.npz", y=session.run(None, {"x": x})[0])
        inputs.append(inputs_path)
        goldens.append(golden)
    compiled = tmp_path / "compiled.onnx"
    compile_variant(CompileStep(path, FUSION_ON, "ort-cpu", compiled, tmp_path / "compile.json"))
    write_graph(GraphStep(path, compiled, tmp_path / "compile.json", tmp_path / "graph.json"))
    graph = GraphRecord.read(tmp_path / "graph.json")
    judge = SampleJudge.load(inputs, goldens, ["y"], ACCURACY)
    model, compiled_model = onnx.load(path), onnx.load(compiled)
    dtypes = tensor_dtypes(model, inputs[0], CPU)
    user = Deployable(model, tuple(node.name for node in model.graph.node), "fp16", dtypes, judge, CPU,
                      CompileOptions("all"), path.parent, {}, path.parent)
    probe = PrecisionProbe(compiled_model, frozenset(node.name for node in graph.nodes), "fp16",
                           tensor_dtypes(compiled_model, inputs[0], CPU), judge, CPU, compiled.parent)
    ranges = low_range(model, user.candidates, "fp16", dtypes, judge, CPU, 1, path.parent)
    return BothRoutes(user, probe, graph.nodes, VerdictStore(tmp_path / "search", {}), user.candidates, ranges), graph


def test_a_node_that_rides_along_with_a_fused_node_is_dropped(tmp_path):
    """The search kept the Gemm MatMulAddFusion made of mm and add, and the Sub: three of the user's nodes.
    mm is not needed there, and keep_dtype.txt without it still names the Gemm; add and sub each are needed, so
    the pass ends 1-minimal, and a second pass on the same store probes nothing new."""
    both, graph = routes(tmp_path, shifted_sum, (4, 8))
    gemm = next(node.name for node in graph.nodes if node.op_type == "Gemm")
    found = SearchRecord("precision_bisect", ({"name": gemm}, {"name": "sub"}), (), FOUND, (gemm, "sub"))
    carried = both.carried(graph, set(), found.culprits)
    assert carried == {"mm", "add", "sub"}
    store = VerdictStore(tmp_path / "verdicts", {"model": "shift"})
    settled = Settle(both, store, Pace.from_config(BISECT, 1)).run(carried, found, ranked(both, found, graph, carried))
    assert settled.how == MINIMIZED and settled.keep == ("add", "sub") and settled.minimal
    assert settled.verdict.passed and settled.carried_verdict.passed
    for node in settled.keep:
        assert any(set(p["off"]) == {"add", "sub"} - {node} and not p["passed"] for p in settled.probes)
    again = Settle(both, store, Pace.from_config(BISECT, 1)).run(carried, found, ranked(both, found, graph, carried))
    assert again.keep == settled.keep and all(probe["from_disk"] for probe in again.probes)


def test_a_budget_that_stops_the_pass_keeps_the_passing_configuration_with_the_fewest_nodes_so_far(tmp_path):
    """The pass runs under the driver's budget, probes on disk counted: stopped before any node is given back it
    keeps the carried answer; one probe later, the carried answer less mm; neither is proven 1-minimal, and a
    rerun without a budget goes on from the verdicts on disk to the answer of a pass run through."""
    both, graph = routes(tmp_path, shifted_sum, (4, 8))
    gemm = next(node.name for node in graph.nodes if node.op_type == "Gemm")
    found = SearchRecord("precision_bisect", ({"name": gemm}, {"name": "sub"}), (), FOUND, (gemm, "sub"))
    carried = both.carried(graph, set(), found.culprits)
    store = VerdictStore(tmp_path / "verdicts", {"model": "shift"})
    for budget, how, keep in ((1, VERIFIED, ("mm", "add", "sub")), (2, MINIMIZED, ("add", "sub"))):
        settled = Settle(both, store, Pace.from_config({**BISECT, "max_probes": budget}, 1)).run(
            carried, found, ranked(both, found, graph, carried))
        assert (settled.how, set(settled.keep), settled.minimal) == (how, set(keep), False)
        assert settled.stopped_by == f"bisect.max_probes ({budget})" and settled.verdict.passed
    settled = Settle(both, store, Pace.from_config(BISECT, 1)).run(carried, found, ranked(both, found, graph, carried))
    assert settled.how == MINIMIZED and settled.keep == ("add", "sub") and settled.minimal
    assert sum(not probe["from_disk"] for probe in settled.probes) == 2  # add and sub alone: each needed


@pytest.mark.parametrize(("search", "minimal", "stopped_by", "line"), [
    (FOUND, True, None, "passes in your model, each needed (3 probe(s) in your model)"),
    (UNFINISHED, False, "bisect.max_probes (4)", "passes in your model, not checked one by one (3 probe(s) in your "
                                                 "model)"),
    (FOUND, False, "bisect.max_minutes (2)", "passes in your model, none of them dropped (3 probe(s) in your model); "
                                             "bisect.max_minutes (2) stopped the pass: not proven minimal, raise it "
                                             "and rerun to go on from the verdicts on disk"),
])
def test_a_carried_answer_that_passes_is_summed_up_with_the_budget_that_stopped_its_pass(search, minimal, stopped_by,
                                                                                        line):
    """Kept whole (`verified`), the carried answer is each needed, or the search's budget left no pass to run, or
    the pass was stopped before it dropped a node: then the summary names the budget, as deployed.json does."""
    verdict = ResultVerdict(True, {"max_rel": 0.01}, ("a", "b"), (True,))
    probes = tuple({"round": index, "off": ["a", "b"], "passed": True} for index in range(3))
    result = PrecisionResult(
        candidates=("a", "b", "c"), ranking=(), ranking_use="", probes=(), culprits=("a", "b"), groups=(),
        minimal=minimal, search="", final_verdict=verdict, kept=("c",), status="fixed", mode="force_fp16",
        dtype="fp16", graph="compiled", floor=None, kept_fp32="2 of 3 nodes", keep_dtype=("a", "b"),
        reduced_verdict=ResultVerdict(False, {}), mixlist_black=(), assigned=AssignedAnswer(5, ("A",), search),
        deployed=DeployedAnswer(("a", "b"), verdict, VERIFIED, probes, stopped_by),
        model=FinalizeRecord("m.onnx", "fp16", "compiled", 1, 2, "run on every sample", True, {}))
    assert deployed_line(result) == ("the search's answer (1 of 5 nodes of the compiled graph) keeps 2 node(s) of "
                                     f"your model in fp32: {line}")


@pytest.mark.parametrize("seed", range(30))
def test_given_back_under_the_driver_probes_each_node_left_needed_and_a_budget_keeps_the_fewest_so_far(tmp_path, seed):
    """The pass as the deploy job drives it (`InYourModel` walking `given_back`), over made-up verdicts that are not
    monotone: each node it keeps has its configuration without it probed and failing, nothing kept too (its
    precondition is unknown, so nothing kept is probed, not assumed); stopped by `bisect.max_probes` anywhere, it
    answers the passing configuration with the fewest nodes among those probed."""
    rng = random.Random(seed)
    ranked = [f"n{i}" for i in range(rng.randint(1, 12))]
    needed = set(rng.sample(ranked, rng.randint(0, min(3, len(ranked)))))
    noise = {frozenset(rng.sample(ranked, rng.randint(0, len(ranked)))) for _ in range(4)}
    calls = []

    def passes(kept):
        return needed <= kept and kept not in noise or kept == frozenset(ranked)

    def probe(off, threads, stop_early=True):
        calls.append(off)
        return {"passed": passes(off), "samples": [{"passed": passes(off)}], "worst": {}}

    def searched(store, budget):
        search = InYourModel(tuple({"name": name} for name in ranked), None, probe, given_back)
        return drive(search, VerdictStore(tmp_path / store, {"seed": seed}), Pace(1, 1, budget))

    found = searched("whole", Budget())
    kept, asked = frozenset(found.culprits), list(calls)
    assert found.status == FOUND and passes(kept) and asked[0] == frozenset(ranked) and len(set(asked)) == len(asked)
    for node in kept:
        assert any(set(p["off"]) == kept - {node} and not p["passed"] for p in found.probes), node
    limit = rng.randint(1, len(asked))
    stopped = searched("stopped", Budget(max_probes=limit))
    if limit < len(asked):
        best = min((config for config in asked[:limit] if passes(config)), key=len)
        assert stopped.status == UNFINISHED and frozenset(stopped.culprits) == best
    else:
        assert stopped.culprits == found.culprits and stopped.status == FOUND


def test_an_answer_that_fails_in_the_users_graph_is_searched_again_overflowing_constants_first(tmp_path):
    """ConvBNFusion left one compiled Conv, which passes reduced: nothing carried, and the user's graph fails."""
    both, graph = routes(tmp_path, conv_batchnorm, (1, 3, 8, 8))
    overflow = constant_overflow(both.deployable.model, LOW_MAX["fp16"], both.deployable.weights)
    assert overflow == {"bn": pytest.approx(1e8)}
    found = SearchRecord("precision_bisect", tuple({"name": node.name} for node in graph.nodes), (), FOUND, ())
    carried = both.carried(graph, {node.name for node in graph.nodes}, ())
    ranking = ranked(both, found, graph, carried)
    assert carried == frozenset() and [entry["name"] for entry in ranking] == ["bn", "conv"]
    settled = Settle(both, VerdictStore(tmp_path / "v", {}), Pace.from_config(BISECT, 1)).run(carried, found, ranking)
    assert settled.how == SEARCHED and settled.keep == ("bn",) and not settled.carried_verdict.passed
    assert len(settled.probes) <= 3


def scaled_bias(path):
    """x ─ MatMul(w) ─ Add(b = 65000) ─ Mul(2^-16) ─ y: the bias fits fp16, the bias Add's output (up to ≈ 8e4)
    does not, nor does it reach the output.
    MatMulAddFusion folds the Add into a Gemm, so keeping the MatMul keeps the Add in the compiled route, and
    ORT's CPU provider computes an fp16 Add in fp32 behind Casts: neither run shows the inf."""
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["biased"], name="add"),
             helper.make_node("Mul", ["biased", "s"], ["y"], name="scale")]
    inits = [const("w", rng.normal(0, 2e3, (8, 8))), const("b", np.full(8, 65000.0)), const("s", 2.0**-16)]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits, path)


def test_an_activation_beyond_fp16_that_ort_hides_fails_the_configuration(tmp_path):
    """Leaving the bias Add in fp16 fails by its reference value, naming the tensor, though
    both runs pass it; keeping it (and the Mul reading it) passes, and the verdict reads back from the store."""
    both, graph = routes(tmp_path, scaled_bias, (4, 8))
    assert both.deployable(frozenset({"mm", "scale"}), 1)["passed"]  # what ORT's CPU provider shows
    store = VerdictStore(tmp_path / "verdicts", {"model": "scaled"})
    found = SearchRecord("precision_bisect", tuple({"name": node.name} for node in graph.nodes), (), FOUND, ())
    settle = Settle(both, store, Pace.from_config(BISECT, 1))
    left = settle.verdict(frozenset({"mm", "scale"}))
    assert not left.passed and len(left.samples) == 2
    assert all("tensor 'biased' reaches" in s["reasons"][0] and "max 65504" in s["reasons"][0] for s in left.samples)
    assert store.read(frozenset({"mm", "scale"})) == left
    assert not settle.verdict(frozenset({"mm", "add"})).passed  # the Mul reads it in fp16
    assert settle.verdict(frozenset({"add", "scale"})).passed
    ranking = ranked(both, found, graph, frozenset({"mm", "add", "scale"}))
    assert [e["activation_overflow"] > LOW_MAX["fp16"] for e in ranking] == [True, True, False]
    settled = Settle(both, store, Pace.from_config(BISECT, 1)).run(frozenset({"mm", "add", "scale"}), found, ranking)
    assert settled.how == MINIMIZED and set(settled.keep) == {"add", "scale"} and settled.minimal


def test_configurations_reference_one_file_of_the_converted_constants(tmp_path):
    """x ─ MatMul(w: 64×64, one value beyond fp16) ─ Add(b) ─ y, weights in a data file. The constants the
    reduced nodes read are converted once into one file; each configuration's model references it instead of
    holding its own converted copy, and ORT runs it exactly as the copy it holds inline (inf where w overflows).
    The data file has a second hard link, as while another job links it: onnx's own reader refuses it, ours
    reads it."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (64, 64)).astype(np.float32)
    w[0, 0] = 1e5
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["y"], name="add")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.normal(0, 1, 64).astype(np.float32), "b")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    (tmp_path / "user").mkdir()
    onnx.save(model, str(tmp_path / "user" / "m.onnx"), save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    original = onnx.load(str(tmp_path / "user" / "m.onnx"), load_external_data=False)
    os.link(tmp_path / "user" / "m.onnx.data", tmp_path / "linked.data")
    with pytest.raises(onnx.checker.ValidationError, match="hard link"):
        numpy_helper.to_array(original.graph.initializer[0], str(tmp_path / "user"))
    assert constant_overflow(original, LOW_MAX["fp16"], tmp_path / "user") == {"mm": 1e5}
    folder = tmp_path / "scratch"
    folder.mkdir()
    (folder / "m.onnx.data").symlink_to(tmp_path / "user" / "m.onnx.data")
    dtypes = dict.fromkeys(["x", "w", "b", "m", "y"], "float32")
    stored = store_low_constants(original, {"mm", "add"}, "fp16", dtypes, tmp_path / "user", folder / "fp16.data")
    assert set(stored) == {"w/as_float16", "b/as_float16"}
    x = {"x": rng.normal(0, 1, (4, 64)).astype(np.float32)}
    for reduced in ({"mm"}, {"add"}, {"mm", "add"}):
        referencing = finalize(original, reduced, "fp16", dtypes, tmp_path / "user", stored)
        inline = finalize(original, reduced, "fp16", dtypes, tmp_path / "user")
        if "mm" in reduced:  # w's 8 KiB in fp16: referenced, not held
            assert referencing.ByteSize() < 1024 < inline.ByteSize()
        outputs = [Runner(final.SerializeToString(), unoptimized(folder), CPU).activate().infer(x)["y"]
                   for final in (referencing, inline)]
        np.testing.assert_array_equal(*outputs)
        assert np.isinf(outputs[0]).any() == ("mm" in reduced)
