"""Which rewrite rules fired, found at a cost that does not grow with the catalogue: the rules the compiled
graph names are proven by one compile each, the others switched off together once, and halved only when
that changes the graph. The rules found are exactly those whose own switch changes the graph (checked here
against compiling with each rule of the catalogue off), and the compiles are sessions built only to save
their graph, which save what a full session saves."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EXAMPLE_MODEL, save_model
from onnx import TensorProto, helper, numpy_helper

from accubisect.core.onnx_graph import signature_counts
from accubisect.formats.compile_record import Variant
from accubisect.formats.graph_only import graph_only
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.stages.compile_stage import DISCARDED, Compiler, rewrites_weights

CHANNELS = 16
LEVEL1 = "Level1_RuleBasedTransformer"


def conv_model(path: Path, tail: bool) -> Path:
    """x ─ Conv ─ BatchNormalization ─ Relu ─ Conv ─ y, with `tail`: ─ Mul(scale) ─ Add(shift) ─ y. ORT names
    what ConvBNFusion and ConvAddFusion make after them; ConvMulFusion's Conv leaves no such name."""
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    weights = [const("w0", rng.normal(0, 0.1, (CHANNELS, CHANNELS, 3, 3))),
               const("w1", rng.normal(0, 0.1, (CHANNELS, CHANNELS, 3, 3))),
               const("gamma", rng.uniform(0.5, 1.5, CHANNELS)), const("beta", rng.normal(0, 1, CHANNELS)),
               const("mean", rng.normal(0, 1, CHANNELS)), const("var", rng.uniform(0.5, 2, CHANNELS)),
               const("scale", rng.uniform(0.5, 1.5, (CHANNELS, 1, 1))),
               const("shift", rng.normal(0, 1, (CHANNELS, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("BatchNormalization", ["c0", "gamma", "beta", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w1"], ["c1" if tail else "y"], pads=[1, 1, 1, 1], name="conv1")]
    if tail:
        nodes += [helper.make_node("Mul", ["c1", "scale"], ["m"], name="scale"),
                  helper.make_node("Add", ["m", "shift"], ["y"], name="shift")]
    shape = [1, CHANNELS, 8, 8]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                      [w for w in weights if tail or w.name not in ("scale", "shift")], path)


def counted_compiles(monkeypatch) -> list[object]:
    """The models handed to `ort_compile.compile_model` from now on, one per session ORT builds."""
    handed: list[object] = []
    compile_model = ort_compile.compile_model
    monkeypatch.setattr(ort_compile, "compile_model", lambda source, *rest, **named: handed.append(source)
                        or compile_model(source, *rest, **named))
    return handed


def graph_without(model: Path, compiler: Compiler, rule: str, folder: Path) -> onnx.GraphProto:
    """The graph of the whole model compiled with `rule` off as well, the plain way (no probe)."""
    saved = folder / f"without_{rule}.onnx"
    options = compile_options(compiler.variant, compiler.catalogue, frozenset([rule]))
    ort_compile.compile_model(model, options, CPU, saved)
    return onnx.load(saved).graph


@pytest.mark.parametrize("tail", [False, True])
def test_the_rules_found_are_those_whose_own_switch_changes_the_graph(tmp_path, tail):
    model = conv_model(tmp_path / "m.onnx", tail)
    compiler = Compiler(model, Variant("fusion_on", "all"), installed_catalogue(), CPU)
    without: dict = {}
    fired = compiler.compile(tmp_path / "compiled.onnx", without)
    reference = signature_counts(onnx.load(tmp_path / "compiled.onnx").graph)
    by_rule = {rule: signature_counts(graph_without(model, compiler, rule, tmp_path))
               for rule in compiler.catalogue.rewrite_rules[LEVEL1]}
    changing = [rule for rule, counts in by_rule.items() if counts != reference]
    assert changing == ["ConvAddFusion", "ConvMulFusion", "ConvBNFusion"] if tail else ["ConvBNFusion"]
    assert [rule for rule in fired if rule in by_rule] == changing
    assert all(without[rule] == by_rule[rule] for rule in changing)


def test_rules_the_graph_names_cost_one_compile_each_and_the_rest_one_together(tmp_path, monkeypatch):
    model = conv_model(tmp_path / "m.onnx", tail=False)
    compiler = Compiler(model, Variant("fusion_on", "all"), installed_catalogue(), CPU)
    handed = counted_compiles(monkeypatch)
    fired = compiler.compile(tmp_path / "compiled.onnx")
    assert "ConvBNFusion" in fired and len(compiler.catalogue.rewrite_rules[LEVEL1]) == 20
    assert len(handed) == 3  # the compile, ConvBNFusion off, the other 19 rules off


def test_an_unnamed_rule_is_found_by_halving_the_rest(tmp_path, monkeypatch):
    model = conv_model(tmp_path / "m.onnx", tail=True)
    compiler = Compiler(model, Variant("fusion_on", "all"), installed_catalogue(), CPU)
    handed = counted_compiles(monkeypatch)
    fired = compiler.compile(tmp_path / "compiled.onnx")
    assert {"ConvAddFusion", "ConvMulFusion", "ConvBNFusion"} <= set(fired)
    # 2 named rules, then 18 rules halved down to ConvMulFusion: far fewer than one compile per rule
    assert 1 + 2 + 1 < len(handed) < 1 + 20


@pytest.mark.parametrize("name", ["conv", "example"])
def test_a_session_built_only_to_save_its_graph_saves_what_a_full_session_saves(tmp_path, name):
    model = conv_model(tmp_path / "m.onnx", tail=True) if name == "conv" else EXAMPLE_MODEL
    ort_compile.compile_model(model, ort_compile.CompileOptions("all"), CPU, tmp_path / "built.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "full.onnx")
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    assert onnx.load(tmp_path / "built.onnx") == onnx.load(tmp_path / "full.onnx")


def test_probes_that_discard_their_saved_weights_see_the_same_graphs(tmp_path):
    """Where the compiled graph's weights are mostly new (ConvBNFusion and the NCHWc reorder rewrite every Conv
    weight), each rule probe sends the weights it saves to the null device instead of serializing them (1.7 s of
    a 2.3 s probe on a 170 MB CNN) and sees the graph it saw before; a model whose weights the rules keep (the
    example's MatMuls) keeps its probes' references, which cost nothing to save."""
    model = conv_model(tmp_path / "m.onnx", tail=True)
    compiler = Compiler(model, Variant("fusion_on", "all"), installed_catalogue(), CPU)
    compiler.compile(tmp_path / "compiled.onnx")
    assert rewrites_weights(compiler.graph, graph_only(tmp_path / "compiled.onnx"))
    for rules in (["ConvBNFusion"], ["ConvMulFusion", "ConvAddFusion"], []):
        discarded, saved = compiler.without(rules, discard_weights=True), compiler.without(rules)
        assert signature_counts(discarded.graph) == signature_counts(saved.graph)
        assert [node.name for node in discarded.graph.node] == [node.name for node in saved.graph.node]
        assert locations(discarded) == {DISCARDED} and DISCARDED not in locations(saved)  # the weights it wrote
    example = Compiler(EXAMPLE_MODEL, Variant("fusion_on", "all"), installed_catalogue(), CPU)
    example.compile(tmp_path / "example.onnx")
    assert not rewrites_weights(example.graph, graph_only(tmp_path / "example.onnx"))


def locations(model: onnx.ModelProto) -> set[str]:
    """The data files `model`'s external weights name."""
    return {entry.value for tensor in model.graph.initializer for entry in tensor.external_data
            if entry.key == "location"}
