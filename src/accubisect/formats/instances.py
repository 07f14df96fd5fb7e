"""instances.json: which fused instances of each culprit rule break accuracy (written by `fusion_instances`,
`bisection/instances.py`).

An instance is one occurrence of a fusion in the fusion-on graph (`core/hybrid.py`): the compiled nodes that
stand for the same original nodes. Its verdict comes from a search over hybrids of the fusion-on graph in
which chosen instances are reverted to the original nodes they absorbed; the hybrid that reverts exactly
the instances that break accuracy is `hybrid.onnx`. When no hybrid passes (reverting every revertable
instance still fails, a budget ran out first, or the chosen hybrid fails when run again), `hybrid.fallback`
says why and hybrid.onnx is the rule-level answer instead: the fusion-on graph compiled with the culprit rules
off (`hybrid.rules_off`). Files written before that field existed read as having no fallback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record

INSTANCES_FORMAT = 1
KIND = "record of fused instances"


@dataclass(frozen=True)
class InstanceEntry:
    """One instance of a culprit rule."""

    name: str  # its main fused (compiled) node
    fused_nodes: tuple[str, ...]  # every compiled node of it
    original_nodes: tuple[str, ...]  # what it absorbed
    rules: tuple[str, ...]  # every rule its nodes need
    local_error: float | None  # the largest local error of its nodes (None: not measured)
    not_revertable: str | None  # why it cannot be reverted alone; None if it can
    breaks: bool | None  # reverted in the answer; None where it cannot be reverted (not searched)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "fused_nodes": list(self.fused_nodes), "original_nodes": list(self.original_nodes),
                "rules": list(self.rules), "local_error": self.local_error, "not_revertable": self.not_revertable,
                "breaks": self.breaks}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InstanceEntry:
        return cls(data["name"], tuple(data["fused_nodes"]), tuple(data["original_nodes"]), tuple(data["rules"]),
                   data["local_error"], data["not_revertable"], data["breaks"])


@dataclass(frozen=True)
class InstancesRecord:
    """instances.json."""

    culprit_rules: tuple[str, ...]  # fusion_bisect's culprits
    instances: tuple[InstanceEntry, ...]  # of any culprit rule, in topological order
    search: Mapping[str, Any]  # the instance search: status, ranking, probes, culprits, stopped_by, minimal
    hybrid: Mapping[str, Any]  # hybrid.onnx: reverted (instance names), passed, samples_passed, worst; fallback

    @property
    def fallback(self) -> str | None:
        """Why no hybrid of reverted instances passes, so hybrid.onnx is the rule-level answer; None if one does."""
        return self.hybrid.get("fallback")

    def of_rule(self, rule: str) -> list[InstanceEntry]:
        return [instance for instance in self.instances if rule in instance.rules]

    def rules_view(self) -> dict[str, dict[str, Any]]:
        """Rule -> its instances (fused node -> original nodes), those that break accuracy and their count."""
        return {rule: {"instances": len(self.of_rule(rule)),
                       "break": [i.name for i in self.of_rule(rule) if i.breaks],
                       "not_revertable": [i.name for i in self.of_rule(rule) if i.not_revertable],
                       "fused_nodes": {i.name: {node: list(i.original_nodes) for node in i.fused_nodes}
                                       for i in self.of_rule(rule)}}
                for rule in self.culprit_rules}

    def summary_lines(self) -> list[str]:
        """Per culprit rule: "rule R: k of n instances break accuracy", and which (under a budget that ran out:
        "reverting k of n instances passes"; with no hybrid that passes: what is known of its instances)."""
        if not self.culprit_rules:
            return ["no culprit rules: fusion_bisect switched no rule off, so no instance is searched"]
        lines = []
        for rule in self.culprit_rules:
            instances = self.of_rule(rule)
            stuck = [i.name for i in instances if i.not_revertable]
            if self.fallback:
                lines.append(f"rule {rule}: which of its {len(instances)} instances break accuracy is not known"
                             + (f" ({len(stuck)} cannot be reverted alone: {', '.join(stuck)})" if stuck else ""))
                continue
            breaking = [i.name for i in instances if i.breaks]
            verb = "breaks" if len(breaking) == 1 else "break"
            line = (f"rule {rule}: {len(breaking)} of {len(instances)} instances {verb} accuracy"
                    if self.search["minimal"] else
                    f"rule {rule}: reverting {len(breaking)} of {len(instances)} instances passes (not proven minimal)")
            line += f": {', '.join(breaking)}" if breaking else ""
            if stuck:
                line += f" ({len(stuck)} cannot be reverted alone and stay fused: {', '.join(stuck)})"
            lines.append(line)
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"format": INSTANCES_FORMAT, "culprit_rules": list(self.culprit_rules), "rules": self.rules_view(),
                "instances": [instance.to_json() for instance in self.instances], "search": dict(self.search),
                "hybrid": dict(self.hybrid)}

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> InstancesRecord:
        return cls(tuple(data["culprit_rules"]), tuple(InstanceEntry.from_json(i) for i in data["instances"]),
                   data["search"], data["hybrid"])

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> InstancesRecord:
        return read_record(path, KIND, INSTANCES_FORMAT, cls._build)
