"""The graph JSON: every compiled node, the original nodes it absorbed, and the rule that made it.

The original nodes come from `graph_map.BoundaryMap`. The rule behind a compiled node is found by
differential compile: a node that is missing when a rule is switched off was made by that rule. When
several rules take part (GeluFusion makes a Gelu that GeluApproximation then rewrites), all are listed and
the one ORT applied last is named the maker.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from accubisect.core.graph_map import BoundaryMap, nested_counts, nested_nodes
from accubisect.core.onnx_graph import Node, graph_nodes, nodes_with_protos, signature_counts
from accubisect.formats.compile_record import CompileRecord
from accubisect.formats.digest import file_sha256
from accubisect.formats.graph_record import GraphNode, GraphRecord, NestedNode
from accubisect.formats.model import load_compiled, load_model
from accubisect.formats.step import Step
from accubisect.runtime.backends import backend_named
from accubisect.runtime.catalogue import installed_catalogue
from accubisect.stages.compile_stage import Compiler, rewrites_weights

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphStep(Step):
    model: Path
    compiled_model: Path
    compile_record: Path
    graph_json: Path
    threads: int | None = None  # ORT's intra-op pool for the differential compiles: the job's


def write_graph(step: GraphStep) -> None:
    """Graph stage: maps the compiled graph of one variant back to the original model."""
    record = CompileRecord.read(step.compile_record)
    original = load_model(step.model, load_weights=False)
    compiled = load_compiled(step.compiled_model, load_weights=False)
    compiler = Compiler(step.model, record.variant, installed_catalogue(), backend_named(record.backend),
                        step.threads)
    without, nested_without = differential(compiler, record, bool(nested_nodes(compiled.graph)),
                                           rewrites_weights(compiler.graph, compiled))
    described = describe(record.variant.name, original.graph, compiled.graph, record.fired_rules, without)
    replace(described, model_sha256=file_sha256(step.model),
            nested=nested_claims(compiled.graph, record.fired_rules, nested_without)).write(step.graph_json)


Counts = dict[str, Counter[tuple[str, ...]]]  # rule -> node signature counts of the graph compiled without it


def differential(compiler: Compiler, record: CompileRecord, has_nested: bool,
                 discard_weights: bool) -> tuple[Counts, Counts]:
    """Per fired rule, the top-level and the nested (`nested_counts`) node signature counts of the graph
    compiled without it. The compile stage's own single-rule compiles are reused where the graph has no
    subgraphs: its record keeps the top-level counts alone. `discard_weights` as `Compiler.without`'s."""
    known = {} if has_nested else record.without_rules
    without: Counts = {}
    nested_without: Counts = {}
    for rule in record.fired_rules:
        if rule in known:
            without[rule] = known[rule]
            continue
        graph = compiler.without(rule, discard_weights).graph
        without[rule], nested_without[rule] = signature_counts(graph), nested_counts(graph)
    log.info("%s: %d differential compiles, %d reused from the compile stage", record.variant.name,
             len(nested_without), len(without) - len(nested_without))
    return without, nested_without


def describe(variant: str, original: onnx.GraphProto, compiled: onnx.GraphProto, fired: Sequence[str],
             without: Mapping[str, Counter[tuple[str, ...]]]) -> GraphRecord:
    """graph.json of `variant`; `without[rule]` is the node signature counts of the compiled graph with
    `rule` switched off."""
    compiled_nodes = nodes_with_protos(compiled)
    originals_of = node_map(original, compiled)
    makers = rule_claims([node for node, _ in compiled_nodes], fired, without)
    nodes = tuple(GraphNode(node.index, node.name, node.op_type, node.domain, node.inputs, node.outputs,
                            tuple(originals_of(node)), makers[node.index][-1] if node.index in makers
                            else None, tuple(makers.get(node.index, ())), *runtime_facts(proto))
                  for node, proto in compiled_nodes)
    covered = {name for node in nodes for name in node.original_nodes}
    return GraphRecord(variant, tuple(fired), nodes,
                       tuple(n.name for n in graph_nodes(original) if n.name not in covered))


def node_map(original: onnx.GraphProto, compiled: onnx.GraphProto) -> Callable[[Node], list[str]]:
    """Compiled node -> the original nodes it stands for. A backend that saved the map with its executed
    graph (OpenVINO's `original_nodes` attributes, `runtime.openvino_graph`) is taken at its word; for
    ONNX Runtime's optimized graph it is found through the tensors both graphs share (`BoundaryMap`)."""
    stated = {proto.name: [name.decode() for name in attribute.strings] for proto in compiled.node
              for attribute in proto.attribute if attribute.name == "original_nodes"}
    if stated:
        return lambda node: stated.get(node.name, [])
    return BoundaryMap(original, compiled).original_nodes


def runtime_facts(proto: onnx.NodeProto) -> tuple[str, str]:
    """(precision, kernel) of an executed node whose backend records them, else ("", "")."""
    facts = {attribute.name: attribute.s.decode() for attribute in proto.attribute
             if attribute.name in ("runtime_precision", "primitive_type")}
    return facts.get("runtime_precision", ""), facts.get("primitive_type", "")


def nested_claims(compiled: onnx.GraphProto, fired: Sequence[str],
                  without: Mapping[str, Counter[tuple[str, ...]]]) -> tuple[NestedNode, ...]:
    """The nodes inside `compiled`'s subgraphs that exist only because of fired rules (`without[rule]`: the
    nested node signature counts with `rule` off; a rule missing there made none), with those rules."""
    inside = nested_nodes(compiled)
    claims: dict[int, list[str]] = {}
    for rule in fired:
        if rule not in without:
            continue
        remaining = Counter(without[rule])
        for position, nested in enumerate(inside):
            if remaining[nested.signature] > 0:
                remaining[nested.signature] -= 1
            else:
                claims.setdefault(position, []).append(rule)
    return tuple(NestedNode(inside[i].owner.name, inside[i].subgraph, inside[i].node.index, inside[i].node.name,
                            inside[i].node.op_type, inside[i].node.domain, inside[i].node.inputs,
                            inside[i].node.outputs, tuple(rules)) for i, rules in sorted(claims.items()))


def rule_claims(nodes: list[Node], fired: Sequence[str],
                without: Mapping[str, Counter[tuple[str, ...]]]) -> dict[int, list[str]]:
    """Compiled node index -> the fired rules without which it does not exist, in the order they fired."""
    claims: dict[int, list[str]] = {}
    for rule in fired:
        remaining = Counter(without[rule])
        for node in nodes:
            if remaining[node.signature] > 0:
                remaining[node.signature] -= 1
            else:
                claims.setdefault(node.index, []).append(rule)
    return claims
