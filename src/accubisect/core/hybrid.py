"""Hybrid graphs: a compiled graph with chosen fused instances replaced by the original nodes they absorbed.

An *instance* is one occurrence of a fusion: the compiled nodes that stand for the same original nodes (a
MatMulAddFusion's Gemm and the Reshapes around it; an NCHWc Conv and the layout copies that serve it), or
that are joined by a tensor the original model lacks (an NCHWc chain in its blocked layout, from
`ReorderInput` to `ReorderOutput`: no part of it can run alone on the original tensors), at least one of
them made by a rule of interest. Reverting it removes those compiled nodes and copies in the
original nodes they absorbed, with what those read that the compiled graph no longer has: the original
initializers, and the original nodes no compiled node stands for (Constants, shape computations ORT folded
away). The tensors where the instance meets the rest of the compiled graph keep their names across fusion,
so the copies are wired by name. An instance whose boundary is a tensor the original model lacks (a blocked
NCHWc layout, a fused-only tensor) or whose inputs are computed inside another fused node cannot be reverted
alone: `RevertError` says why.

The hybrid must run with graph optimization off, or ORT fuses the reverted nodes again. Pure graph surgery:
no file, no session (tests/bisection/test_instances.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import onnx

from accubisect.core.errors import RevertError
from accubisect.core.onnx_graph import CompiledNode, nodes_with_protos, subgraph_reads, topological_order

LAYOUT_OPS = frozenset({"Reshape", "Transpose", "ReorderInput", "ReorderOutput", "Squeeze", "Unsqueeze"})


@dataclass(frozen=True)
class Instance:
    """One fused instance: compiled nodes that stand for the same original nodes."""

    name: str  # its main compiled node: the first that is no layout op (a Gemm, not the Reshapes around it)
    nodes: tuple[str, ...]  # compiled node names, in topological order
    original_nodes: tuple[str, ...]  # what it absorbed, in the order the compiled nodes list them
    rules: tuple[str, ...]  # every rule its nodes need, in the order first met


def instances_of(nodes: Sequence[CompiledNode], rules: Collection[str],
                 original_tensors: Collection[str] | None = None) -> list[Instance]:
    """The instances of `rules` in a compiled graph (its nodes in topological order): compiled nodes joined by
    an original node they share, or by a tensor not in `original_tensors` (the original model's tensor names;
    None: not joined by tensors), grouped where any of them needs one of `rules`; in topological order."""
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for position, node in enumerate(nodes):
        for original in node.original_nodes:
            if original in first:
                parent[root(position)] = root(first[original])
            else:
                first[original] = position
    if original_tensors is not None:
        maker = {out: position for position, node in enumerate(nodes) for out in node.outputs if out}
        for position, node in enumerate(nodes):
            for tensor in node.inputs:
                if tensor in maker and tensor not in original_tensors:
                    parent[root(position)] = root(maker[tensor])
    groups: dict[int, list[CompiledNode]] = {}
    for position, node in enumerate(nodes):
        groups.setdefault(root(position), []).append(node)
    found = []
    for members in groups.values():
        needed = list(dict.fromkeys(rule for node in members for rule in node.rules))
        if not set(needed) & set(rules):
            continue
        main = next((node for node in members if node.op_type not in LAYOUT_OPS), members[0])
        found.append(Instance(main.name, tuple(node.name for node in members),
                              tuple(dict.fromkeys(o for node in members for o in node.original_nodes)),
                              tuple(needed)))
    order = {node.name: node.index for node in nodes}
    return sorted(found, key=lambda instance: order[instance.nodes[0]])


class NestedCompiledNode(CompiledNode, Protocol):
    """A graph record's node inside a subgraph (`formats.graph_record.NestedNode`)."""

    owner: str
    subgraph: str


def nested_instances(nodes: Sequence[NestedCompiledNode], rules: Collection[str],
                     original_tensors: Collection[str]) -> list[tuple[Instance, str]]:
    """The instances of `rules` inside subgraphs, grouped in each subgraph as `instances_of` groups the
    top-level graph's (`original_tensors`: every tensor name of the original model, its subgraphs' too);
    each named `<owner>/<subgraph>/<node>`, as are its nodes, beside why it cannot be reverted alone: surgery
    edits the top-level graph only."""
    places: dict[tuple[str, str], list[NestedCompiledNode]] = {}
    for node in nodes:
        places.setdefault((node.owner, node.subgraph), []).append(node)
    found = []
    for (owner, subgraph), members in places.items():
        where = f"{owner}/{subgraph}/"
        for i in instances_of(members, rules, original_tensors):
            instance = Instance(where + i.name, tuple(where + name for name in i.nodes), i.original_nodes, i.rules)
            found.append((instance, f"instance {instance.name}: inside the {subgraph} of {owner}: an instance inside "
                                    "a subgraph (If branch, Loop or Scan body) cannot be reverted alone today"))
    return found


@dataclass(frozen=True)
class Revert:
    """What reverting instances changes in a compiled graph: computed from the graphs' structure alone."""

    removed: frozenset[str]  # compiled node names
    copied: tuple[onnx.NodeProto, ...]  # original nodes, named as graph JSON calls them
    initializers: tuple[onnx.TensorProto, ...]  # original initializers the copies read that the graph lacks


class Surgeon:
    """Reverts instances in one compiled graph, from the original model it was compiled from.

    `absorbed` names every original node some compiled node stands for (graph JSON's `original_nodes`): a
    missing input made by one of those is inside another fused node and cannot be recomputed here; one made
    by any other original node (a Constant, a folded shape computation) is copied in too."""

    def __init__(self, compiled: onnx.ModelProto, original: onnx.ModelProto, absorbed: Collection[str]) -> None:
        self.compiled, self.original, self.absorbed = compiled, original, frozenset(absorbed)
        self._compiled_nodes = {node.name: proto for node, proto in nodes_with_protos(compiled.graph)}
        self._original_nodes = {node.name: (node, proto) for node, proto in nodes_with_protos(original.graph)}
        self._maker = {out: name for name, (node, _) in self._original_nodes.items() for out in node.outputs if out}
        self._original_initializers = {tensor.name: tensor for tensor in original.graph.initializer}
        self._compiled_initializers = {tensor.name: tensor for tensor in compiled.graph.initializer}
        self._compiled_inputs = {value.name for value in compiled.graph.input}

    @property
    def original_tensors(self) -> set[str]:
        """Every tensor name of the original model: its inputs, initializers and node outputs."""
        return set(self._maker) | set(self._original_initializers) | {v.name for v in self.original.graph.input}

    def plan(self, instances: Iterable[Instance]) -> Revert:
        """What reverting `instances` together copies in; RevertError naming the instance if it cannot."""
        instances = list(instances)
        removed = frozenset(name for instance in instances for name in instance.nodes)
        unknown = sorted(removed - set(self._compiled_nodes))
        if unknown:
            raise RevertError(f"compiled nodes {unknown} are not in the compiled graph")
        remaining = [proto for name, proto in self._compiled_nodes.items() if name not in removed]
        produced = {out for proto in remaining for out in proto.output if out}
        own = {name: instance for instance in instances for name in instance.original_nodes}
        missing = sorted(set(own) - set(self._original_nodes))
        if missing:
            raise RevertError(f"instance {own[missing[0]].name}: original nodes {missing} are not in the original "
                              "model")
        available = (produced | self._compiled_inputs | set(self._compiled_initializers)
                     | {out for name in own for out in self._original_nodes[name][0].outputs if out})
        names_taken = {proto.name for proto in remaining}
        copied: dict[str, onnx.NodeProto] = {}
        initializers: dict[str, onnx.TensorProto] = {}
        for instance in instances:
            for name in instance.original_nodes:
                self._copy(instance, name, own, copied, initializers, available, names_taken)
        made = {out for proto in copied.values() for out in proto.output if out}
        for instance in instances:
            self._check_boundary(instance, remaining, made, produced)
        return Revert(removed, tuple(copied.values()), tuple(initializers.values()))

    def why_not(self, instance: Instance) -> str | None:
        """Why `instance` cannot be reverted alone, or None if it can."""
        try:
            self.plan([instance])
        except RevertError as error:
            return str(error)
        return None

    def hybrid(self, instances: Iterable[Instance]) -> onnx.ModelProto:
        """A copy of the compiled model with `instances` reverted (none: the compiled model as it is)."""
        revert = self.plan(instances)
        model = onnx.ModelProto()
        model.CopyFrom(self.compiled)
        graph = model.graph
        kept = [proto for name, proto in self._compiled_nodes.items() if name not in revert.removed]
        del graph.node[:]
        graph.node.extend(kept)
        graph.node.extend(revert.copied)
        ordered = topological_order(graph)
        del graph.node[:]
        graph.node.extend(ordered)
        read = {name for node in graph.node for name in (*node.input, *subgraph_reads(node))}
        read |= {value.name for value in graph.output}
        initializers = [tensor for tensor in graph.initializer if tensor.name in read]
        del graph.initializer[:]
        graph.initializer.extend([*initializers, *revert.initializers])
        tensors = read | {out for node in graph.node for out in node.output}
        values = [value for value in graph.value_info if value.name in tensors]
        del graph.value_info[:]
        graph.value_info.extend(values)
        domains = {opset.domain for opset in model.opset_import}
        model.opset_import.extend(opset for opset in self.original.opset_import if opset.domain not in domains)
        return model

    def _copy(self, instance: Instance, name: str, own: Mapping[str, Instance], copied: dict[str, onnx.NodeProto],
              initializers: dict[str, onnx.TensorProto], available: set[str], names_taken: set[str]) -> None:
        """Copies the original node `name` of `instance`, and the original initializers and unabsorbed original
        nodes it reads that the hybrid lacks (`available`: what the rest of the graph and the copies make)."""
        pending = [name]
        while pending:
            name = pending.pop()
            if name in copied:
                continue
            node, proto = self._original_nodes[name]
            clone = onnx.NodeProto()
            clone.CopyFrom(proto)
            clone.name = name if name not in names_taken else f"{name}/reverted"
            copied[name] = clone
            for tensor in (*node.inputs, *sorted(outer_reads(proto))):
                if not tensor or tensor in available or tensor in initializers:
                    continue
                if tensor in self._original_initializers:
                    initializers[tensor] = self._original_initializers[tensor]
                elif tensor in self._maker:
                    maker = self._maker[tensor]
                    if maker in self.absorbed and maker not in own:
                        raise RevertError(f"instance {instance.name}: it reads {tensor!r}, which the compiled graph "
                                          f"lacks: it is computed inside another fused node (of original {maker!r})")
                    pending.append(maker)
                else:
                    raise RevertError(f"instance {instance.name}: it reads {tensor!r}, which neither the compiled "
                                      "graph nor the original model makes")

    def _check_boundary(self, instance: Instance, remaining: list[onnx.NodeProto], made: set[str],
                        produced: set[str]) -> None:
        """Every tensor of the instance the rest of the graph reads must be remade by the copies, under the
        same name, and no copy may make a tensor the rest of the graph makes too."""
        read = {name for proto in remaining for name in (*proto.input, *subgraph_reads(proto))}
        read |= {value.name for value in self.compiled.graph.output}
        for name in instance.nodes:
            for tensor in self._compiled_nodes[name].output:
                if tensor and tensor in read and tensor not in made:
                    raise RevertError(f"instance {instance.name}: its output {tensor!r} is no tensor of the original "
                                      "model (a layout rewrite or fused-only tensor): it cannot be reverted alone")
        clash = sorted(made & (produced | self._compiled_inputs))
        if clash:
            raise RevertError(f"instance {instance.name}: the original nodes make {clash}, which the compiled graph "
                              "already makes")


def outer_reads(node: onnx.NodeProto) -> set[str]:
    """The names `node`'s subgraphs (If/Loop bodies) read from the graph around it: what they read at any
    depth, less what they define themselves (their inputs, initializers and node outputs)."""
    names: set[str] = set()
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for subgraph in graphs:
            defined = ({value.name for value in subgraph.input} | {tensor.name for tensor in subgraph.initializer}
                       | {out for inner in subgraph.node for out in inner.output})
            read = {name for inner in subgraph.node for name in (*inner.input, *outer_reads(inner))}
            read |= {value.name for value in subgraph.output}
            names |= read - defined
    return names
