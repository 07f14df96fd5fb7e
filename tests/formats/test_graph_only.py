"""A model's graph without its weights, for a model saved whole too, and the rule probes that run on it: each
probe hands ORT the graph alone (kilobytes) with the weights read from where they are, and finds the same
rules and the same graphs as compiling the whole model."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import save_model, without_lengths
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from accubisect.core.errors import ModelError
from accubisect.core.onnx_graph import name_nodes_uniquely, signature_counts
from accubisect.formats.compile_record import Variant
from accubisect.formats.graph_only import graph_only
from accubisect.formats.model import external_data_files, model_bytes
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.stages.compile_stage import Compiler

CHANNELS = 64  # 64 x 64 x 3 x 3 float weights per Conv: 147 KiB each, far above THRESHOLD


def conv_bn_model(path: Path, external: bool = False) -> Path:
    """x ─ Conv ─ BatchNormalization ─ Identity ─ Relu ─ Conv ─ y: ConvBNFusion and EliminateIdentity fire.
    Saved whole, or with its weights in `<name>.data` beside it."""
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    weights = [const("w0", rng.normal(0, 0.1, (CHANNELS, CHANNELS, 3, 3))),
               const("w1", rng.normal(0, 0.1, (CHANNELS, CHANNELS, 3, 3))),
               const("gamma", rng.uniform(0.5, 1.5, CHANNELS)), const("beta", rng.normal(0, 1, CHANNELS)),
               const("mean", rng.normal(0, 1, CHANNELS)), const("var", rng.uniform(0.5, 2, CHANNELS))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("BatchNormalization", ["c0", "gamma", "beta", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Identity", ["n"], ["i"], name="same"),
             helper.make_node("Relu", ["i"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w1"], ["y"], pads=[1, 1, 1, 1], name="conv1")]
    shape = [1, CHANNELS, 8, 8]
    save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], weights, path)
    if external:
        onnx.save(onnx.load(path), path, save_as_external_data=True, location=f"{path.name}.data")
    return path


def test_a_model_saved_whole_gives_a_graph_whose_weights_point_into_the_file(tmp_path):
    model = conv_bn_model(tmp_path / "whole.onnx")
    graph = graph_only(model)
    assert graph.ByteSize() < model.stat().st_size / 50
    external = {t.name for t in graph.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert external == {"w0", "w1"}  # the BatchNorm's 256-byte vectors stay inline
    assert {entry.value for t in graph.graph.initializer for entry in t.external_data
            if entry.key == "location"} == {"whole.onnx"}
    external_data_helper.load_external_data_for_model(graph, str(tmp_path))
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(model).graph.initializer}
    read_back = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    assert original.keys() == read_back.keys()
    assert all(np.array_equal(original[name], read_back[name]) for name in original)


def test_a_model_with_external_data_gives_its_graph_as_onnx_reads_it(tmp_path):
    model = conv_bn_model(tmp_path / "split.onnx", external=True)
    assert graph_only(model) == onnx.load(model, load_external_data=False)


@pytest.mark.parametrize("external", [False, True])
def test_model_bytes_weighs_the_files_the_model_was_read_from_however_it_was_read(tmp_path, external):
    """Read as saved: the graph file and its data file exactly; read whole or as its graph alone, within the
    references to its two weights (a few dozen bytes each) that the data file's or `graph_only`'s graph holds."""
    model = conv_bn_model(tmp_path / "m.onnx", external)
    on_disk = sum(path.stat().st_size for path in tmp_path.iterdir())
    assert model_bytes(onnx.load(model, load_external_data=False)) == on_disk
    assert abs(model_bytes(onnx.load(model)) - on_disk) < 200
    assert abs(model_bytes(graph_only(model)) - on_disk) < 200
    assert on_disk > 2 * CHANNELS * CHANNELS * 9 * 4  # the weights count, read or not


def test_model_bytes_weighs_a_reference_without_its_length_by_its_shape(tmp_path):
    """A data file's references may leave out their length (ORT reads what the shape holds): such a model
    weighs its data file still, and a data file cut short is refused, not weighed as a graph of kilobytes."""
    model = conv_bn_model(tmp_path / "m.onnx", external=True)
    graph = onnx.load(model, load_external_data=False)
    without_lengths(graph)
    onnx.save(graph, model)
    data = tmp_path / "m.onnx.data"
    assert model_bytes(graph_only(model)) == model.stat().st_size + data.stat().st_size
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.raises(ModelError, match="m.onnx.data ends at byte .* it is cut short"):
        external_data_files(graph, model)


def test_ort_runs_the_graph_alone_reading_the_weights_from_the_file(tmp_path):
    model = conv_bn_model(tmp_path / "whole.onnx")
    x = {"x": np.random.default_rng(1).normal(size=(1, CHANNELS, 8, 8)).astype(np.float32)}
    whole = ort_compile.Runner(model, ort_compile.CompileOptions("off"), CPU).activate().infer(x)
    alone = ort_compile.Runner(graph_only(model).SerializeToString(),
                               ort_compile.CompileOptions("off", {ort_compile.WEIGHTS_FOLDER: str(tmp_path)}), CPU)
    assert np.array_equal(alone.activate().infer(x)["y"], whole["y"])


@pytest.mark.parametrize("external", [False, True])
def test_rule_probes_hand_ort_the_graph_alone_and_find_what_the_whole_model_gives(tmp_path, monkeypatch, external):
    model = conv_bn_model(tmp_path / "m.onnx", external)
    compiler = Compiler(model, Variant("fusion_on", "all"), installed_catalogue(), CPU)
    handed: list[Path | bytes] = []
    compile_model = ort_compile.compile_model
    monkeypatch.setattr(ort_compile, "compile_model", lambda source, *rest, **named: handed.append(source)
                        or compile_model(source, *rest, **named))
    without: dict = {}
    fired = compiler.compile(tmp_path / "compiled.onnx", without)
    assert {"EliminateIdentity", "ConvBNFusion"} <= set(fired) and {"EliminateIdentity", "ConvBNFusion"} <= set(without)
    assert handed[0] == model and len(handed) > 3  # the compile itself, then the probes
    graph_bytes = 2 * CHANNELS * CHANNELS * 9 * 4
    assert all(isinstance(source, bytes) and len(source) < graph_bytes / 20 for source in handed[1:])
    for rule in ("EliminateIdentity", "ConvBNFusion"):  # the probes' graphs are the whole model's
        saved = tmp_path / f"without_{rule}.onnx"
        compile_model(model, compile_options(compiler.variant, compiler.catalogue, frozenset([rule])), CPU, saved,
                      own_weights=external)
        assert without[rule] == signature_counts(onnx.load(saved, load_external_data=False).graph)


def test_the_threshold_keeps_small_tensors_inline(tmp_path):
    model = conv_bn_model(tmp_path / "whole.onnx")
    everything = graph_only(model, threshold=CHANNELS * CHANNELS * 9 * 4 + 1)
    assert not any(t.data_location == TensorProto.EXTERNAL for t in everything.graph.initializer)
    assert everything == onnx.load(model)


def test_a_model_whose_nodes_share_a_name_is_handed_over_as_its_graph_alone(tmp_path):
    """ORT refuses two nodes with one name: such a model saved whole goes to ORT renamed, as kilobytes of
    graph whose weights ORT reads from the model file, and runs as the renamed whole model does."""
    model = conv_bn_model(tmp_path / "whole.onnx")
    loaded = onnx.load(model)
    loaded.graph.node[3].name = "conv0"  # the Relu named as the first Conv
    onnx.save(loaded, model)
    source = ort_compile.loadable(model)
    assert isinstance(source, bytes) and len(source) < model.stat().st_size / 50
    name_nodes_uniquely(loaded.graph)
    x = {"x": np.random.default_rng(2).normal(size=(1, CHANNELS, 8, 8)).astype(np.float32)}
    renamed = ort_compile.Runner(loaded.SerializeToString(), ort_compile.CompileOptions("off"), CPU)
    from_file = ort_compile.Runner(model, ort_compile.CompileOptions("off"), CPU)
    assert np.array_equal(from_file.activate().infer(x)["y"], renamed.activate().infer(x)["y"])
