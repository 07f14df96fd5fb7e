"""Subgraphs of a model in node order: the cuts `snakemake reduce` probes and the model it writes.

A subgraph is a set of node positions (topological order, `onnx_graph.nodes_with_protos`) and the tensors
it outputs. What its nodes read and do not make are its boundary: fed as graph inputs, except tensors that
depend on no graph input (a `Constant` node's output, a shape computed from weights), which become
initializers, so that a fusion whose pattern checks a constant (Gelu's sqrt(2), LayerNorm's epsilon) still
sees one. Everything here is pure: the caller supplies the boundary's types and the constants' values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from accubisect.core.onnx_graph import Node, nodes_with_protos, subgraph_reads

RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})  # no inputs, yet no constant


class Graph:
    """A model's nodes in topological order, with who makes and who reads each tensor."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        pairs = nodes_with_protos(model.graph)
        self.nodes: list[Node] = [node for node, _ in pairs]
        self.protos: list[onnx.NodeProto] = [proto for _, proto in pairs]
        self.producer = {out: node.index for node in self.nodes for out in node.outputs if out}
        self.initializers = {init.name for init in model.graph.initializer}
        outer = {*self.producer, *self.initializers, *(value.name for value in model.graph.input)}
        self.reads: list[tuple[str, ...]] = [tuple(dict.fromkeys(  # a body's own tensors are no read of this graph
            t for t in (*node.inputs, *sorted(subgraph_reads(proto))) if t in outer)) for node, proto in pairs]
        self.last_reader: dict[str, int] = {}
        for position, reads in enumerate(self.reads):
            for tensor in reads:
                self.last_reader[tensor] = position
        self.model_outputs = tuple(value.name for value in model.graph.output)
        self.constants = self._constants()

    def __len__(self) -> int:
        return len(self.nodes)

    def _constants(self) -> frozenset[str]:
        """Tensors that depend on no graph input: made by nodes reading only initializers and such tensors."""
        constant = set(self.initializers)
        for node, reads in zip(self.nodes, self.reads, strict=True):
            if node.op_type not in RANDOM_OPS and all(t in constant for t in reads):
                constant.update(out for out in node.outputs if out)
        return frozenset(constant - self.initializers)

    def live_after(self, position: int) -> list[str]:
        """The tensors crossing the cut after `position`: made at or before it, and read after it or a model
        output; in the order they were made. Constants are left out (a check of them would say nothing)."""
        live = []
        for node in self.nodes[:position + 1]:
            for out in node.outputs:
                if out and out not in self.constants and (
                        self.last_reader.get(out, -1) > position or out in self.model_outputs):
                    live.append(out)
        return live

    def ancestors(self, outputs: Iterable[str], start: int = 0) -> list[int]:
        """Positions of the nodes at or after `start` that `outputs` need, in order."""
        needed: set[int] = set()
        stack = [self.producer[t] for t in outputs if t in self.producer]
        while stack:
            position = stack.pop()
            if position < start or position in needed:
                continue
            needed.add(position)
            stack.extend(self.producer[t] for t in self.reads[position] if t in self.producer)
        return sorted(needed)

    def boundary(self, positions: Sequence[int]) -> list[str]:
        """What the nodes at `positions` read and do not make, initializers aside, in the order first read."""
        made = {out for p in positions for out in self.nodes[p].outputs if out}
        return list(dict.fromkeys(t for p in positions for t in self.reads[p]
                                  if t not in made and t not in self.initializers))

    def extract(self, positions: Sequence[int], outputs: Sequence[str], fed: Mapping[str, tuple[str, Sequence | None]],
                constants: Mapping[str, np.ndarray],
                output_types: Mapping[str, tuple[str, Sequence | None]]) -> onnx.ModelProto:
        """The nodes at `positions` as a model of their own, outputting `outputs`. Boundary tensors are graph
        inputs typed by `fed` (name -> (numpy dtype, shape: a string for a dimension that varies, None for no shape)),
        or initializers where `constants` holds their value; `output_types` types the outputs as `fed` does."""
        graph = self.model.graph
        chosen = [self.protos[p] for p in sorted(positions)]
        reads = {t for p in positions for t in self.reads[p]}
        missing = [t for t in self.boundary(positions) if t not in fed and t not in constants]
        if missing:
            raise ValueError(f"boundary tensors with neither a type nor a value: {missing}")
        inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(fed[name][0])),
                                                fed[name][1])
                  for name in self.boundary(positions) if name not in constants]
        initializers = [init for init in graph.initializer if init.name in reads]
        initializers += [numpy_helper.from_array(np.asarray(constants[name]), name)
                         for name in self.boundary(positions) if name in constants]
        outs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(output_types[name][0])),
                                              output_types[name][1]) for name in outputs]
        cut = helper.make_graph(chosen, "reduced", inputs, outs, initializer=initializers)
        model = helper.make_model(cut, opset_imports=list(self.model.opset_import),
                                  producer_name="accubisect reduce")
        model.ir_version = self.model.ir_version
        model.functions.extend(self.model.functions)
        return model


def varying_shape(shapes: Sequence[Sequence[int]]) -> list[int | str] | None:
    """One declared shape for a tensor fed arrays of `shapes`: a dimension that differs between them is
    symbolic; arrays of different ranks leave the shape undeclared (None)."""
    first = list(shapes[0])
    if any(len(shape) != len(first) for shape in shapes):
        return None
    return [dim if all(shape[axis] == dim for shape in shapes) else f"d{axis}" for axis, dim in enumerate(first)]
