"""Which original nodes each compiled node stands for: the map behind graph.json's `original_nodes`.

Tensor names survive fusion where a fused chain meets the rest of the graph. Compiled nodes joined by
tensors the original graph lacks (an NCHWc chain from `ReorderInput` to `ReorderOutput`, the Reshapes
around a Gemm) form a region, whose original nodes lie between its surviving tensors; inside a region
each original node goes to the compiled node that does its work. Layout copies name the nodes of the node
they serve, so every compiled node a precision answer keeps maps to real names of the user's model.

ORT also optimizes inside subgraphs (If branches, Loop and Scan bodies): `nested_nodes` lists the nodes there,
each under the top-level node that holds it, so that a rule firing in an If branch is seen where it fired.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import onnx

from accubisect.core.onnx_graph import Node, graph_nodes, nodes_with_protos

LAYOUT_OPS = frozenset({"ReorderInput", "ReorderOutput"})  # NchwcTransformer's layout copies: no computation
FUSED_FORMS = {"FusedConv": "Conv", "NhwcConv": "Conv", "FusedGemm": "Gemm", "FusedMatMul": "MatMul",
               "Upsample": "Resize", "NhwcMaxPool": "MaxPool"}  # ORT's op -> the one original op it computes
_GELU = frozenset({"Div", "Erf", "Add", "Mul", "Tanh", "Pow"})
_NORM = frozenset({"ReduceMean", "Sub", "Pow", "Add", "Sqrt", "Div", "Mul", "Reciprocal"})
FUSED_PARTS = {  # ORT's fused op -> the original ops it is built from, where no single one stands for it
    "QuickGelu": frozenset({"Sigmoid", "Mul"}), "Gelu": _GELU, "FastGelu": _GELU, "BiasGelu": _GELU,
    "LayerNormalization": _NORM, "SimplifiedLayerNormalization": _NORM, "SkipLayerNormalization": _NORM,
    "SkipSimplifiedLayerNormalization": _NORM,
}
Place = tuple[str, int | None]  # ("after" | "before" | "near", an anchor's index), or ("free", None)


def base_op(node: Node) -> str:
    """The op a node computes, domain ignored: an NCHWc Conv or a FusedConv is a Conv."""
    return FUSED_FORMS.get(node.op_type, node.op_type)


class BoundaryMap:
    """Finds the original nodes behind each compiled node through the tensors both graphs share.

    Compiled nodes joined by tensors the original graph lacks (an NCHWc chain from `ReorderInput` to
    `ReorderOutput`, the Reshapes around a Gemm) form a region. The region's original nodes are those
    between its surviving tensors: the walk back from its surviving outputs stops at any tensor the
    compiled graph also has, since another compiled node accounts for what made it. Inside a region of
    several nodes each original node goes to the compiled node that does its work (`_split`). Constant
    nodes compute nothing and are never listed."""

    def __init__(self, original: onnx.GraphProto, compiled: onnx.GraphProto) -> None:
        self.original = graph_nodes(original)
        self.compiled = graph_nodes(compiled)
        self._maker = {out: node for node in self.original for out in node.outputs if out}
        self._known = set(self._maker) | {v.name for v in original.input} | {t.name for t in original.initializer}
        self._in_compiled = ({t for node in self.compiled for t in (*node.inputs, *node.outputs) if t}
                             | {v.name for v in compiled.input} | {t.name for t in compiled.initializer})
        self._constants = ({t.name for t in original.initializer} | {t.name for t in compiled.initializer}
                           | {out for node in self.original if node.op_type == "Constant" for out in node.outputs})
        self._absorbed: dict[int, list[Node]] = {}
        for region in _regions(self.compiled, self._known):
            self._absorbed.update(self._split(region, self._between(region)))

    def original_nodes(self, node: Node) -> list[str]:
        """Original nodes whose computation `node` replaced, in original order."""
        return [n.name for n in sorted(self._absorbed.get(node.index, []), key=lambda n: n.index)]

    def _between(self, region: list[Node]) -> list[Node]:
        """Original nodes between the region's surviving tensors, in original order; no Constant."""
        found: dict[int, Node] = {}
        stack = [t for node in region for t in node.outputs if t in self._maker]
        while stack:
            maker = self._maker[stack.pop()]
            if maker.index not in found:
                found[maker.index] = maker
                stack += [t for t in maker.inputs if t in self._maker and t not in self._in_compiled]
        return [found[i] for i in sorted(found) if found[i].op_type != "Constant"]

    def _split(self, region: list[Node], originals: list[Node]) -> dict[int, list[Node]]:
        """Compiled node index -> its original nodes.

        Original and compiled nodes of one op are paired (`_pair`): the anchors. Every other original
        node has a place: after its nearest anchor upstream, else before its nearest anchor downstream.
        It goes to the compiled nodes at the same place beside the paired anchor that are built from its
        op (a QuickGelu after an NCHWc Conv takes the Sigmoid and Mul after the original Conv), else to
        the anchor (a BatchNormalization or Relu folded into the Conv), or to the unknown fused ops there.
        Layout copies take the original nodes of the node they feed or are fed by. Where no op pairs
        (MatMul + Add became Reshape, Gemm, Reshape), every compiled node takes them all."""
        compute = [node for node in region if node.op_type not in LAYOUT_OPS]
        pairs = self._pair(region, originals, compute) if len(region) > 1 else []
        if not pairs:
            return {node.index: list(originals) for node in region}
        anchor = {original.index: compiled.index for original, compiled in pairs}
        absorbed = {compiled.index: [original] for original, compiled in pairs}
        beside: dict[Place, list[Node]] = {}  # unpaired compiled nodes by their place
        for node, place in zip(compute, _places(region, set(absorbed), compute)):
            if place is not None:
                beside.setdefault(place, []).append(node)
        for node, place in zip(originals, _places(originals, set(anchor), originals)):
            if place is not None:
                for index in _doers(node, place, anchor, beside) or [c.index for c in compute]:
                    absorbed.setdefault(index, []).append(node)
        _inherit(region, absorbed)
        return absorbed

    def _pair(self, region: list[Node], originals: list[Node], compute: list[Node]) -> list[tuple[Node, Node]]:
        """(original, compiled) anchors: nodes of one op, told apart by the boundary tensors they depend on
        and lead to and the constants both read (a bias keeps its name), the k-th in topological order
        with the k-th; then by op alone among the rest."""
        outputs = {t for node in region for t in node.outputs}
        entering = {t for node in region for t in node.inputs
                    if t in self._known and t not in outputs and t not in self._constants}
        leaving = {t for t in outputs if t in self._known}
        read = lambda nodes: {t for node in nodes for t in node.inputs if t in self._constants}  # noqa: E731
        shared = read(originals) & read(region)
        keys = [_keys(nodes, entering, leaving, shared) for nodes in (originals, region)]
        pairs: list[tuple[Node, Node]] = []
        for size in (4, 3, 1):  # (op, upstream, downstream, constants), then without constants, then op alone
            paired = ({o.index for o, _ in pairs}, {c.index for _, c in pairs})
            groups: dict[tuple, tuple[list[Node], list[Node]]] = {}
            for side, nodes in enumerate((originals, compute)):
                for node in nodes:
                    if node.index not in paired[side]:
                        groups.setdefault(keys[side][node.index][:size], ([], []))[side].append(node)
            pairs += [pair for ours, theirs in groups.values() if len(ours) == len(theirs) or size == 1
                      for pair in zip(ours, theirs)]
        return pairs


def _doers(node: Node, place: Place, anchor: Mapping[int, int], beside: Mapping[Place, list[Node]]) -> list[int]:
    """The compiled nodes that do the work of the unpaired original `node` (see BoundaryMap._split); empty
    where `node` is joined to no anchor and no compiled node waits there."""
    side, at = place[0], anchor[place[1]] if place[1] is not None else None
    fused = beside.get((side, at), []) if side != "near" else []
    built = [f.index for f in fused if base_op(node) in FUSED_PARTS.get(f.op_type, ())]
    if built:
        return built
    if at is not None and (not fused or any(f.op_type in FUSED_PARTS for f in fused)):
        return [at]  # folded into the anchor: the fused nodes beside it are known not to hold this op
    return [f.index for f in fused]  # fused ops of unknown make-up


def _regions(nodes: list[Node], known: set[str]) -> list[list[Node]]:
    """Compiled nodes joined by tensors a compiled node makes and the original graph lacks."""
    parent = {node.index: node.index for node in nodes}

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    maker = {out: node.index for node in nodes for out in node.outputs if out and out not in known}
    for node in nodes:
        for tensor in node.inputs:
            if tensor in maker:
                parent[root(node.index)] = root(maker[tensor])
    regions: dict[int, list[Node]] = {}
    for node in nodes:
        regions.setdefault(root(node.index), []).append(node)
    return list(regions.values())


Edges = dict[int, list[Node]]


def _edges(nodes: list[Node]) -> tuple[Edges, Edges]:
    """Parents and children of each node (topological order), by tensors made and read within `nodes`."""
    makers = {out: node for node in nodes for out in node.outputs if out}
    parents = {node.index: list({makers[t].index: makers[t] for t in node.inputs if t in makers}.values())
               for node in nodes}
    children: Edges = {node.index: [] for node in nodes}
    for node in nodes:
        for up in parents[node.index]:
            children[up.index].append(node)
    return parents, children


def _keys(nodes: list[Node], entering: set[str], leaving: set[str],
          shared: set[str]) -> dict[int, tuple[str, frozenset[str], frozenset[str], frozenset[str]]]:
    """Node index -> (op, boundary tensors upstream, boundary tensors downstream, shared constants read)."""
    parents, children = _edges(nodes)
    up: dict[int, frozenset[str]] = {}
    for node in nodes:
        up[node.index] = frozenset(entering.intersection(node.inputs)).union(
            *(up[p.index] for p in parents[node.index]))
    down: dict[int, frozenset[str]] = {}
    for node in reversed(nodes):
        down[node.index] = frozenset(leaving.intersection(node.outputs)).union(
            *(down[c.index] for c in children[node.index]))
    return {node.index: (base_op(node), up[node.index], down[node.index], frozenset(shared.intersection(node.inputs)))
            for node in nodes}


def _places(nodes: list[Node], anchors: set[int], placed: list[Node]) -> list[Place | None]:
    """For each node of `placed`: None for an anchor, ("after", its nearest anchor upstream), else
    ("before", its nearest anchor downstream), else ("near", the nearest anchor either way), else ("free",
    None); nearest by edges within `nodes`, ties to the latest anchor upstream or the earliest otherwise."""
    parents, children = _edges(nodes)
    both = {index: parents[index] + children[index] for index in parents}
    places: list[Place | None] = []
    for node in placed:
        if node.index in anchors:
            places.append(None)
            continue
        for side, step, pick in (("after", parents, max), ("before", children, min), ("near", both, min)):
            at = _nearest(node, step, anchors, pick)
            if at is not None:
                places.append((side, at))
                break
        else:
            places.append(("free", None))
    return places


def _nearest(node: Node, step: Edges, targets: set[int], pick: Callable[[list[int]], int]) -> int | None:
    """The target fewest `step`s from `node`, `pick` choosing among equally near ones."""
    level, seen = [node], {node.index}
    while level:
        level = [n for m in level for n in step[m.index] if n.index not in seen]
        seen |= {n.index for n in level}
        hits = [n.index for n in level if n.index in targets]
        if hits:
            return pick(hits)
    return None


def _inherit(region: list[Node], absorbed: dict[int, list[Node]]) -> None:
    """Compiled nodes left without original nodes (layout copies, ORT's own additions) take those of the
    nearest node that has some: a ReorderInput those of the node it feeds, others those of the node that
    feeds them, each falling back to the other direction."""
    parents, children = _edges(region)
    has = {index for index, nodes in absorbed.items() if nodes}
    for node in region:
        if node.index in has:
            continue
        ways = (children, parents) if node.op_type == "ReorderInput" else (parents, children)
        source = _nearest(node, ways[0], has, min)
        source = source if source is not None else _nearest(node, ways[1], has, min)
        if source is not None:
            absorbed[node.index] = list(absorbed[source])


@dataclass(frozen=True)
class SubgraphNode:
    """A node inside a subgraph of the top-level node `owner`, at `subgraph`: the attribute path from the owner
    down ("then_branch"; "body/inner_if/else_branch" one level deeper)."""

    owner: Node
    subgraph: str
    node: Node  # its index and name are its subgraph's

    @property
    def signature(self) -> tuple[str, ...]:
        """What it computes and where: the same node in two compiles of one model has the same signature. The
        owner counts by name (an If keeps its name; its inputs may be renamed by fusions upstream)."""
        return (self.owner.name, self.subgraph, *self.node.signature)


def nested_nodes(graph: onnx.GraphProto) -> list[SubgraphNode]:
    """Every node inside the subgraphs of `graph`'s nodes, at any depth, in the owners' topological order."""
    return [SubgraphNode(owner, path, node) for owner, proto in nodes_with_protos(graph)
            for path, node in _inside(proto, "")]


def _inside(proto: onnx.NodeProto, prefix: str) -> Iterator[tuple[str, Node]]:
    for attribute in proto.attribute:
        bodies = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for body in bodies:
            path = f"{prefix}{attribute.name}"
            for node, inner in nodes_with_protos(body):
                yield path, node
                yield from _inside(inner, f"{path}/{node.name}/")


def nested_counts(graph: onnx.GraphProto) -> Counter[tuple[str, ...]]:
    """How many nested nodes of `graph` have each signature (`SubgraphNode.signature`)."""
    return Counter(nested.signature for nested in nested_nodes(graph))
