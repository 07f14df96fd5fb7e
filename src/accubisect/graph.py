"""The graph JSON: every compiled node, the original nodes it absorbed, and the rule that made it.

Absorbed nodes are found through tensors at the compiled node's boundary: tensor names survive fusion
where a fused chain meets the rest of the graph, so the original nodes between a compiled node's nearest
surviving input and output tensors are the ones it stands for. Glue nodes that ORT adds (the Reshapes
around a Gemm made by MatMulAddFusion) map to the same original nodes as the node they serve.

The rule behind a compiled node is found by differential compile: a node that is missing when a rule is
switched off was made by that rule. When several rules take part (GeluFusion makes a Gelu that
GeluApproximation then rewrites), all are listed and the one ORT applied last is named the maker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import onnx

from accubisect.catalogue import installed_catalogue
from accubisect.backends import backend_named
from accubisect.compile_stage import Variant, compile_without
from accubisect.errors import GraphError
from accubisect.files import read_json, write_json
from accubisect.model import load_model
from accubisect.onnx_graph import Node, graph_nodes, signature_counts

def write_graph(model: Path, compiled_model: Path, compile_record: Path, graph_json: Path) -> None:
    """Graph stage: maps the compiled graph of one variant back to the original model."""
    record = read_json(compile_record)
    spec = Variant.from_json(record["variant"])
    catalogue = installed_catalogue()
    original = load_model(model, load_weights=False)
    compiled = load_model(compiled_model, load_weights=False)
    backend = backend_named(record["backend"])
    without = {rule: compile_without(Path(model), spec, catalogue, backend, rule).graph
               for rule in record["fired_rules"]}
    write_json(graph_json, {"variant": spec.name, **describe(original.graph, compiled.graph, record["fired_rules"],
                                                               without)})


def describe(original: onnx.GraphProto, compiled: onnx.GraphProto, fired: list[str],
             without: Mapping[str, onnx.GraphProto]) -> dict[str, Any]:
    """The body of graph.json; `without[rule]` is the compiled graph with `rule` switched off."""
    nodes = graph_nodes(compiled)
    absorbed = BoundaryMap(original, nodes)
    makers = rule_claims(nodes, fired, without)
    rows = []
    for node in nodes:
        rules = makers.get(node.index, [])
        rows.append({
            "index": node.index, "name": node.name, "op_type": node.op_type, "domain": node.domain,
            "inputs": list(node.inputs), "outputs": list(node.outputs),
            "original_nodes": absorbed.original_nodes(node), "rule": rules[-1] if rules else None, "rules": rules,
        })
    covered = {name for row in rows for name in row["original_nodes"]}
    return {
        "fired_rules": list(fired),
        "nodes": rows,
        "eliminated_nodes": [n.name for n in absorbed.original if n.name not in covered],
    }


def rule_claims(nodes: list[Node], fired: list[str], without: Mapping[str, onnx.GraphProto]) -> dict[int, list[str]]:
    """Compiled node index -> the fired rules without which it does not exist, in the order they fired."""
    claims: dict[int, list[str]] = {}
    for rule in fired:
        remaining = signature_counts(without[rule])
        for node in nodes:
            if remaining[node.signature] > 0:
                remaining[node.signature] -= 1
            else:
                claims.setdefault(node.index, []).append(rule)
    return claims


class BoundaryMap:
    """Finds the original nodes behind a compiled node through the tensors both graphs share."""

    def __init__(self, original: onnx.GraphProto, compiled: list[Node]) -> None:
        self.original = graph_nodes(original)
        self._maker = {out: node for node in self.original for out in node.outputs if out}
        self._sources = {v.name for v in original.input} | {t.name for t in original.initializer}
        self._compiled_maker = {out: node for node in compiled for out in node.outputs if out}
        self._compiled_users: dict[str, list[Node]] = {}
        for node in compiled:
            for name in node.inputs:
                self._compiled_users.setdefault(name, []).append(node)

    def _known(self, tensor: str) -> bool:
        return tensor in self._maker or tensor in self._sources

    def _surviving(self, tensors: Iterable[str], step: Callable[[str], list[str]]) -> set[str]:
        """Nearest tensors that exist in the original graph, walking the compiled graph by `step`."""
        found, seen, stack = set(), set(), [t for t in tensors if t]
        while stack:
            tensor = stack.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            if self._known(tensor):
                found.add(tensor)
            else:
                stack += [t for t in step(tensor) if t]
        return found

    def _inputs_of(self, tensor: str) -> list[str]:
        maker = self._compiled_maker.get(tensor)
        return list(maker.inputs) if maker else []

    def _outputs_of(self, tensor: str) -> list[str]:
        return [out for user in self._compiled_users.get(tensor, []) for out in user.outputs]

    def original_nodes(self, node: Node) -> list[str]:
        """Original nodes between the node's surviving input and output tensors, in original order."""
        stops = self._surviving(node.inputs, self._inputs_of) | self._sources
        absorbed: dict[int, Node] = {}
        stack = [t for t in self._surviving(node.outputs, self._outputs_of) if t in self._maker]
        while stack:
            maker = self._maker[stack.pop()]
            if maker.index in absorbed:
                continue
            absorbed[maker.index] = maker
            stack += [t for t in maker.inputs if t and t not in stops and t in self._maker]
        return [absorbed[i].name for i in sorted(absorbed)]


def load_graph(path: Path) -> dict[str, Any]:
    try:
        return read_json(path)
    except (OSError, ValueError) as error:
        raise GraphError(f"{path}: cannot read graph JSON ({error}); delete it and re-run its stage") from None
