"""Nodes of an ONNX graph in topological order, each under a unique name.

ORT's optimized graphs may hold unnamed or same-named nodes; the dump, the graph JSON and the compare
report must all call a node the same thing, so they all take names from here.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass

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
    seen: Counter[str] = Counter(proto.name for proto in protos if proto.name)
    pairs = []
    for index, proto in enumerate(protos):
        name = proto.name if proto.name and seen[proto.name] == 1 else f"{proto.op_type}_{index}"
        pairs.append((Node(index, name, proto.op_type, proto.domain or "ai.onnx", tuple(proto.input),
                           tuple(proto.output)), proto))
    return pairs


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
