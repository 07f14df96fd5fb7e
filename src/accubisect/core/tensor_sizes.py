"""Bytes of a model's tensors before it runs: ONNX shape inference with concrete input shapes.

For the dump stage's batches and the workspace warning (`stages.disk`). A tensor whose shape or type
inference cannot tell (a custom op's, or one fusion renamed) is not counted. Pure: a model in, sizes out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx


def with_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of `model` whose graph inputs have `input_shapes`."""
    concrete = onnx.ModelProto()
    concrete.CopyFrom(model)
    for value in concrete.graph.input:
        if value.name in input_shapes and value.type.HasField("tensor_type"):
            shape = value.type.tensor_type.shape
            del shape.dim[:]
            for size in input_shapes[value.name]:
                shape.dim.add().dim_value = int(size)
    return concrete


def tensor_bytes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Bytes of every tensor of `model` (inputs and node outputs) whose element type and concrete shape
    shape inference finds when the inputs have `input_shapes`."""
    concrete = with_input_shapes(model, input_shapes)
    sizes, longest_vector = _inferred(concrete, data_prop=False)
    produced = {name for node in model.graph.node for name in node.output if name}
    if produced - set(sizes) and longest_vector <= DATA_PROP_ELEMENTS:
        # data propagation sizes Reshapes fed by Shape arithmetic (magika: 94 of 95 tensors, not 12), but it
        # holds every vector's values: 17 GB and 47 s for one 50M-element input; so only without a long one
        sizes = _inferred(concrete, data_prop=True)[0]
    return sizes


DATA_PROP_ELEMENTS = 1 << 16  # no data propagation when a known vector (rank 0 or 1) is longer


def _inferred(model: onnx.ModelProto, data_prop: bool) -> tuple[dict[str, int], int]:
    """{name: bytes} of what shape inference sizes, and the most elements of a vector among them."""
    try:
        graph = onnx.shape_inference.infer_shapes(model, data_prop=data_prop).graph
    except Exception:  # noqa: BLE001 (inference refuses some valid models; then only the inputs are known)
        graph = model.graph
    sizes: dict[str, int] = {}
    longest = 0
    for value in (*graph.input, *graph.value_info, *graph.output):
        size = _value_bytes(value)
        if size is not None:
            sizes[value.name] = size
            dims = value.type.tensor_type.shape.dim
            if len(dims) <= 1:
                longest = max(longest, math.prod(d.dim_value for d in dims))
    return sizes, longest


def _value_bytes(value: onnx.ValueInfoProto) -> int | None:
    if not value.type.HasField("tensor_type"):
        return None
    tensor = value.type.tensor_type
    if not tensor.HasField("shape") or not all(d.HasField("dim_value") for d in tensor.shape.dim):
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return itemsize * math.prod(d.dim_value for d in tensor.shape.dim)
