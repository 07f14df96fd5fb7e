"""Storage emulation of fp16/bf16 on the CPU: the model as a reduced-precision device would store it.

ORT's own CPU fp16 path computes most ops in fp32 behind inserted Casts and never materialises the fp16
tensors between them, so it hides activation overflow. Here every float tensor that a reduced node
consumes or produces is rounded through Cast(fp16|bf16) -> Cast(fp32) instead: values beyond the range
become ±inf, tiny ones flush towards zero, as the device's memory would hold them. Constants feeding a
reduced node are rounded the same way (a copy: an fp32 node reading the same constant keeps it exact).
Arithmetic inside an op stays fp32, which models hardware that accumulates in fp32 (tensor cores, cube
units); it does not model fp16 accumulation.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from accubisect.onnx_graph import nodes_with_protos

ONNX_TYPE = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` (float32) as fp16 or bf16 would store them, returned as float32."""
    values = np.asarray(values, np.float32)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)  # nearest, ties to even
    return np.where(np.isnan(values), values, rounded.view(np.float32))


def emulate(model: onnx.ModelProto, reduced: set[str], dtype: str, dtypes: Mapping[str, str]) -> onnx.ModelProto:
    """A copy of `model` in which the nodes named in `reduced` (graph_nodes names) store in `dtype`.
    `dtypes` maps tensor names to numpy dtype names (from an fp32 dump) to know which tensors are float.
    Tensor names are kept: a reduced node's output keeps its name after rounding, so dumps still join."""
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    graph = rewritten.graph
    initializers = {init.name: init for init in graph.initializer}
    protos = {node.name: proto for node, proto in nodes_with_protos(model.graph)}
    rounded: dict[str, str] = {}  # tensor -> its rounded copy
    nodes = []
    for name, proto in protos.items():
        node = onnx.NodeProto()
        node.CopyFrom(proto)
        if name in reduced:
            for index, tensor in enumerate(node.input):
                if tensor and dtypes.get(tensor) == "float32":
                    node.input[index] = _rounded(tensor, dtype, initializers, rounded, nodes, graph)
            outputs = [(i, t) for i, t in enumerate(node.output) if t and dtypes.get(t) == "float32"]
            for index, tensor in outputs:
                node.output[index] = f"{tensor}/{dtype}_raw"
        nodes.append(node)
        if name in reduced:
            for _, tensor in outputs:
                nodes += _cast_pair(f"{tensor}/{dtype}_raw", tensor, dtype)
                rounded[tensor] = tensor  # already as the device stores it
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def _rounded(tensor: str, dtype: str, initializers, rounded: dict[str, str], nodes: list, graph) -> str:
    if tensor not in rounded:
        copy = f"{tensor}/{dtype}"
        if tensor in initializers:
            values = round_to(numpy_helper.to_array(initializers[tensor]), dtype)
            graph.initializer.append(numpy_helper.from_array(values, copy))
        else:
            nodes += _cast_pair(tensor, copy, dtype)
        rounded[tensor] = copy
    return rounded[tensor]


def _cast_pair(source: str, target: str, dtype: str) -> list[onnx.NodeProto]:
    low = f"{target}/as_{dtype}"
    return [helper.make_node("Cast", [source], [low], to=ONNX_TYPE[dtype], name=f"{low}/cast"),
            helper.make_node("Cast", [low], [target], to=TensorProto.FLOAT, name=f"{target}/cast_back")]

