"""Graphs that read their weights where they lie: hard-linked for ORT, gathered into one file for an answer.

A hybrid (core/hybrid.py) is the compiled graph with some of the original model's nodes copied back in, so its
weights lie in two models' files: the compiled copy's data file (or the compiled model itself, saved whole) and
the user's data file (or model file). Both graphs are read without their weights (`formats.graph_only`): their
large tensors are references relative to their own folders. ORT reads the references of a graph handed over as
bytes from one folder, and refuses absolute locations, `..` and symbolic links that leave it; so a
`WeightsFolder` moves each model's references under a subfolder of its own and hard-links the workspace's
files there (copied once where the filesystem cannot link): no weight is copied or read in Python, however
many probes run. The user's files get no second link (onnx's loader refuses a data file with two, "a
potential hardlink attack", which would break every other reader while the job runs, and for good after a
killed job): the few tensors of theirs a hybrid copies in are copied once into a file of the folder's own.
An answer is written with one data file of its own beside it (`save_gathered`), copied tensor by tensor from
the files it references, a block at a time, so it loads from any working directory and outlives the
workspace.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import onnx

from accubisect.formats.files import link_or_copy
from accubisect.formats.model import external_bytes, external_data_files, stored_tensors

BLOCK = 16 << 20  # bytes copied at a time
# How a WeightsFolder places the tensors it copies in, part of the instance probes' verdict key: layout 1 appended
# them, misplacing every tensor after one whose length is not a page's, so its hybrids were judged on wrong weights.
WEIGHTS_FOLDER_LAYOUT = 2
ALIGNMENT = 4096  # each gathered tensor starts on a page, where ORT can map it


class WeightsFolder:
    """A folder (the caller's, e.g. a temporary one beside the job's outputs) from which ORT reads the
    weights of graphs combined from several models."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def add(self, model: onnx.ModelProto, source: Path, name: str) -> None:
        """Moves the references of `model`, read without its weights from the file `source`, under the
        subfolder `name`, and hard-links the files they name there."""
        for data in external_data_files(model, source):
            link_or_copy(data, self.folder / name / data.relative_to(source.parent))
        relocate(model, name)

    def copy_in(self, tensors: Iterable[onnx.TensorProto], source: Path, name: str) -> None:
        """Copies the bytes of `tensors`, external tensors of the model read without its weights from the file
        `source`, into the folder's data file `name` (appended, a block at a time), and points them there. Not
        opened to append ("ab"): such a file writes at its end whatever the seek, so a tensor after one whose
        length is not a page's was written before the page its reference names (a CNN's 2 KiB BatchNorm
        vectors: each hybrid read its neighbour's bytes)."""
        path = self.folder / name
        with open(path, "r+b" if path.exists() else "wb") as target:
            for tensor in tensors:
                if tensor.data_location == onnx.TensorProto.EXTERNAL:
                    _append(tensor, source.parent, target, name)


def relocate(model: onnx.ModelProto, folder: str) -> None:
    """Moves every reference of `model` into the subfolder `folder` of the one they are relative to."""
    for tensor in external(model):
        location = next(entry for entry in tensor.external_data if entry.key == "location")
        location.value = f"{folder}/{location.value}"


def save_gathered(model: onnx.ModelProto, path: Path, weights: Path, data: str) -> None:
    """Writes `model`, its references relative to the folder `weights`, at `path` with every tensor they
    reference copied into its own data file `data` beside it (written even when empty: an answer's files are
    fixed), and its inline tensors of 1 KiB or more appended there (smaller ones stay in the graph, where shape
    inference reads them). The graph holds no weight, so it stays far below protobuf's 2 GB whatever the
    model's size."""
    gathered = onnx.ModelProto()
    gathered.CopyFrom(model)
    with open(path.parent / data, "wb") as target:
        for tensor in external(gathered):
            _append(tensor, weights, target, data)
    onnx.save(gathered, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data,
              size_threshold=1024)


def external(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The tensors of `model` (its subgraphs' too) whose bytes are in external data."""
    return [tensor for tensor in stored_tensors(model.graph) if tensor.data_location == onnx.TensorProto.EXTERNAL]


def _append(tensor: onnx.TensorProto, weights: Path, target: BinaryIO, location: str) -> None:
    """Copies the bytes of the external `tensor`, its reference relative to the folder `weights`, to the end
    of `target` (at a page boundary) and points the tensor there, at `location`."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    target.seek(0, os.SEEK_END)
    target.seek(-target.tell() % ALIGNMENT, os.SEEK_CUR)
    offset = target.tell()
    length = _copy_range(weights / entries["location"], int(entries.get("offset", 0)), external_bytes(tensor), target)
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)


def _copy_range(source: Path, offset: int, length: int, target: BinaryIO) -> int:
    """Copies `length` bytes of `source` from `offset` to `target` (a reference without its length is weighed
    by its shape, `external_bytes`: read to the end, each such tensor copied the rest of its data file);
    returns how many."""
    copied = 0
    with open(source, "rb") as stream:
        stream.seek(offset)
        while copied < length:
            block = stream.read(min(BLOCK, length - copied))
            if not block:
                break
            target.write(block)
            copied += len(block)
    return copied
