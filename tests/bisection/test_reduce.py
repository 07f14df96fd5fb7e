"""`snakemake reduce`'s pure parts: the bisection over node order (fake verdicts, many random cases), the
two-sided search over a real graph with a fake verdict, subgraph extraction run by ONNX Runtime, and the
repro's own judging against the library's."""

import functools
import importlib.util
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accubisect.bisection.reduce import search, shrink
from accubisect.bisection.reduce_probe import Cut, nothing_to_reduce
from accubisect.bisection.repro_script import REPRO
from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.shrink import EARLIEST, LATEST, Found, Probe, next_step
from accubisect.core.subgraph import Graph, varying_shape


def run_search(n, fails, want, hint=None):
    known = {}
    while not isinstance(step := next_step(n, known, want, hint), Found):
        assert step.position not in known  # never probes a position twice
        known[step.position] = fails(step.position)
    return step.position, known


def crossed(position, boundary, want):
    """A monotone verdict: failing from `boundary` on (EARLIEST), or up to it (LATEST)."""
    return position >= boundary if want == EARLIEST else position <= boundary


@pytest.mark.parametrize("want", [EARLIEST, LATEST])
def test_monotone_verdicts_find_the_boundary_in_log_steps(want):
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(1, 300))
        boundary = int(rng.integers(0, n))
        hint = None if rng.random() < 0.3 else int(rng.integers(-2, n + 2))
        found, known = run_search(n, functools.partial(crossed, boundary=boundary, want=want), want, hint)
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
    """A verdict without ONNX Runtime: a cut fails when it computes `culprit` and outputs what reads it."""

    def __init__(self, graph, culprit):
        self.graph, self.culprit, self.steps = graph, culprit, []

    def failed(self, cut, phase):
        tainted = {self.culprit} | {p for p in range(len(self.graph))
                                    if self.culprit in self.graph.ancestors(self.graph.nodes[p].outputs)}
        verdict = self.culprit in cut.positions and any(
            self.graph.producer[t] in tainted for t in cut.outputs)
        self.steps.append((phase, cut, verdict))
        return verdict

    def failing_outputs(self, cut):
        return tuple(t for t in cut.outputs if self.culprit in self.graph.ancestors([t]))

    def nothing_to_reduce(self, whole):
        return f"{len(whole.positions)} nodes pass: nothing to reduce"


@pytest.mark.parametrize("culprit", ["add", "mul", "div", "relu", "neg", "out"])
def test_the_two_sided_search_isolates_the_culprit_node(culprit):
    graph = Graph(chain_model())
    position = next(node.index for node in graph.nodes if node.name == culprit)
    prober = FakeCutProber(graph, position)
    found = search(graph, prober, divergence=None, local_start=lambda needed: None)
    assert [graph.nodes[p].name for p in found.positions] == [culprit]
    assert found.outputs == tuple(graph.nodes[position].outputs)
    assert {phase for phase, _, _ in prober.steps} == {"outputs", "inputs"}


def test_nothing_failing_is_nothing_to_reduce():
    graph = Graph(chain_model())

    class Passing(FakeCutProber):
        def failed(self, cut, phase):
            return False

    with pytest.raises(Exception, match="nothing to reduce"):
        search(graph, Passing(graph, 0), None, lambda needed: None)


def test_nothing_to_reduce_says_whether_the_candidate_passes_or_the_answer_does_not_fix_it():
    passing = [{"inputs": "sample0", "passed": True, "reasons": []}]
    assert nothing_to_reduce(passing).startswith("the candidate passes against the reference")
    unfixed = [{"inputs": "sample0", "passed": False, "reasons": ["y: 3% of elements outside rtol"],
                "answer": {"passed": False, "reasons": ["y: 2% of elements outside rtol"]}}]
    assert nothing_to_reduce(unfixed) == (
        "the model's outputs still fail with the answer applied (sample0: y: 2% of elements outside rtol): the answer "
        "does not fix the candidate, so no subgraph shows the bug it fixes; nothing to reduce")


def test_shrink_starts_from_the_known_end():
    asked = []
    assert shrink(8, EARLIEST, None, lambda p: asked.append(p) or p >= 3) == 3
    assert 7 not in asked


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
