"""A model's graph without its weights, read straight from the file's bytes, for a model saved whole too.

`onnx.load(path, load_external_data=False)` leaves out only weights already in external data files: a model
saved whole (its weights inline, up to 2 GB) is parsed whole, weights and all. Here the file is memory-mapped
and walked at the protobuf wire level: every top-level initializer whose `raw_data` holds at least
`threshold` bytes becomes an external-data reference to those very bytes inside the model file (location:
the file's name, offset, length), so the graph parsed from the result is kilobytes, no weight is read into
Python, and ONNX Runtime, handed the graph with the model's folder as its weights folder, reads the weights
from the file itself only where it needs them. Tensors already external, and everything else, are kept as
they are. The model file must stay unchanged while the graph is in use (a workspace's compiled copy and a
user's model both do).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

import onnx

THRESHOLD = 1024  # bytes: smaller tensors stay inline, as onnx's own external-data conversion keeps them
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9  # field numbers in onnx.proto
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5  # protobuf wire types


def graph_only(path: Path, threshold: int = THRESHOLD) -> onnx.ModelProto:
    """The model at `path`, its inline weights of `threshold` bytes or more turned into references into
    `path` itself (read by ONNX Runtime from `path.parent`, its weights folder)."""
    with open(path, "rb") as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
        model = bytearray()
        for number, wire, begin, start, end in _fields(data, 0, len(data)):
            if number == _MODEL_GRAPH and wire == _BYTES:
                model += _field(number, _graph(data, start, end, Path(path).name, threshold))
            else:
                model += data[begin:end]
    return onnx.load_model_from_string(bytes(model))


def _graph(data: mmap.mmap, start: int, end: int, location: str, threshold: int) -> bytes:
    graph = bytearray()
    for number, wire, begin, field_start, field_end in _fields(data, start, end):
        if number == _GRAPH_INITIALIZER and wire == _BYTES:
            graph += _field(number, _tensor(data, field_start, field_end, location, threshold))
        else:
            graph += data[begin:field_end]
    return bytes(graph)


def _tensor(data: mmap.mmap, start: int, end: int, location: str, threshold: int) -> bytes:
    """The TensorProto at data[start:end], its raw_data (if `threshold` bytes or more) made a reference."""
    kept = bytearray()
    raw: tuple[int, int] | None = None
    for number, wire, begin, field_start, field_end in _fields(data, start, end):
        if number == _TENSOR_RAW_DATA and wire == _BYTES and field_end - field_start >= threshold:
            raw = (field_start, field_end - field_start)
        else:
            kept += data[begin:field_end]
    if raw is None:
        return bytes(data[start:end])
    for key, value in (("location", location), ("offset", str(raw[0])), ("length", str(raw[1]))):
        kept += _field(_TENSOR_EXTERNAL_DATA, _field(1, key.encode()) + _field(2, value.encode()))
    return bytes(kept + _varint(_TENSOR_DATA_LOCATION << 3 | _VARINT) + _varint(onnx.TensorProto.EXTERNAL))


def _fields(data: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, where the field starts, where its value starts, where it ends) of each field
    of the message at data[start:end]; a length-delimited value starts after its length."""
    at = start
    while at < end:
        begin = at
        key, at = _read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value_end = _read_varint(data, at)[1]
        elif wire in (_FIXED64, _FIXED32):
            value_end = at + (8 if wire == _FIXED64 else 4)
        elif wire == _BYTES:
            length, at = _read_varint(data, at)
            value_end = at + length
        else:  # groups (3, 4): proto2 only, never in onnx.proto
            raise ValueError(f"protobuf wire type {wire} at byte {begin}")
        yield number, wire, begin, at, value_end
        at = value_end


def _read_varint(data: mmap.mmap, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _varint(value: int) -> bytes:
    encoded = bytearray()
    while value > 0x7F:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | _BYTES) + _varint(len(value)) + value
