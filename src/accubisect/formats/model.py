"""What the workflow needs to know about an ONNX model: its input and output tensors."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from accubisect.core.errors import ModelError
from accubisect.formats.files import atomic_model, link_or_copy, rebuild_advice
from accubisect.formats.graph_only import graph_only


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...] | None  # None where the model leaves a dimension symbolic, or declares no shape

    def mismatch(self, dtype: np.dtype, shape: tuple[int, ...]) -> str:
        """An empty string if an array of `dtype` and `shape` fits this tensor, else what is wrong."""
        if dtype != self.dtype:
            return f"has dtype {dtype}, the model expects {self.dtype}"
        if self.dims is None:
            return ""
        shapes = f"shape {list(shape)}, the model's [{', '.join('?' if d is None else str(d) for d in self.dims)}]"
        if len(shape) != len(self.dims):
            return f"has rank {len(shape)}, the model expects rank {len(self.dims)} ({shapes})"
        for axis, (got, want) in enumerate(zip(shape, self.dims, strict=True)):
            if want is not None and got != want:
                return f"has size {got} on axis {axis}, the model expects {want} ({shapes})"
        return ""


USER_MODEL = "set `model` to an exported .onnx file"


def load_model(path: Path, load_weights: bool = True, advice: str = USER_MODEL) -> onnx.ModelProto:
    """`advice` says what to do about a file that cannot be read: a user's model is exported again."""
    return _read(Path(path), advice, lambda: onnx.load(str(path), load_external_data=load_weights))


def load_graph(path: Path, advice: str = USER_MODEL) -> onnx.ModelProto:
    """The model at `path` without its weights, inline or external (`formats.graph_only`): each large tensor a
    reference into the file holding it, `path` itself for a model saved whole, so a model of any size is read
    in kilobytes; checked as `load_model` checks it."""
    return _read(Path(path), advice, lambda: graph_only(Path(path)))


def _read(path: Path, advice: str, reader: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
    if not path.is_file():
        raise ModelError(f"{path}: model file not found; {advice}")
    if path.stat().st_size == 0:  # protobuf reads no bytes as an empty model, which would blame the samples
        raise ModelError(f"{path}: empty file (0 bytes); {advice}")
    try:
        model = reader()
    except Exception as error:  # onnx raises DecodeError, OSError and others for a corrupt file
        raise ModelError(f"{path}: not a readable ONNX model ({type(error).__name__}: {error}); {advice}") from None
    _refuse_nul_names(model.graph, path)
    return model


def external_data_files(model: onnx.ModelProto, path: Path) -> tuple[Path, ...]:
    """The files holding `model`'s external data (saved from `path`), each once, in the order the model
    first names them. A model over 2 GB keeps its weights there (protobuf holds no more); a file the model
    names that is not beside it, where its `location` says, or that ends before a tensor's bytes do (a copy
    cut short: read from the files' sizes, no weight is read), is refused now, before any job runs."""
    files: dict[Path, int] = {}
    for tensor in stored_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        data = path.parent / entries.get("location", "")
        if not entries.get("location") or not data.is_file():
            raise ModelError(f"{path}: the external data file {data} of tensor {tensor.name!r} is missing; put the "
                             "data file saved with the model beside it, or set `model` to a model saved whole")
        size = files.setdefault(data, data.stat().st_size)
        end = int(entries.get("offset", 0)) + external_bytes(tensor)
        if end > size:
            raise ModelError(f"{path}: the external data file {data} ends at byte {size}, before tensor "
                             f"{tensor.name!r} does (byte {end}): it is cut short; copy the data file saved with "
                             "the model again, whole")
    return tuple(files)


def save_referencing(model: onnx.ModelProto, path: Path, weights: Path) -> None:
    """Writes `model`, read without its weights (`load_weights=False`) from the folder `weights`, at `path`
    with its external data files hard-linked beside it under the names it gives them: the weights are not
    copied (one file on disk, however many models reference it; ORT refuses absolute locations), and the
    graph, holding none, stays far below protobuf's 2 GB. Written atomically (`atomic_model`); a data file on
    another filesystem is copied."""
    with atomic_model(path) as temporary:
        onnx.save(model, str(temporary))
        for data in external_data_files(model, weights / path.name):
            link_or_copy(data, temporary.parent / data.relative_to(weights))


def tensor_values(tensor: onnx.TensorProto, folder: Path | None) -> np.ndarray:
    """A stored tensor's values, its external data read from the folder `folder` (that of the model it belongs
    to) with numpy rather than onnx's reader, which refuses a data file that has a second hard link: the jobs
    link data files (a hybrid's weights folder, the reduced model's), so a job reading one meanwhile failed."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return onnx.numpy_helper.to_array(tensor)
    entries = {entry.key: entry.value for entry in tensor.external_data}
    path = Path(folder or ".") / entries["location"]
    if not path.resolve().is_relative_to(Path(folder or ".").resolve()):
        raise ModelError(f"{path}: tensor {tensor.name!r} names a data file outside its model's folder; save the "
                         "model with its data file beside it")
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    values = np.fromfile(path, dtype=dtype, count=int(np.prod(tensor.dims)), offset=int(entries.get("offset", 0)))
    return values.reshape(tuple(tensor.dims))


def external_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of `tensor` kept in an external data file, by its `length` (0 for a tensor stored inline), read or
    not. A reference may leave its length out (ORT then reads as many bytes as the shape holds): its shape
    and type weigh it (a sub-byte type a byte an element, an upper bound), not nothing."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return 0
    entries = {entry.key: entry.value for entry in tensor.external_data}
    if "length" in entries:
        return int(entries["length"])
    return math.prod(tensor.dims) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def model_bytes(model: onnx.ModelProto) -> int:
    """What `model` weighs, read with its weights or without them: its protobuf and the external data its
    tensors name (by their `length`). That is the size of the files it was read from, the graph file and its
    data files (for a graph read by `graph_only`, a few dozen bytes more per weight, for the reference it
    holds instead), and what ORT holds of it: the disk estimate sizes a compiled copy by it, the deploy job the
    batch of tensors it measures at once."""
    return model.ByteSize() + sum(external_bytes(tensor) for tensor in stored_tensors(model.graph))


def stored_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in `graph` and its subgraphs: initializers and Constant-like attributes."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from stored_tensors(attribute.g)
            for body in attribute.graphs:
                yield from stored_tensors(body)


def load_compiled(path: Path, load_weights: bool = True) -> onnx.ModelProto:
    """A model the workflow wrote into the workspace: damaged only after the fact, so rebuilt, not exported."""
    return load_model(path, load_weights, rebuild_advice(path))


def _refuse_nul_names(graph: onnx.GraphProto, path: Path) -> None:
    """A NUL byte ends a name in C (HDF5 attributes, ORT's C API), so such a tensor could not be dumped or
    fed; refused before anything runs."""
    for name in _names(graph):
        if "\0" in name:
            raise ModelError(f"{path}: tensor or node name {name!r} holds a NUL byte; rename it in the model")


def _names(graph: onnx.GraphProto) -> Iterator[str]:
    """Every tensor and node name of `graph` and its subgraphs (If/Loop/Scan bodies)."""
    for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        yield value.name
    for node in graph.node:
        yield node.name
        yield from node.input
        yield from node.output
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _names(attribute.g)
            for body in attribute.graphs:
                yield from _names(body)


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    dims = None
    if tensor.HasField("shape"):
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)
    return TensorSpec(value.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)), dims)


def input_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Graph inputs that are not initializers (older models list their weights as inputs too)."""
    weights = {init.name for init in model.graph.initializer}
    return [_spec(value) for value in model.graph.input if value.name not in weights]


def output_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    return [_spec(value) for value in model.graph.output]
