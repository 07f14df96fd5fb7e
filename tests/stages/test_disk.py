from types import SimpleNamespace

import numpy as np
import onnx
from conftest import save_model
from onnx import TensorProto, helper

from accubisect.core.tensor_sizes import tensor_bytes
from accubisect.formats.graph_only import graph_only
from accubisect.formats.model import model_bytes
from accubisect.stages.disk import dump_bytes, estimate_line


def conv_model(path):
    """x[N,3,H,W] ─ Conv(w: 8x3x3x3, pads 1) ─ c ─ Relu ─ y: 8 channels at the input's height and width."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], np.zeros(216, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, "H", "W"])], [w], path)


def test_tensor_bytes_follow_the_samples_concrete_shapes(tmp_path):
    model = onnx.load(conv_model(tmp_path / "m.onnx"))
    sizes = tensor_bytes(model, {"x": (2, 3, 64, 32)})
    assert sizes == {"x": 4 * 2 * 3 * 64 * 32, "c": 4 * 2 * 8 * 64 * 32, "y": 4 * 2 * 8 * 64 * 32}
    assert dump_bytes(model, {"x": (2, 3, 64, 32)}) == 2 * sizes["c"]  # c, and y (an output) once
    assert dump_bytes(model, {"x": (2, 3, 64, 32)}, {"mode": "all"}) == 2 * sizes["c"] + sizes["x"]
    assert dump_bytes(model, {"x": (2, 3, 64, 32)}, {"statistics_only": True}) == 0


def test_a_tensor_inference_cannot_size_is_left_out(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Custom", ["a"], ["y"], domain="my.ops")]
    graph = helper.make_graph(nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.ops", 1)])
    assert tensor_bytes(model, {"x": (4,)}) == {"x": 16, "a": 16}


def plan_dumps(tmp_path, shapes):
    jobs = {}
    for index, shape in enumerate(shapes):
        np.savez(tmp_path / f"sample{index}_inputs.npz", x=np.zeros(shape, np.float32))
        sample = SimpleNamespace(inputs=tmp_path / f"sample{index}_inputs.npz")
        for variant in ("fusion_off", "fusion_on"):
            jobs[f"{variant}{index}"] = SimpleNamespace(model=tmp_path / variant / "model.onnx", sample=sample)
    return jobs


def test_one_line_names_the_workspace_and_what_shrinks_it(tmp_path):
    model = conv_model(tmp_path / "m.onnx")
    dumps = plan_dumps(tmp_path, [(1, 3, 640, 640), (1, 3, 640, 640)])
    per_dump = 2 * 4 * 8 * 640 * 640
    line = estimate_line(tmp_path / "workspace", model, dumps, {}, limit=3 * per_dump)
    assert line == (f"accubisect: the 4 dump(s) and 2 model copies still to write need about "
                     f"{4 * per_dump / 1e9:.1f} GB in {(tmp_path / 'workspace').resolve()}; dump.statistics_only: "
                     "true (statistics and 4096 values per tensor), fewer samples (dump.samples) or a "
                     "dump.op_type_filter shrink it")
    copies = 2 * model.stat().st_size  # fusion_off's and fusion_on's, not written yet
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=4 * per_dump + copies) is None
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=4 * per_dump + copies - 1) is not None
    assert estimate_line(tmp_path / "workspace", model, dumps, {"statistics_only": True}, limit=copies) is None


def test_written_dumps_count_nothing_and_size_their_siblings(tmp_path):
    model = conv_model(tmp_path / "m.onnx")
    dumps = plan_dumps(tmp_path, [(1, 3, 8, 8), (1, 3, 8, 8)])
    for job in dumps.values():  # the copies are written: only dumps count
        job.model.parent.mkdir(exist_ok=True)
        job.model.write_bytes(model.read_bytes())
    written = tmp_path / "workspace" / "dump" / "fusion_on0" / "dump.h5"
    written.parent.mkdir(parents=True)
    written.write_bytes(b"x" * 10**6)  # the same compiled model and shapes as fusion_on1
    line = estimate_line(tmp_path / "workspace", model, dumps, {}, limit=0)
    assert "the 3 dump(s) and 0 model copies still to write need about 0.0 GB" in line
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=10**6 + 2 * 4096) is None
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=10**6 + 2 * 4096 - 1) is not None
    for key in dumps:
        path = tmp_path / "workspace" / "dump" / key / "dump.h5"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=0) is None


def test_model_copies_count_the_graph_and_its_external_data(tmp_path):
    """A model with 4 MB of weights in a data file: each compiled copy the dumps run is written with its own
    data file, so each copy not yet written counts graph plus data, whatever the dumps weigh."""
    weights = np.ones(10**6, np.float32)
    model = conv_model(tmp_path / "m.onnx")
    loaded = onnx.load(model)
    loaded.graph.initializer.append(onnx.numpy_helper.from_array(weights, "unused"))
    onnx.save(loaded, model, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    on_disk = model.stat().st_size + (tmp_path / "m.onnx.data").stat().st_size
    assert on_disk > weights.nbytes
    dumps = plan_dumps(tmp_path, [(1, 3, 8, 8)])
    for key in dumps:  # every dump written: what is left to write is the copies
        (tmp_path / "workspace" / "dump" / key).mkdir(parents=True)
        (tmp_path / "workspace" / "dump" / key / "dump.h5").write_bytes(b"")
    line = estimate_line(tmp_path / "workspace", model, dumps, {}, limit=2 * on_disk - 1)
    assert line.startswith("accubisect: the 0 dump(s) and 2 model copies still to write need about 0.0 GB in ")
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=2 * on_disk) is None
    reduced = tmp_path / "workspace" / "precision" / "0123456789abcdef" / "model.onnx"
    dumps["reduced0"] = SimpleNamespace(model=reduced, sample=dumps["fusion_on0"].sample)
    (tmp_path / "workspace" / "dump" / "reduced0").mkdir()
    (tmp_path / "workspace" / "dump" / "reduced0" / "dump.h5").write_bytes(b"")
    limit = 2 * on_disk + model.stat().st_size  # the reduced model links its compiled copy's data: its graph only
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=limit) is None
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=limit - 1).startswith(
        "accubisect: the 0 dump(s) and 3 model copies")
    del dumps["reduced0"]
    (tmp_path / "fusion_on").mkdir()
    (tmp_path / "fusion_on" / "model.onnx").write_bytes(b"")
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=on_disk) is None
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=on_disk - 1) is not None


def test_a_model_saved_whole_counts_its_file_once(tmp_path):
    """Its graph is read without its 400 KB weight (`graph_only`: a reference into the model file itself),
    and each copy counts the model file once (and the reference, a few dozen bytes), not once more for it."""
    model = conv_model(tmp_path / "m.onnx")
    loaded = onnx.load(model)
    loaded.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(10**5, np.float32), "unused"))
    onnx.save(loaded, model)
    dumps = plan_dumps(tmp_path, [(1, 3, 8, 8)])
    for key in dumps:  # every dump written: what is left to write is the copies
        (tmp_path / "workspace" / "dump" / key).mkdir(parents=True)
        (tmp_path / "workspace" / "dump" / key / "dump.h5").write_bytes(b"")
    size = model_bytes(graph_only(model))
    assert model_bytes(onnx.load(model)) == model.stat().st_size > 4 * 10**5  # read whole: the file exactly
    assert 0 < size - model.stat().st_size < 100  # the weight's reference, not its bytes again
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=2 * size) is None
    assert estimate_line(tmp_path / "workspace", model, dumps, {}, limit=2 * size - 1).startswith(
        "accubisect: the 0 dump(s) and 2 model copies")


def test_no_data_propagation_holds_a_long_vectors_values(tmp_path, monkeypatch):
    """Data propagation keeps every vector's values (17 GB for a 50M-element input): it runs only without one."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    io = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])], [helper.make_tensor_value_info("y", 1, None)]
    model = onnx.load(save_model(nodes, *io, [], tmp_path / "m.onnx"))
    calls = []
    infer = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda m, data_prop=False: calls.append(data_prop) or infer(m, data_prop=data_prop))
    assert tensor_bytes(model, {"x": (8,)})["y"] == 32 and calls == [False, True]  # Reshape needs the shape's values
    calls.clear()
    assert "y" not in tensor_bytes(model, {"x": (1 << 17,)}) and calls == [False]
