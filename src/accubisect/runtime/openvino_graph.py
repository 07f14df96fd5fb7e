"""The graph OpenVINO's CPU plugin really executes, as a graph of tensors named after the user's ONNX model.

`compiled.get_runtime_model()` lists the executed nodes (rt_info `layerType`, `runtimePrecision`,
`outputPrecisions`, `execOrder`, `primitiveType`, `originalLayersNames`), but its tensors carry no names,
its invented nodes carry counters that change between compiles (`Constant_5321`, `Multiply_10375`), and
`originalLayersNames` names only part of the original operations. So each executed output is named after
the ONNX tensor it computes (the output of the original operation whose result leaves the fused group),
each invented node after what it does, and the rest of the map comes from the graph's topology: the
ONNX nodes between two named tensors belong to the executed nodes between them
(`core.graph_map.BoundaryMap`). The result is an ONNX `GraphProto` (domain OV_DOMAIN) that the graph,
dump and compare stages read as they read ONNX Runtime's optimized graph; it is a record, never run.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import onnx

OV_DOMAIN = "ai.openvino.runtime"
LAYOUT_TYPES = frozenset({"Reorder", "Convert"})  # precision and layout conversions: no computation of the model
SKIPPED_TYPES = frozenset({"Input", "Output", "Const"})  # graph inputs, outputs and constants, not nodes
_COUNTER = re.compile(r"_\d+$")
RT_KEYS = ("layerType", "runtimePrecision", "outputPrecisions", "primitiveType", "originalLayersNames", "execOrder")


@dataclass(frozen=True)
class ExecutedNode:
    """One executed node: its name normalised (stable between compiles), what kernel ran it, in which
    precision, and the original operations OpenVINO says it holds."""

    name: str
    layer_type: str
    precision: str  # runtimePrecision: what the kernel computes in (f32, bf16, f16, i32, ...)
    primitive: str  # primitiveType, e.g. brgemm_avx512_bf16: the kernel, its ISA in the name
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    output_precisions: tuple[str, ...]
    original_layers: tuple[str, ...]  # OpenVINO operation names (originalLayersNames)

    def signature(self, named: Mapping[str, str]) -> tuple[str, ...]:
        """What must be equal for two compiles to have run the same program at this node, its tensors called
        as `named` calls them (`ExecutedGraph.tensor_classes`)."""
        return (self.layer_type, self.precision, self.primitive, *(named.get(t, t) for t in self.inputs), "->",
                *(named.get(t, t) for t in self.outputs), *self.output_precisions)


@dataclass(frozen=True)
class ExecutedGraph:
    """The executed nodes in execution order, the model's inputs and outputs, and the constants."""

    nodes: tuple[ExecutedNode, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: tuple[str, ...]

    def to_onnx(self) -> onnx.ModelProto:
        """The graph as an ONNX model of OV_DOMAIN nodes; each node's runtime facts are string attributes."""
        nodes = [onnx.helper.make_node(
            node.layer_type, list(node.inputs), list(node.outputs), name=node.name, domain=OV_DOMAIN,
            runtime_precision=node.precision, primitive_type=node.primitive,
            output_precisions=",".join(node.output_precisions), original_layers=",".join(node.original_layers))
            for node in self.nodes]
        graph = onnx.helper.make_graph(
            nodes, "openvino_runtime", [onnx.ValueInfoProto(name=name) for name in self.inputs],
            [onnx.ValueInfoProto(name=name) for name in self.outputs],
            [onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT) for name in self.constants])
        return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(OV_DOMAIN, 1)])

    @classmethod
    def from_onnx(cls, model: onnx.ModelProto) -> ExecutedGraph:
        """The graph `to_onnx` saved."""
        nodes = []
        for proto in model.graph.node:
            facts = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
            text = {key: value.decode() for key, value in facts.items() if isinstance(value, bytes)}
            nodes.append(ExecutedNode(proto.name, proto.op_type, text["runtime_precision"], text["primitive_type"],
                                      tuple(proto.input), tuple(proto.output),
                                      tuple(filter(None, text["output_precisions"].split(","))),
                                      tuple(filter(None, text["original_layers"].split(",")))))
        graph = model.graph
        return cls(tuple(nodes), tuple(v.name for v in graph.input), tuple(v.name for v in graph.output),
                   tuple(t.name for t in graph.initializer))

    def output_precisions(self) -> dict[str, str]:
        """Tensor -> the precision its executed node writes it in."""
        return {name: precision for node in self.nodes
                for name, precision in zip(node.outputs, node.output_precisions, strict=False)}

    def passive(self) -> set[str]:
        """Nodes that compute nothing of a sample: conversions, and nodes reading constants alone (weights
        reshaped or reordered at run time)."""
        fixed = set(self.constants)
        passive = set()
        for node in self.nodes:
            if node.layer_type in LAYOUT_TYPES or all(name in fixed for name in node.inputs):
                passive.add(node.name)
                if node.layer_type not in LAYOUT_TYPES or all(name in fixed for name in node.inputs):
                    fixed.update(node.outputs)
        return passive

    def differences(self, other: ExecutedGraph, onnx_names: set[str]) -> list[ExecutedNode]:
        """The nodes of `self` that `other` does not run the same way; `onnx_names`: the model's tensors.
        Conversions (layout, precision) are not compared, and the tensors they join count as one: an exposed
        output moves a layout Reorder, so the ONNX name lands on the other side of it, and the program is the
        same."""
        theirs = Counter(node.signature(other.tensor_classes(onnx_names)) for node in other.nodes
                         if node.layer_type not in LAYOUT_TYPES)
        named = self.tensor_classes(onnx_names)
        different = []
        for node in self.nodes:
            if node.layer_type in LAYOUT_TYPES:
                continue
            signature = node.signature(named)
            if theirs[signature] > 0:
                theirs[signature] -= 1
            else:
                different.append(node)
        return different

    def tensor_classes(self, onnx_names: set[str]) -> dict[str, str]:
        """Tensor -> a name that two compiles of one program share. Tensors joined by conversions are one
        class, called by the ONNX tensor in it where one is (of `onnx_names`); a tensor OpenVINO invented is
        called by what computes it (its node's type and its inputs' names, hashed), never by the node's own
        name, which follows the plugin's counters; every invented constant is `Const`."""
        start: dict[str, str] = {}
        for node in self.nodes:
            if node.layer_type in LAYOUT_TYPES and node.inputs:
                for output in node.outputs:
                    start[output] = start.get(node.inputs[0], node.inputs[0])
        onnx_named: dict[str, str] = {}
        for tensor, first in sorted(start.items()):
            for member in (first, tensor):
                if member in onnx_names:
                    onnx_named.setdefault(first, member)
        constants = set(self.constants)
        named: dict[str, str] = {}

        def name(tensor: str) -> str:
            first = start.get(tensor, tensor)
            if first in onnx_names:
                return first
            return onnx_named.get(first) or named.get(first) or ("Const" if first in constants else first)

        for node in self.nodes:
            if node.layer_type in LAYOUT_TYPES:
                continue
            computed = f"{node.layer_type}({','.join(name(t) for t in node.inputs)})"
            for port, output in enumerate(node.outputs):
                if output not in onnx_names:
                    named[output] = f"{node.layer_type}#{hashlib.sha256(computed.encode()).hexdigest()[:12]}:{port}"
        return {tensor: name(tensor) for node in self.nodes for tensor in (*node.inputs, *node.outputs)}


def rt_text(node, key: str) -> str:
    info = node.get_rt_info()
    return info[key].astype(str) if key in info else ""


def executed_graph(original, runtime) -> ExecutedGraph:
    """`runtime` (a compiled model's `get_runtime_model()`) as an ExecutedGraph named after `original`
    (the `ov.Model` it was compiled from, read from the ONNX file)."""
    ops = {op.get_friendly_name(): op for op in original.get_ordered_ops()}
    executed = sorted(runtime.get_ordered_ops(), key=lambda op: int(rt_text(op, "execOrder") or 0))
    names = _Names(ops, executed)
    nodes, inputs, outputs, constants = [], [], [], []
    for op in executed:
        kind = rt_text(op, "layerType")
        own = [names.tensor(op.output(port)) for port in range(op.get_output_size())]
        if kind == "Input":
            inputs += own
        elif kind == "Const":
            constants += own
        elif kind == "Output":
            outputs.append(names.tensor(op.input(0).get_source_output()))
        else:
            nodes.append(ExecutedNode(
                names.node[op.get_friendly_name()], kind, rt_text(op, "runtimePrecision"),
                rt_text(op, "primitiveType"), tuple(names.tensor(i.get_source_output()) for i in op.inputs()),
                tuple(own), tuple(filter(None, rt_text(op, "outputPrecisions").split(","))),
                tuple(filter(None, rt_text(op, "originalLayersNames").split(",")))))
    return ExecutedGraph(tuple(nodes), tuple(inputs), tuple(outputs), tuple(constants))


class _Names:
    """Names that do not change between compiles. A tensor is called after the ONNX tensor it computes where
    one is known (a model output; the output of the original operation whose result leaves the executed
    node's group), else `<node>:<port>`. A node keeps its own name where it is an original operation's
    without a counter, else `<layerType>:<its output's tensor>`, or `<layerType><<its input's tensor>`, or
    for a constant `Const><its reader>:<input>`."""

    def __init__(self, ops: Mapping[str, object], executed: list) -> None:
        self.ops = ops
        self.known = _known_tensors(ops, executed)
        self.node: dict[str, str] = {}
        self._taken: set[str] = set()
        for op in executed:
            if rt_text(op, "layerType") != "Const":
                self._name(op, self._invented(op))
        for op in executed:
            for index, target in enumerate(op.inputs()):
                source = target.get_source_output().get_node()
                if rt_text(source, "layerType") == "Const" and source.get_friendly_name() not in self.node:
                    self._name(source, f"Const>{self.node.get(op.get_friendly_name(), '')}:{index}")
        for op in executed:
            if op.get_friendly_name() not in self.node:
                self._name(op, f"{rt_text(op, 'layerType')}:unread")

    def tensor(self, output) -> str:
        key = (output.get_node().get_friendly_name(), output.get_index())
        return self.known.get(key) or f"{self.node[key[0]]}:{key[1]}"

    def _invented(self, op) -> str:
        kind = rt_text(op, "layerType")
        if (known := self.known.get((op.get_friendly_name(), 0))) is not None:
            return f"{kind}:{known}"
        sources = [target.get_source_output() for target in op.inputs()]
        readable = [s for s in sources if rt_text(s.get_node(), "layerType") != "Const"]
        return f"{kind}<{self.tensor(readable[0])}" if readable else f"{kind}:unfed"

    def _name(self, op, invented: str) -> None:
        own = op.get_friendly_name()
        name = own if own in self.ops and not _COUNTER.search(own) else invented
        while name in self._taken:
            name += "'"
        self._taken.add(name)
        self.node[own] = name


def _known_tensors(ops: Mapping[str, object], executed: list) -> dict[tuple[str, int], str]:
    """(executed node, port) -> the ONNX tensor it computes, where one is known: the output of an original
    operation of its group (`originalLayersNames`, latest first) that an original operation of every node
    reading it (through conversions) reads, or that a model output is."""
    order = {name: index for index, name in enumerate(ops)}
    named = {name for op in executed for name in _layers(op)}
    silent = {name for name in ops if name not in named}  # absorbed by a node that does not name it
    known: dict[tuple[str, int], str] = {}
    for op in executed:
        group = sorted((ops[name] for name in _layers(op) if name in ops),
                       key=lambda o: order[o.get_friendly_name()], reverse=True)
        candidates = [output for member in group for output in member.outputs() if _tensor_name(output)]
        for port in range(op.get_output_size()):
            readers = _readers(op.output(port))
            for output in candidates:
                tensor = _tensor_name(output)
                if readers and all(_reads(ops, silent, _layers(reader), tensor) for reader in readers):
                    known[op.get_friendly_name(), port] = tensor
                    break
    for op in executed:
        result = ops.get(rt_text(op, "originalLayersNames"))
        if rt_text(op, "layerType") == "Output" and result is not None:
            source = op.input(0).get_source_output()
            known[source.get_node().get_friendly_name(), source.get_index()] = _tensor_name(
                result.input(0).get_source_output())
    return known


def _reads(ops: Mapping[str, object], silent: set[str], layers: list[str], tensor: str) -> bool:
    """Whether the original operations `layers` read `tensor`, directly or through operations no executed
    node names (a MatMul absorbed into a FullyConnected named after its bias Add)."""
    stack = [ops[name] for name in layers if name in ops]
    seen: set[str] = set()
    while stack:
        op = stack.pop()
        for target in op.inputs():
            source = target.get_source_output()
            if tensor in source.get_names():
                return True
            producer = source.get_node().get_friendly_name()
            if producer in silent and producer not in seen:
                seen.add(producer)
                stack.append(source.get_node())
    return False


def _layers(op) -> list[str]:
    return rt_text(op, "originalLayersNames").split(",")


def _readers(output) -> list:
    """The executed nodes reading `output`, seen through precision and layout conversions; none when an
    Output reads it (named by the model's output instead)."""
    readers = []
    for target in output.get_target_inputs():
        node = target.get_node()
        kind = rt_text(node, "layerType")
        if kind == "Output":
            return []
        readers += [reader for port in node.outputs() for reader in _readers(port)] if kind in LAYOUT_TYPES else [node]
    return readers


def _tensor_name(output) -> str:
    names = sorted(output.get_names())
    return names[0] if names else ""


def original_nodes(onnx_graph: onnx.GraphProto, ops: Iterable, graph: ExecutedGraph) -> dict[str, list[str]]:
    """Executed node -> the ONNX nodes it stands for, in ONNX order: those OpenVINO names
    (`originalLayersNames`, through `onnx_nodes_of`), then each ONNX node it names nowhere given to the
    executed nodes between its surrounding named tensors (`BoundaryMap`), conversions only where nothing
    else stands there."""
    from accubisect.core.graph_map import BoundaryMap

    imported = onnx_nodes_of(ops, onnx_graph)
    direct = {node.name: {imported[layer] for layer in node.original_layers if layer in imported}
              for node in graph.nodes}
    named = set().union(*direct.values()) if direct else set()
    boundary = BoundaryMap(onnx_graph, graph.to_onnx().graph)
    claims: dict[str, list[str]] = {}
    for node in boundary.compiled:
        for claimed in boundary.original_nodes(node):
            if claimed not in named:
                claims.setdefault(claimed, []).append(node.name)
    passive = graph.passive()
    for claimed, claimants in claims.items():
        computing = [name for name in claimants if name not in passive] or claimants
        for name in computing:
            direct[name].add(claimed)
    order = {node.name: index for index, node in enumerate(onnx_graph.node)}
    return {name: sorted(found, key=lambda n: order.get(n, -1)) for name, found in direct.items()}


def onnx_nodes_of(ops: Iterable, onnx_graph: onnx.GraphProto) -> dict[str, str]:
    """OpenVINO operation name -> the ONNX node it was imported from: the node writing one of its output
    tensors, or the node of its name, or of the name it extends (`<node>/WithoutBiases`: the Convolution of
    an ONNX Conv whose bias became an Add)."""
    maker = {out: node.name for node in onnx_graph.node for out in node.output if out}
    node_names = {node.name for node in onnx_graph.node}
    found = {}
    for op in ops:
        name = op.get_friendly_name()
        for output in op.outputs():
            for tensor in output.get_names():
                if tensor in maker:
                    found[name] = maker[tensor]
        if name not in found and name in node_names:
            found[name] = name
        elif name not in found and (stem := name.rsplit("/", 1)[0]) in node_names and stem != name:
            found[name] = stem
    return found
