"""What the workflow needs to know about an ONNX model: its input and output tensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from accubisect.errors import ModelError


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...]  # None where the model leaves a dimension symbolic

    def mismatch(self, dtype: np.dtype, shape: tuple[int, ...] | None) -> str:
        """An empty string if an array of `dtype` and `shape` fits this tensor, else what is wrong.
        A `shape` of None checks the dtype alone."""
        if dtype != self.dtype:
            return f"has dtype {dtype}, the model expects {self.dtype}"
        if shape is None:
            return ""
        if len(shape) != len(self.dims):
            return f"has rank {len(shape)} (shape {list(shape)}), the model expects rank {len(self.dims)}"
        for axis, (got, want) in enumerate(zip(shape, self.dims, strict=True)):
            if want is not None and got != want:
                return f"has size {got} on axis {axis}, the model expects {want} (shape {list(shape)})"
        return ""


def load_model(path: Path, load_weights: bool = True) -> onnx.ModelProto:
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: model file not found; set `model` to an .onnx file")
    try:
        return onnx.load(str(path), load_external_data=load_weights)
    except Exception as error:  # onnx raises DecodeError, OSError and others for a corrupt file
        raise ModelError(f"{path}: not a readable ONNX model ({type(error).__name__}: {error})") from None


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)
    return TensorSpec(value.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)), dims)


def input_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Graph inputs that are not initializers (older models list their weights as inputs too)."""
    weights = {init.name for init in model.graph.initializer}
    return [_spec(value) for value in model.graph.input if value.name not in weights]


def output_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    return [_spec(value) for value in model.graph.output]
