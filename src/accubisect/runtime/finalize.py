"""The seeds' `--finalize`: the mixed-precision model itself, with real fp16/bf16 tensors.

Used twice: on the user's original model for the deployable answer (portable, loads in ORT at any level),
and on the compiled graph for native runs on a GPU. ONNX Runtime's CPU provider runs fp16 models (behind
Casts it inserts) but has no bf16 kernels for most ops: a bf16 model is valid ONNX for a device with bf16
kernels, and on the CPU it is only checked.

A reduced node reads and writes the low type where its op's schema allows (`op_schema.py`); other
tensors keep their type, and a node none of whose outputs may be low stays fp32 between Casts.
Activations cross each precision boundary through one Cast, graph inputs and outputs stay fp32, and
names read by If/Loop bodies stay fp32. Nodes kept in fp32 keep fp32 constants, also where a constant is
shared with a reduced node.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from accubisect.core.emulate import ONNX_TYPE
from accubisect.core.onnx_graph import nodes_with_protos, subgraph_reads
from accubisect.formats.model import tensor_values
from accubisect.runtime.op_schema import LowSlots, low_slots, opset_versions

ALIGNMENT = 4096  # each stored constant starts on a page, where ORT can map it


def finalize(model: onnx.ModelProto, reduced: set[str], dtype: str, dtypes: Mapping[str, str],
             weights: Path | None = None, stored: Mapping[str, onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """A copy of `model` in which the nodes named in `reduced` (graph_nodes names) compute in `dtype`;
    `dtypes` maps tensor names to numpy dtype names, from a real run. `weights`: the folder of `model`'s
    external data when it was read without its weights; the copy then references the constants it keeps
    there, and holds only those it converts. `stored`: converted constants already written to a data file
    (`store_low_constants`), by their copies' names: referenced, not converted again (ORT then reads the copy
    from a folder holding that file and `model`'s data files)."""
    final = onnx.ModelProto()
    final.CopyFrom(model)
    pairs = nodes_with_protos(model.graph)
    slots = reduced_slots(model, reduced, dtype, dtypes)
    written_low = {proto.output[i] for node, proto in pairs if node.name in slots for i in slots[node.name].outputs}
    # graph outputs, and names If/Loop bodies read, must keep their fp32 type: a Cast gives them back
    fp32_named = {value.name for value in final.graph.output} | {t for _, proto in pairs for t in subgraph_reads(proto)}
    lowering = _Lowering(final.graph, dtype, dtypes, written_low & fp32_named, written_low, weights, stored or {})
    for node, proto in pairs:
        lowering.add(proto, slots.get(node.name, LowSlots()).inputs)
    lowering.finish()
    return final


class _Lowering:
    """`finalize`'s rewrite of `graph`, node by node: each input read in the type its node wants, through a copy
    made once per tensor and type (`copy`), and each low output that must stay fp32 (`cast_back`: graph
    outputs, names If/Loop bodies read) written under another name and cast back."""

    def __init__(self, graph: onnx.GraphProto, dtype: str, dtypes: Mapping[str, str], cast_back: set[str],
                 written_low: set[str], weights: Path | None, stored: Mapping[str, onnx.TensorProto]) -> None:
        self.graph, self.dtype, self.dtypes, self.cast_back = graph, dtype, dtypes, cast_back
        self.low = ONNX_TYPE[dtype]
        self.stored_low = written_low - cast_back
        self.weights, self.stored = weights, stored
        self.initializers = {init.name: init for init in graph.initializer}
        self.constant_nodes = {proto.output[0]: attribute.t for proto in graph.node if proto.op_type == "Constant"
                               for attribute in proto.attribute if attribute.name == "value"}
        self.copies: dict[tuple[str, int], str] = {(tensor, self.low): f"{tensor}/{dtype}" for tensor in cast_back}
        self.nodes: list[onnx.NodeProto] = []

    def add(self, proto: onnx.NodeProto, low_inputs: Collection[int]) -> None:
        """`proto` rewritten, after the copies its inputs need, and followed by the Casts back to fp32 of its
        outputs in `cast_back`."""
        rewritten = onnx.NodeProto()
        rewritten.CopyFrom(proto)
        for index, tensor in enumerate(rewritten.input):
            if tensor and self.dtypes.get(tensor) == "float32":
                wanted = self.low if index in low_inputs else TensorProto.FLOAT
                held = self.low if tensor in self.stored_low else TensorProto.FLOAT
                if held != wanted:
                    rewritten.input[index] = self.copy(tensor, wanted)
        for index, tensor in enumerate(rewritten.output):
            if tensor in self.cast_back:
                rewritten.output[index] = f"{tensor}/{self.dtype}"
        self.nodes.append(rewritten)
        for tensor in proto.output:
            if tensor in self.cast_back:
                self.nodes.append(helper.make_node("Cast", [f"{tensor}/{self.dtype}"], [tensor], to=TensorProto.FLOAT,
                                                   name=f"{tensor}/to_fp32"))

    def copy(self, tensor: str, to: int) -> str:
        """`tensor` as type `to`: a converted initializer (a stored one referenced) or Constant node, or a Cast
        added once per tensor and type."""
        if (tensor, to) not in self.copies:
            name = _copy_name(tensor, to)
            if tensor in self.initializers:
                self.graph.initializer.append(self.stored[name] if name in self.stored else
                                              _converted(self.initializers[tensor], to, name, self.weights))
            elif tensor in self.constant_nodes:
                value = _converted(self.constant_nodes[tensor], to, name, self.weights)
                self.nodes.append(helper.make_node("Constant", [], [name], value=value, name=f"{name}/constant"))
            else:
                self.nodes.append(helper.make_node("Cast", [tensor], [name], to=to, name=f"{name}/cast"))
            self.copies[tensor, to] = name
        return self.copies[tensor, to]

    def finish(self) -> None:
        """The graph's nodes replaced by the rewritten ones, stale types dropped (ORT infers them again) and the
        fp32 constants only reduced nodes read dropped."""
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        del self.graph.value_info[:]
        _drop_unused_constants(self.graph)


def reduced_slots(model: onnx.ModelProto, reduced: set[str], dtype: str,
                  dtypes: Mapping[str, str]) -> dict[str, LowSlots]:
    """Per node of `reduced`: the positions of its inputs and outputs `finalize` gives the low type."""
    opsets = opset_versions(model)
    return {node.name: low_slots(proto, opsets, dtypes, dtype)
            for node, proto in nodes_with_protos(model.graph) if node.name in reduced}


def lowered_nodes(model: onnx.ModelProto, reduced: set[str], dtype: str, dtypes: Mapping[str, str]) -> list[str]:
    """The nodes of `reduced` that `finalize` really lowers: at least one output may take the low type."""
    return [name for name, slots in reduced_slots(model, reduced, dtype, dtypes).items() if slots.outputs]


def low_tensors(model: onnx.ModelProto, reduced: set[str], dtype: str,
                dtypes: Mapping[str, str]) -> dict[str, set[str]]:
    """Per node of `reduced`: the float32 tensors `finalize` makes it write or read in the low type (an output
    stored low, an input read through a Cast or a converted constant). A value beyond the type's range there
    is inf on a device that stores it, whatever ORT's CPU kernels compute behind their Casts."""
    slots = reduced_slots(model, reduced, dtype, dtypes)
    held: dict[str, set[str]] = {}
    for node, proto in nodes_with_protos(model.graph):
        if node.name in slots:
            low = slots[node.name]
            ends = [proto.output[i] for i in low.outputs] + [proto.input[i] for i in low.inputs]
            held[node.name] = {tensor for tensor in ends if tensor and dtypes.get(tensor) == "float32"}
    return held


def _drop_unused_constants(graph: onnx.GraphProto) -> None:
    """fp32 constants that only reduced nodes read are replaced by their low copies, whether initializers
    or Constant nodes (paddle2onnx writes every weight as one). Graphs with subgraphs keep everything (a
    subgraph may read an outer constant by name), and so do constants that old exporters also list as
    graph inputs."""
    if any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in graph.node for attribute in node.attribute):
        return
    used = ({tensor for node in graph.node for tensor in node.input} | {value.name for value in graph.output}
            | {value.name for value in graph.input})
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [node for node in graph.node if node.op_type != "Constant" or node.output[0] in used]
    del graph.node[:]
    graph.node.extend(nodes)


def store_low_constants(model: onnx.ModelProto, reduced: set[str], dtype: str, dtypes: Mapping[str, str],
                        weights: Path, data: Path) -> dict[str, onnx.TensorProto]:
    """Every float32 initializer of `model` (its data files in the folder `weights`) held as external data that
    a node of `reduced` reads in `dtype`, converted once into the file `data`, each tensor on a page of its own:
    {its copy's name in `finalize`: a reference to it, relative to `data`'s folder}. A model `finalize` makes
    for any subset of `reduced` references these instead of holding converted copies of its own; ORT reads it
    from a folder holding `data` and `model`'s data files."""
    low = ONNX_TYPE[dtype]
    initializers = {init.name: init for init in model.graph.initializer
                    if init.data_location == TensorProto.EXTERNAL and init.data_type == TensorProto.FLOAT}
    slots = reduced_slots(model, reduced, dtype, dtypes)
    read_low = {proto.input[i] for node, proto in nodes_with_protos(model.graph) if node.name in slots
                for i in slots[node.name].inputs}
    stored: dict[str, onnx.TensorProto] = {}
    with open(data, "wb") as target:
        for tensor in sorted(read_low & set(initializers)):
            values = tensor_values(initializers[tensor], weights)
            with np.errstate(over="ignore"):
                converted = values.astype(helper.tensor_dtype_to_np_dtype(low))
            target.seek(-target.tell() % ALIGNMENT, os.SEEK_CUR)
            reference = TensorProto(name=_copy_name(tensor, low), data_type=low, dims=values.shape,
                                    data_location=TensorProto.EXTERNAL)
            for key, value in (("location", data.name), ("offset", target.tell()), ("length", converted.nbytes)):
                reference.external_data.add(key=key, value=str(value))
            target.write(converted.tobytes())
            stored[reference.name] = reference
    return stored


def _copy_name(tensor: str, to: int) -> str:
    return f"{tensor}/as_{TensorProto.DataType.Name(to).lower()}"


def _converted(initializer: onnx.TensorProto, to: int, name: str, weights: Path | None) -> onnx.TensorProto:
    values = tensor_values(initializer, weights).astype(np.float32)
    if to == TensorProto.FLOAT16:
        with np.errstate(over="ignore"):
            return numpy_helper.from_array(values.astype(np.float16), name)
    if to == TensorProto.BFLOAT16:
        return helper.make_tensor(name, TensorProto.BFLOAT16, values.shape, values.ravel().tolist())
    return numpy_helper.from_array(values, name)
