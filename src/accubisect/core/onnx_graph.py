"""Nodes of an ONNX graph in topological order, each under a unique name.

ORT's optimized graphs may hold unnamed or same-named nodes; the dump, the graph JSON and the compare
report must all call a node the same thing, so they all take names from here.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import onnx

_TOKEN = re.compile(r"_token_\d+")


@dataclass(frozen=True)
class Node:
    index: int  # position in topological order
    name: str  # unique within the graph
    op_type: str
    domain: str
    inputs: tuple[str, ...]  # "" marks an omitted optional input
    outputs: tuple[str, ...]

    @property
    def signature(self) -> tuple[str, ...]:
        """What the node computes, independent of ORT's counter-numbered names (`..._token_7`), which
        shift between two compilations of the same model."""
        strip = lambda names: tuple(_TOKEN.sub("", name) for name in names)  # noqa: E731
        return (self.domain, self.op_type, *strip(self.inputs), "->", *strip(self.outputs))


def graph_nodes(graph: onnx.GraphProto) -> list[Node]:
    return [node for node, _ in nodes_with_protos(graph)]


def nodes_with_protos(graph: onnx.GraphProto) -> list[tuple[Node, onnx.NodeProto]]:
    """Each node in topological order with its unique name, beside the NodeProto it came from."""
    protos = topological_order(graph)
    names = unique_names(protos)
    return [(Node(index, name, proto.op_type, proto.domain or "ai.onnx", tuple(proto.input), tuple(proto.output)),
             proto) for index, (name, proto) in enumerate(zip(names, protos))]


def unique_names(protos: list[onnx.NodeProto]) -> list[str]:
    """A node keeps its name where it has one no other node has. An unnamed or same-named node is called
    by its first output tensor (unique in SSA, and what a user sees in a viewer), or `<op_type>_<index>`
    where a node keeping its name has that name. A same-named node's name counts for nothing, so
    renaming same-named nodes to these names (`name_nodes_uniquely`) changes none of them."""
    counts: Counter[str] = Counter(proto.name for proto in protos if proto.name)
    taken = {name for name, count in counts.items() if count == 1}
    names = []
    for index, proto in enumerate(protos):
        if proto.name and counts[proto.name] == 1:
            names.append(proto.name)
            continue
        name = next((out for out in proto.output if out), "")
        if not name or name in taken:
            name = f"{proto.op_type}_{index}"
            while name in taken:
                name += "_"
        taken.add(name)
        names.append(name)
    return names


def topological_order(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Kahn's algorithm, ties broken by file order, so an already sorted graph keeps its order.
    Inputs produced by no node (graph inputs, initializers, outer-scope names) count as available; names
    a node's subgraphs (If/Loop bodies) read from this graph count as its inputs."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    waiting = [0] * len(graph.node)
    consumers: list[list[int]] = [[] for _ in graph.node]
    for i, node in enumerate(graph.node):
        for name in {name for name in (*node.input, *subgraph_reads(node)) if name in producer}:
            waiting[i] += 1
            consumers[producer[name]].append(i)
    ready = deque(i for i, count in enumerate(waiting) if count == 0)
    order = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in consumers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if len(order) != len(graph.node):
        order += [i for i in range(len(graph.node)) if i not in set(order)]  # a cycle: keep file order
    return [graph.node[i] for i in order]


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every tensor name the nodes of `node`'s subgraphs read, at any depth."""
    names: set[str] = set()
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for subgraph in graphs:
            for inner in subgraph.node:
                names |= {*inner.input, *subgraph_reads(inner)}
    return names


def signature_counts(graph: onnx.GraphProto) -> Counter[tuple[str, ...]]:
    return Counter(node.signature for node in graph_nodes(graph))


def name_nodes_uniquely(graph: onnx.GraphProto) -> None:
    """Renames, in place, nodes that share a name to the names the graph JSON and the dumps use: ORT
    refuses two nodes of one name, which real exporters write. Unnamed nodes stay unnamed."""
    for node, proto in nodes_with_protos(graph):
        if proto.name:
            proto.name = node.name


class CompiledNode(Protocol):
    """A node of a compiled graph as graph.json records it (`formats.graph_record.GraphNode`): what precision
    assignment and instance grouping read of it, without the core importing the file format."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def op_type(self) -> str: ...
    @property
    def inputs(self) -> Sequence[str]: ...
    @property
    def outputs(self) -> Sequence[str]: ...
    @property
    def original_nodes(self) -> Sequence[str]: ...
    @property
    def rules(self) -> Sequence[str]: ...
