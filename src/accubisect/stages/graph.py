"""The graph JSON: every compiled node, the original nodes it absorbed, and the rule that made it.

The original nodes come from `graph_map.BoundaryMap`. The rule behind a compiled node is found by
differential compile: a node that is missing when a rule is switched off was made by that rule. When
several rules take part (GeluFusion makes a Gelu that GeluApproximation then rewrites), all are listed and
the one ORT applied last is named the maker.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from accubisect.core.errors import GraphError
from accubisect.core.graph_map import BoundaryMap
from accubisect.core.onnx_graph import Node, signature_counts
from accubisect.formats.files import read_json, write_json
from accubisect.formats.model import load_compiled, load_model
from accubisect.runtime.backends import backend_named
from accubisect.runtime.catalogue import installed_catalogue
from accubisect.stages.compile_stage import Variant, compile_without, decode_counts

log = logging.getLogger(__name__)


def write_graph(model: Path, compiled_model: Path, compile_record: Path, graph_json: Path,
                threads: int | None = None) -> None:
    """Graph stage: maps the compiled graph of one variant back to the original model; the differential
    compiles use at most `threads` ORT threads (the job's)."""
    record = read_json(compile_record)
    spec = Variant.from_json(record["variant"])
    catalogue = installed_catalogue()
    original = load_model(model, load_weights=False)
    compiled = load_compiled(compiled_model, load_weights=False)
    backend = backend_named(record["backend"])
    known = record.get("without_rules", {})  # the compile stage's own single-rule compiles
    without = {rule: decode_counts(known[rule]) if rule in known else signature_counts(
        compile_without(Path(model), spec, catalogue, backend, rule, threads).graph) for rule in record["fired_rules"]}
    log.info("%s: %d differential compiles, %d reused from the compile stage", spec.name,
             len(without) - len(set(known) & set(without)), len(set(known) & set(without)))
    write_json(graph_json, {"variant": spec.name, **describe(original.graph, compiled.graph, record["fired_rules"],
                                                               without)})


def describe(original: onnx.GraphProto, compiled: onnx.GraphProto, fired: list[str],
             without: Mapping[str, Counter[tuple[str, ...]]]) -> dict[str, Any]:
    """The body of graph.json; `without[rule]` is the node signature counts of the compiled graph with
    `rule` switched off."""
    absorbed = BoundaryMap(original, compiled)
    nodes = absorbed.compiled
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


def rule_claims(nodes: list[Node], fired: list[str],
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


def load_graph(path: Path) -> dict[str, Any]:
    try:
        return read_json(path)
    except (OSError, ValueError) as error:
        raise GraphError(f"{path}: cannot read graph JSON ({error}); delete it and re-run its stage") from None
