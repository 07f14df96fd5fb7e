"""`snakemake reduce`'s pure parts: the bisection over node order (fake verdicts, many random cases), the
same as the driver's strategy over configurations (`next_cut`), the two sides run by the one driver over a
real graph with a fake verdict and a real verdict store, subgraph extraction run by ONNX Runtime, and the
repro's own judging against the library's."""

import functools
import importlib.util
import math
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accubisect.bisection.reduce import search
from accubisect.bisection.reduce_probe import Cut, nothing_to_reduce
from accubisect.bisection.repro_script import REPRO
from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import PreconditionError
from accubisect.core.shrink import CUT_FOUND, EARLIEST, LATEST, Found, Probe, next_cut, next_step
from accubisect.core.strategy import Outcome
from accubisect.core.subgraph import Graph, varying_shape
from accubisect.formats.verdict import VerdictStore


def run_search(n, fails, want, hint=None):
    known = {}
    while not isinstance(step := next_step(n, known, want, hint), Found):
        assert step.position not in known  # never probes a position twice
        known[step.position] = fails(step.position)
    return step.position, known


def crossed(position, boundary, want):
    """A monotone verdict: failing from `boundary` on (EARLIEST), or up to it (LATEST)."""
    return position >= boundary if want == EARLIEST else position <= boundary


def monotone_cases(seed, cases, want):
    """Random sizes up to 300 and a boundary in each, with its monotone verdict (`crossed`); the generator too,
    for what a test draws besides."""
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        n = int(rng.integers(1, 300))
        boundary = int(rng.integers(0, n))
        yield rng, n, boundary, functools.partial(crossed, boundary=boundary, want=want)


@pytest.mark.parametrize("want", [EARLIEST, LATEST])
def test_monotone_verdicts_find_the_boundary_in_log_steps(want):
    for rng, n, boundary, fails in monotone_cases(0, 2000, want):
        hint = None if rng.random() < 0.3 else int(rng.integers(-2, n + 2))
        found, known = run_search(n, fails, want, hint)
        assert found == boundary
        assert len(known) <= math.ceil(math.log2(n)) + 2  # the known end, the hint, and the halvings


@pytest.mark.parametrize("want", [EARLIEST, LATEST])
def test_any_verdicts_give_a_failing_position_whose_neighbour_passes(want):
    """Error need not be monotone along the order: the answer is still a probed failure, and the position
    next to it towards the far end was probed and passed (or there is none)."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(1, 120))
        verdicts = rng.random(n) < rng.random()
        verdicts[n - 1 if want == EARLIEST else 0] = True
        found, known = run_search(n, verdicts.tolist().__getitem__, want, int(rng.integers(0, n)))
        assert known[found]
        neighbour = found - 1 if want == EARLIEST else found + 1
        assert neighbour in (-1, n) or known[neighbour] is False


def test_the_search_replays_from_its_verdicts():
    """No state besides the verdicts: the same verdicts give the same next step, whatever came before."""
    known = {9: True, 4: False, 7: True}
    assert next_step(10, known, EARLIEST) == next_step(10, dict(reversed(known.items())), EARLIEST) == Probe(5)
    assert next_step(10, {**known, 5: False, 6: True}, EARLIEST) == Found(6)


class Cuts:
    """Configurations by position, as the reduce searches give them (`CutOrder`), noting each position indexed."""

    def __init__(self, n):
        self.n, self.indexed = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, position):
        self.indexed.append(position)
        return frozenset({f"cut {position}"})


def run_cut(cuts, fails, want, hint=None):
    """`next_cut` as the driver runs it: the known end's verdict given as the configuration with nothing off,
    one configuration a round; the Outcome and the positions asked, in order."""
    end = len(cuts) - 1 if want == EARLIEST else 0
    known, asked = {frozenset(): not fails(end)}, []
    while not isinstance(step := next_cut(cuts, known, want, hint, "outputs"), Outcome):
        assert len(step.probes) == 1 and step.probes[0] not in known and step.phase == "outputs"
        position = int(next(iter(step.probes[0])).split()[1])
        assert position != end  # the known end is never probed: its verdict is the precondition's
        asked.append(position)
        known[step.probes[0]] = not fails(position)
    return step, asked


@pytest.mark.parametrize("want", [EARLIEST, LATEST])
def test_the_cut_strategy_ends_at_a_probed_failure_whose_neighbour_passed(want):
    """Made-up verdicts, most not monotone: the Outcome names the configuration of a failing position (the
    known end, or one probed) whose neighbour towards the far end was probed and passed, or is past the end;
    no position asked twice; only the positions asked (and the answer) built."""
    rng = np.random.default_rng(1)
    for _ in range(2000):
        n = int(rng.integers(1, 150))
        verdicts = rng.random(n) < rng.random()
        end = n - 1 if want == EARLIEST else 0
        verdicts[end] = True
        cuts = Cuts(n)
        outcome, asked = run_cut(cuts, verdicts.tolist().__getitem__, want, int(rng.integers(-1, n + 1)))
        assert outcome.status == CUT_FOUND and len(outcome.culprits) == 1
        found = int(outcome.culprits[0].split()[1])
        assert verdicts[found] and (found == end or found in asked)
        neighbour = found - 1 if want == EARLIEST else found + 1
        assert neighbour in (-1, n) or (neighbour in asked and not verdicts[neighbour])
        assert len(asked) == len(set(asked)) and set(cuts.indexed) <= {*asked, found}


@pytest.mark.parametrize("want", [EARLIEST, LATEST])
def test_the_cut_strategy_finds_a_monotone_boundary_in_log_rounds_and_counts_what_is_left(want):
    for _, n, boundary, fails in monotone_cases(2, 500, want):
        outcome, asked = run_cut(Cuts(n), fails, want)
        assert outcome.culprits == (f"cut {boundary}",)
        assert len(asked) <= math.ceil(math.log2(n)) + 1
    step = next_cut(Cuts(36), {frozenset(): False, frozenset({"cut 17"}): True}, EARLIEST, hint=17)
    assert step.suspects == 18  # the answer lies in 0..17: 18 positions


def test_the_cut_strategy_replays_and_refuses_a_passing_end():
    """No state besides the verdicts: the same verdicts, in any order, give the same next round."""
    known = {frozenset(): False, frozenset({"cut 4"}): True, frozenset({"cut 6"}): False}
    assert next_cut(Cuts(10), known, EARLIEST) == next_cut(Cuts(10), dict(reversed(known.items())), EARLIEST)
    assert next_cut(Cuts(10), known, EARLIEST).probes == [frozenset({"cut 5"})]
    assert next_cut(Cuts(10), {**known, frozenset({"cut 5"}): True}, EARLIEST) == Outcome(CUT_FOUND, ("cut 6",))
    assert next_cut(Cuts(10), {frozenset(): False}, EARLIEST, hint=7).probes == [frozenset({"cut 7"})]
    with pytest.raises(ValueError, match="passed"):
        next_cut(Cuts(10), {frozenset(): True}, LATEST)


def test_the_known_end_passing_is_refused():
    with pytest.raises(ValueError, match="passed"):
        next_step(5, {4: False}, EARLIEST)
    with pytest.raises(ValueError, match="nothing to search"):
        next_step(0, {}, LATEST)


def chain_model():
    """x -> Add(one) -> a -> Mul(s) -> b -> Div(two: Constant) -> c -> Relu -> y, and a side branch
    a -> Neg -> z feeding the final Add:

        x ─Add─ a ─Mul─ b ─Div─ c ─Relu─ r ─Add─ y
                 └──────Neg── z ──────────┘
    """
    nodes = [helper.make_node("Add", ["x", "one"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "s"], ["b"], name="mul"),
             helper.make_node("Constant", [], ["two"], name="two_const",
                              value=numpy_helper.from_array(np.array(2.0, np.float32))),
             helper.make_node("Div", ["b", "two"], ["c"], name="div"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Neg", ["a"], ["z"], name="neg"),
             helper.make_node("Add", ["r", "z"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                               numpy_helper.from_array(np.array(3.0, np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def run(model, feeds, outputs=None):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = outputs or [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def test_graph_cuts_boundaries_and_constants():
    graph = Graph(chain_model())
    names = [node.name for node in graph.nodes]
    position = {name: index for index, name in enumerate(names)}
    assert graph.constants == {"two"}
    assert graph.live_after(position["mul"]) == ["a", "b"]  # a is read again by neg
    assert graph.live_after(len(graph) - 1) == ["y"]
    assert [names[p] for p in graph.ancestors(["c"])] == [n for n in names if n in {"add", "mul", "two_const",
                                                                                      "div"}]
    assert [names[p] for p in graph.ancestors(["c"], position["mul"])] == [
        n for n in names[position["mul"]:] if n in {"mul", "two_const", "div"}]
    assert graph.boundary([position["div"], position["relu"]]) == ["b", "two"]


def test_an_extracted_subgraph_computes_what_the_model_computes():
    """div and relu alone, fed b from the whole model's run, with the Constant's value as an initializer
    (a fusion that checks its divisor is a constant still sees one)."""
    model = chain_model()
    graph = Graph(model)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    everything = run(expose(model, ["b", "two", "r"]), {"x": x})
    positions = [i for i, node in enumerate(graph.nodes) if node.name in {"div", "relu"}]
    sub = graph.extract(positions, ["r"], {"b": (np.float32, varying_shape([(2, 3), (4, 3)]))},
                        {"two": everything["two"]}, {"r": (np.float32, [2, 3])})
    onnx.checker.check_model(sub)
    assert [i.name for i in sub.graph.input] == ["b"] and "two" in {i.name for i in sub.graph.initializer}
    assert sub.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "d0"
    np.testing.assert_array_equal(run(sub, {"b": everything["b"]})["r"], everything["r"])


def expose(model, names):
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    return exposed


def test_shapes_that_vary_are_symbolic_and_ranks_that_vary_undeclared():
    assert varying_shape([(1, 8, 4), (1, 9, 4)]) == [1, "d1", 4]
    assert varying_shape([(3,), (3, 1)]) is None


class FakeCutProber:
    """A cut's verdict without ONNX Runtime, shaped as `CutProber.judge`'s: a cut fails when it computes
    `culprit` and outputs what reads it (each such output fails), and passes with the answer."""

    def __init__(self, graph, culprit):
        self.graph, self.culprit, self.judged = graph, culprit, []

    def tainted(self, tensor):
        return self.culprit in self.graph.ancestors([tensor])

    def judge(self, cut):
        self.judged.append(cut)
        shows = self.culprit in cut.positions and any(self.tainted(t) for t in cut.outputs)
        outputs = {t: {"passed": not (shows and self.tainted(t))} for t in cut.outputs}
        sample = {"inputs": "sample0", "passed": not shows, "outputs": outputs,
                  "reasons": [f"{t}: fails" for t, row in outputs.items() if not row["passed"]]}
        if shows:
            sample["answer"] = {"passed": True, "reasons": []}
        return {"passed": not shows, "samples": [sample], "worst": {}}

    def nothing_to_reduce(self, verdict):
        return f"{len(self.graph)} nodes pass: nothing to reduce"


def reduced(graph, prober, store):
    return search(prober, store, divergence=None, local_start=lambda needed: None, threads=1)


@pytest.mark.parametrize("culprit", ["add", "mul", "div", "relu", "neg", "out"])
def test_the_two_sides_under_the_driver_isolate_the_culprit_node_and_rerun_from_disk(culprit, tmp_path):
    graph = Graph(chain_model())
    position = next(node.index for node in graph.nodes if node.name == culprit)
    store = VerdictStore(tmp_path / "reduce_probe", {"model": "chain"})
    prober = FakeCutProber(graph, position)
    found, steps = reduced(graph, prober, store)
    assert [graph.nodes[p].name for p in found.positions] == [culprit]
    assert found.outputs == tuple(graph.nodes[position].outputs)
    assert [step.phase for step in steps] == sorted(step.phase for step in steps)[::-1]  # outputs, then inputs
    assert {step.phase for step in steps} == {"outputs", "inputs"} or culprit == "add"  # add: the start is the end
    assert not any(step.from_disk for step in steps)  # a fresh store: nothing from disk
    assert len({step.key for step in steps}) == len(steps)  # each cut once, though a side's known end be judged
    assert steps[0].nodes == len(graph) and not steps[0].passed  # the whole model first: the precondition
    assert len(prober.judged) == len({step.key for step in steps}) and all(store.path(
        cut.config(graph)).exists() for cut in prober.judged)  # each cut judged once, its verdict on disk
    again = FakeCutProber(graph, position)
    assert reduced(graph, again, store) == (found, [replace(step, from_disk=True) for step in steps])
    assert again.judged == []


def test_progress_lines_say_where_the_cut_may_lie_and_what_each_cut_showed(tmp_path, caplog):
    caplog.set_level("INFO", logger="accubisect")
    graph = Graph(chain_model())
    reduced(graph, FakeCutProber(graph, next(node.index for node in graph.nodes if node.name == "div")),
            VerdictStore(tmp_path, {}))
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].startswith("reduce outputs: 7 node(s) add .. out -> 1 output(s): fails (sample0: y: fails), "
                               "passes with the answer [")  # the whole model, the precondition, and its seconds
    assert lines[1].startswith("reduce outputs round 0: 1 probe(s) running, 0 done · the cut's end lies among 7 of 7 "
                               "node(s) · 0:00 elapsed")
    assert any(line.startswith("reduce inputs round 1: 1 probe(s) running, 1 done · the cut's start lies among ")
               for line in lines)
    assert lines[-1].startswith("reduce inputs: ") and lines[-1].split(": ", 2)[2].startswith(
        "the cut found: 1 node(s) div .. div -> 1 output(s) #")
    assert "culprit" not in " ".join(lines)


def test_failing_outputs_that_pass_alone_are_searched_with_every_output_of_the_cut(tmp_path, caplog):
    """A cut that shows the bug only while it also outputs `a` or the model's output (as an output can keep a
    fusion from forming): the inputs side's start with the failing output alone passes, so it searches with all
    the cut's outputs."""
    caplog.set_level("INFO", logger="accubisect")
    graph = Graph(chain_model())

    class NeedsA(FakeCutProber):
        def judge(self, cut):
            judged = super().judge(cut)
            return judged if {"a", "y"} & set(cut.outputs) else {**judged, "passed": True}

    mul = next(node.index for node in graph.nodes if node.name == "mul")
    found, steps = search(NeedsA(graph, mul), VerdictStore(tmp_path, {}), mul, lambda needed: None, threads=1)
    assert found == Cut((mul,), ("a", "b"))  # the divergence (mul) probed first: the outputs side ends there
    first_start = next(step for step in steps if step.phase == "inputs")
    assert (first_start.outputs, first_start.passed) == (("b",), True)
    assert len({step.key for step in steps}) == len(steps) and not any(step.from_disk for step in steps)
    assert ("reduce inputs: the failing output(s) b pass when output alone; searching with all 2 output(s) of the "
            "cut found") in caplog.messages


def test_nothing_failing_is_nothing_to_reduce(tmp_path):
    graph = Graph(chain_model())

    class Passing(FakeCutProber):
        def judge(self, cut):
            return {"passed": True, "samples": [], "worst": {}}

    with pytest.raises(PreconditionError, match="7 nodes pass: nothing to reduce"):
        reduced(graph, Passing(graph, 0), VerdictStore(tmp_path, {}))


def test_nothing_to_reduce_says_whether_the_candidate_passes_or_the_answer_does_not_fix_it():
    passing = [{"inputs": "sample0", "passed": True, "reasons": []}]
    assert nothing_to_reduce(passing).startswith("the candidate passes against the reference")
    unfixed = [{"inputs": "sample0", "passed": False, "reasons": ["y: 3% of elements outside rtol"],
                "answer": {"passed": False, "reasons": ["y: 2% of elements outside rtol"]}}]
    assert nothing_to_reduce(unfixed) == (
        "the model's outputs still fail with the answer applied (sample0: y: 2% of elements outside rtol): the answer "
        "does not fix the candidate, so no subgraph shows the bug it fixes; nothing to reduce")


def test_a_cut_is_named_by_its_nodes_and_outputs():
    graph = Graph(chain_model())
    one, other = Cut((0, 1), ("b",)), Cut((0, 1), ("a", "b"))
    assert one.config(graph) != other.config(graph) and len(one.config(graph)) == 1


@pytest.fixture(scope="module")
def repro_namespace(tmp_path_factory):
    """The repro.py the job writes, imported as a module."""
    path = tmp_path_factory.mktemp("repro") / "repro.py"
    path.write_text(REPRO)
    spec = importlib.util.spec_from_file_location("repro", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


@pytest.mark.parametrize("cosine", [None, 0.999])
def test_the_repro_judges_as_the_library_does(repro_namespace, cosine):
    rng = np.random.default_rng(0)
    check = AccuracyCheck(1e-3, 1e-4, 0.01, cosine)
    specials = [np.nan, np.inf, -np.inf, 0.0, 65504.0]
    for _ in range(500):
        reference = rng.standard_normal(50).astype(np.float32)
        candidate = reference + rng.standard_normal(50).astype(np.float32) * 10.0 ** rng.integers(-7, 0)
        for array in (reference, candidate):
            if rng.random() < 0.3:
                array[rng.integers(0, 50, 3)] = rng.choice(specials, 3)
        library = check.compare_arrays(reference, candidate)["passed"]
        repro = not repro_namespace["failures"](reference, candidate, check.to_config())
        assert repro == library


def test_the_repro_refuses_a_switch_file_it_cannot_read_with_status_2(repro_namespace, tmp_path):
    bad = tmp_path / "switch.cfg"
    bad.write_text("{not json")
    with pytest.raises(SystemExit) as stopped:
        repro_namespace["rules_off"](bad, {})
    assert stopped.value.code == 2
