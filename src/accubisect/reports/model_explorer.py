"""Node data for Google's Model Explorer: a comparison's error per ORIGINAL node, to overlay on the user's own
model (`ai-edge-model-explorer` with the `model-explorer-onnx` adapter; `accubisect explorer-data`).

The file is Model Explorer's graph-level node-data JSON (its `node_data_builder.GraphNodeData`: `name`,
`results` keyed by node id -> `{"value": ...}`, `thresholds`), which Model Explorer applies to the graph open
in its pane. The ONNX adapter's node ids are the model's node names made unique its own way (`adapter_ids`); ours
are `onnx_graph.unique_names`, which agree for every node named once. Given the model, `node_data` keys each
node by the adapter's id.

A node's value is its compiled node's error as the HTML graph view shows it (`graph_view.node_error`: the
local error where measured, else the worst relative error of its outputs), so the nodes a fused node
absorbed all carry the fused node's value; a node several compiled nodes stand for carries their worst.
Values are coloured by decade on the graph view's scale (thresholds); NaN and inf, which JSON cannot hold,
become the largest float with the view's NaN colour.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from typing import Any

import onnx

from accubisect.core.metrics import worst_value
from accubisect.core.onnx_graph import topological_order, unique_names
from accubisect.formats.compare_report import CompareReport
from accubisect.reports.graph_view import NOT_FINITE, SCALE_HIGH, SCALE_LOW, boxes_of, error_colour, node_error

NOT_FINITE_VALUE = sys.float_info.max  # JSON has no NaN or inf


def original_errors(report: CompareReport) -> dict[str, float]:
    """Original node name -> the error of the compiled node that absorbed it (the worst, NaN first, where
    several did); nodes no compared tensor stands for are left out."""
    values: dict[str, list[float]] = {}
    for box in boxes_of(report).values():
        value, _ = node_error([report.tensors[p] for p in box.rows])
        if value is not None:
            for name in box.original_nodes:
                values.setdefault(name, []).append(value)
    return {name: worst_value(found, "rel_euclidean") for name, found in values.items()}


def adapter_ids(model: onnx.ModelProto) -> dict[str, str]:
    """Our name of each node of the model's main graph -> the id Model Explorer's ONNX adapter gives it: the
    node's name made unique as onnx_ir's NameFixPass makes it (the adapter's first pass): in file order, depth
    first through subgraphs, an unnamed node is "node", a name already used in its graph gets `_1`, `_2`, ...
    from one counter per name shared by every graph."""
    counter: Counter[str] = Counter()
    main: list[str] = []

    def walk(graph: onnx.GraphProto, ids: list[str]) -> None:
        used: set[str] = set()
        for node in graph.node:
            preferred = name = node.name or "node"
            while name in used:
                counter[preferred] += 1
                name = f"{preferred}_{counter[preferred]}"
            used.add(name)
            ids.append(name)
            for attribute in node.attribute:
                for subgraph in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                    walk(subgraph, [])

    walk(model.graph, main)
    position = {tuple(node.output): i for i, node in enumerate(model.graph.node)}
    protos = topological_order(model.graph)
    return {ours: main[position[tuple(proto.output)]] for ours, proto in zip(unique_names(protos), protos, strict=True)}


def node_data(report: CompareReport, model: onnx.ModelProto | None = None) -> dict[str, Any]:
    """Model Explorer graph node data of `report`, keyed by original node name, or, given the original
    `model`, by the adapter's node ids."""
    ids = adapter_ids(model) if model is not None else {}
    results: dict[str, dict[str, Any]] = {}
    for name, value in original_errors(report).items():
        key = ids.get(name, name)
        if math.isfinite(value):
            result = {"value": value}
        else:
            result = {"value": NOT_FINITE_VALUE, "bgColor": NOT_FINITE}
        if key not in results or result["value"] > results[key]["value"]:
            results[key] = result
    thresholds = [{"value": 10.0**decade, "bgColor": error_colour(10.0 ** (decade - 0.5))}
                  for decade in range(SCALE_LOW, SCALE_HIGH + 1)]
    thresholds.append({"value": NOT_FINITE_VALUE, "bgColor": error_colour(10.0**SCALE_HIGH)})
    return {"name": f"{report.candidate} vs {report.reference}: relative error", "results": results,
            "thresholds": thresholds}
