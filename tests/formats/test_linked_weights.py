"""The weights folder a hybrid reads from (formats/linked_weights.py): tensors of yours copied in, each at a
page boundary, read back as themselves, on real files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from conftest import without_lengths
from onnx import helper, numpy_helper

from accubisect.formats.linked_weights import ALIGNMENT, WeightsFolder, save_gathered
from accubisect.formats.model import tensor_values


def saved_with_data(folder: Path, arrays: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A graph of `arrays` saved with every tensor in `m.data`, read back without its weights."""
    tensors = [numpy_helper.from_array(array, name) for name, array in arrays.items()]
    model = helper.make_model(helper.make_graph([], "weights", [], [], tensors))
    onnx.save(model, folder / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    return onnx.load(folder / "m.onnx", load_external_data=False)


def test_tensors_copied_in_read_back_as_themselves_each_on_its_own_page(tmp_path):
    """BatchNorm-sized vectors (2 KiB, half a page) copied in two calls: each reference names its own bytes."""
    arrays = {f"v{i}": np.full(512, i, np.float32) for i in range(3)} | {"w": np.arange(3000, dtype=np.float32)}
    graph = saved_with_data(tmp_path, arrays)
    folder = WeightsFolder(tmp_path / "weights")
    folder.copy_in(graph.graph.initializer[:2], tmp_path / "m.onnx", "original.data")
    folder.copy_in(graph.graph.initializer[2:], tmp_path / "m.onnx", "original.data")
    offsets = [int(next(e.value for e in t.external_data if e.key == "offset")) for t in graph.graph.initializer]
    assert all(offset % ALIGNMENT == 0 for offset in offsets) and len(set(offsets)) == len(offsets)
    for tensor in graph.graph.initializer:
        np.testing.assert_array_equal(tensor_values(tensor, tmp_path / "weights"), arrays[tensor.name])


def test_references_without_their_length_copy_each_tensor_s_bytes_alone(tmp_path):
    """A data file's references may leave out their length (ORT reads what the shape holds): each tensor copied
    in, then gathered into an answer, is its own bytes, not the rest of the data file from its offset."""
    arrays = {f"w{i}": np.full((50, 50), i, np.float32) for i in range(4)}  # 10000 bytes: 3 pages, less 2288
    graph = saved_with_data(tmp_path, arrays)
    without_lengths(graph)
    folder = WeightsFolder(tmp_path / "weights")
    folder.copy_in(graph.graph.initializer, tmp_path / "m.onnx", "original.data")
    (tmp_path / "answer").mkdir()
    save_gathered(graph, tmp_path / "answer" / "a.onnx", folder.folder, "a.data")
    assert (tmp_path / "answer" / "a.data").stat().st_size == (tmp_path / "weights" / "original.data").stat().st_size
    assert (tmp_path / "weights" / "original.data").stat().st_size == 3 * 3 * ALIGNMENT + 10000
    answer = onnx.load(tmp_path / "answer" / "a.onnx", load_external_data=False)
    for tensor in answer.graph.initializer:
        np.testing.assert_array_equal(tensor_values(tensor, tmp_path / "answer"), arrays[tensor.name])
