"""Storage emulation of fp16/bf16 on the CPU: the model as a reduced-precision device would store it.

ORT's own CPU fp16 path computes most ops in fp32 behind inserted Casts and never materialises the fp16
tensors between them, so it hides activation overflow. Here every float tensor that a reduced node
consumes or produces is rounded through Cast(fp16|bf16) -> Cast(fp32) instead: values beyond the range
become ±inf, tiny ones flush towards zero, as the device's memory would hold them. Constants feeding a
reduced node are rounded the same way, by a Cast pair in the graph rather than a rounded copy: an fp32 node
reading the same constant keeps it exact, and the rewritten model holds no weights of its own, so it can
reference the original's (external data) whatever the model's size.
Arithmetic inside an op stays fp32, which models hardware that accumulates in fp32 (tensor cores, cube
units); it does not model fp16 accumulation.

The Casts and the tensors between them are the emulation's, not the model's: the rewritten model records
what it added in its metadata (`EMULATION`), and `unemulated()` gives back the graph without them, so a
dump holds, names and orders the model's own tensors, each as the device would store it, and never asks
ONNX Runtime for the bf16 tensors inside a pair, which its Python API cannot return.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import onnx
from onnx import TensorProto, helper

from accubisect.core.onnx_graph import nodes_with_protos

ONNX_TYPE = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
EMULATION = "accubisect.emulation"  # metadata key: {"dtype", "nodes": added nodes, "renamed": {new: own name}}


def emulate(model: onnx.ModelProto, reduced: set[str], dtype: str, dtypes: Mapping[str, str]) -> onnx.ModelProto:
    """A copy of `model` in which the nodes named in `reduced` (graph_nodes names) store in `dtype`.
    `dtypes` maps tensor names to numpy dtype names (from an fp32 dump) to know which tensors are float.
    Tensor names are kept: a reduced node's output keeps its name after rounding, so dumps still join."""
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    protos = {node.name: proto for node, proto in nodes_with_protos(model.graph)}
    rounded: dict[str, str] = {}  # tensor -> its rounded copy
    renamed: dict[str, str] = {}  # a tensor only the emulation has -> the model's tensor it stands for
    nodes: list[onnx.NodeProto] = []
    added: list[str] = []  # the emulation's Casts
    for name, proto in protos.items():
        node = onnx.NodeProto()
        node.CopyFrom(proto)
        before: list[onnx.NodeProto] = []
        after: list[onnx.NodeProto] = []
        if name in reduced:
            for index, tensor in enumerate(node.input):
                if tensor and dtypes.get(tensor) == "float32":
                    node.input[index] = _rounded(tensor, dtype, rounded, before)
            for index, tensor in enumerate(node.output):
                if tensor and dtypes.get(tensor) == "float32":
                    node.output[index] = f"{tensor}/{dtype}_raw"
                    renamed[node.output[index]] = tensor
                    after += _cast_pair(node.output[index], tensor, dtype)
                    rounded[tensor] = tensor  # already as the device stores it
        nodes += [*before, node, *after]
        added += [cast.name for cast in (*before, *after)]
    renamed.update({copy: tensor for tensor, copy in rounded.items() if copy != tensor})
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    record = {"dtype": dtype, "nodes": added, "renamed": renamed}
    rewritten.metadata_props.add(key=EMULATION, value=json.dumps(record, sort_keys=True))
    return rewritten


def unemulated(model: onnx.ModelProto) -> onnx.GraphProto:
    """The graph that `model` emulates reduced precision on: the added Casts gone,
    reduced nodes reading and writing their tensors under their own names. Its nodes are the model's, in
    the same order, so they get the same names and topological indices. A model emulate() did not write
    is returned as it is."""
    record = next((json.loads(prop.value) for prop in model.metadata_props if prop.key == EMULATION), None)
    if record is None:
        return model.graph
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    added, renamed = set(record["nodes"]), record["renamed"]
    nodes = [node for node in graph.node if node.name not in added]
    for node in nodes:
        for names in (node.input, node.output):
            for index, name in enumerate(names):
                names[index] = renamed.get(name, name)
    del graph.node[:]
    graph.node.extend(nodes)
    return graph


def _rounded(tensor: str, dtype: str, rounded: dict[str, str], nodes: list) -> str:
    """`tensor`'s rounded copy, made once by a Cast pair (an activation or a constant alike)."""
    if tensor not in rounded:
        copy = f"{tensor}/{dtype}"
        nodes += _cast_pair(tensor, copy, dtype)
        rounded[tensor] = copy
    return rounded[tensor]


def _cast_pair(source: str, target: str, dtype: str) -> list[onnx.NodeProto]:
    low = f"{target}/as_{dtype}"
    return [helper.make_node("Cast", [source], [low], to=ONNX_TYPE[dtype], name=f"{low}/cast"),
            helper.make_node("Cast", [low], [target], to=TensorProto.FLOAT, name=f"{target}/cast_back")]

