"""graph.json: every compiled node of one variant, the original nodes it absorbed and the rule that made it
(written by the graph stage, `stages/graph.py`), the nodes rules made inside subgraphs (If branches, Loop and
Scan bodies), and the sha256 of the user's model it was compiled from, so that a graph of another model is
refused where a comparison names its nodes. Format 1 had neither field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record, record_from

GRAPH_FORMAT = 2
KIND = "graph record"


@dataclass(frozen=True)
class GraphNode:
    """A compiled node."""

    index: int  # position in topological order
    name: str  # unique in the graph (`onnx_graph.unique_names`)
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    original_nodes: tuple[str, ...]  # the original nodes whose computation it replaced, in original order
    rule: str | None  # the rule that made it (the last of `rules` ORT applied), None for a node no rule made
    rules: tuple[str, ...]  # every fired rule without which it would not exist, in the order they fired
    precision: str = ""  # what its kernel computes in, where the backend says (OpenVINO's runtimePrecision)
    kernel: str = ""  # the kernel that ran it, where the backend says (OpenVINO's primitiveType: its ISA)

    def to_json(self) -> dict[str, Any]:
        runtime = {"precision": self.precision, "kernel": self.kernel} if self.precision or self.kernel else {}
        return {"index": self.index, "name": self.name, "op_type": self.op_type, "domain": self.domain,
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "original_nodes": list(self.original_nodes), "rule": self.rule, "rules": list(self.rules), **runtime}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GraphNode:
        return cls(data["index"], data["name"], data["op_type"], data["domain"], tuple(data["inputs"]),
                   tuple(data["outputs"]), tuple(data["original_nodes"]), data["rule"], tuple(data["rules"]),
                   data.get("precision", ""), data.get("kernel", ""))


@dataclass(frozen=True)
class NestedNode:
    """A compiled node inside a subgraph of a top-level compiled node, made by fired rules. graph.json's
    `nodes` are the top-level graph's; these are listed so that a rule's instances in an If branch count."""

    owner: str  # the top-level compiled node holding the subgraph
    subgraph: str  # the attribute path from the owner down, e.g. "then_branch" or "body/If_3/else_branch"
    index: int  # position in its subgraph's topological order
    name: str  # unique in its subgraph
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    rules: tuple[str, ...]  # every fired rule without which it would not exist, in the order they fired

    @property
    def original_nodes(self) -> tuple[str, ...]:
        """Not mapped inside subgraphs: what an instance there absorbed is not known."""
        return ()

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "subgraph": self.subgraph, "index": self.index, "name": self.name,
                "op_type": self.op_type, "domain": self.domain, "inputs": list(self.inputs),
                "outputs": list(self.outputs), "rules": list(self.rules)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NestedNode:
        return cls(data["owner"], data["subgraph"], data["index"], data["name"], data["op_type"], data["domain"],
                   tuple(data["inputs"]), tuple(data["outputs"]), tuple(data["rules"]))


@dataclass(frozen=True)
class GraphRecord:
    """graph.json."""

    variant: str  # fusion_off, fusion_on, ...
    fired_rules: tuple[str, ...]  # in the order ORT applied them
    nodes: tuple[GraphNode, ...]  # topological order
    eliminated_nodes: tuple[str, ...] = ()  # original nodes no compiled node stands for
    model_sha256: str = ""  # the user's model the variant was compiled from ("" only for a dump's own view)
    nested: tuple[NestedNode, ...] = ()  # nodes fired rules made inside subgraphs, in their owners' order

    @cached_property
    def by_name(self) -> dict[str, GraphNode]:
        return {node.name: node for node in self.nodes}

    def to_json(self) -> dict[str, Any]:
        return {"format": GRAPH_FORMAT, "model_sha256": self.model_sha256, "variant": self.variant,
                "fired_rules": list(self.fired_rules), "nodes": [node.to_json() for node in self.nodes],
                "eliminated_nodes": list(self.eliminated_nodes), "nested": [node.to_json() for node in self.nested]}

    @classmethod
    def from_json(cls, data: Any, source: str | Path) -> GraphRecord:
        """`data` read from `source` (named in the error when it is not a graph record of this version)."""
        return record_from(data, source, KIND, GRAPH_FORMAT, cls._build)

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> GraphRecord:
        return cls(data["variant"], tuple(data["fired_rules"]), tuple(GraphNode.from_json(n) for n in data["nodes"]),
                   tuple(data["eliminated_nodes"]), data["model_sha256"],
                   tuple(NestedNode.from_json(n) for n in data["nested"]))

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> GraphRecord:
        return read_record(path, KIND, GRAPH_FORMAT, cls._build)
