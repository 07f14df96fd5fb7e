"""The switchable fusion rules of one ONNX Runtime, as data: which ORT optimizer names a rule stands for,
which fusion_switch.cfg section it belongs to, and the check every rule name a user writes goes through.
`accubisect.runtime.catalogue` reads the installed ORT to build one.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from accubisect.core.errors import RuleError

GRAPH_FUSION = "GraphFusion"  # fusion_switch.cfg section of graph transformers
UB_FUSION = "UBFusion"  # fusion_switch.cfg section of rewrite rules
_LEVEL_COPY = re.compile(r"^(?P<family>\w+?)L\d$")


@dataclass(frozen=True)
class RuleCatalogue:
    transformers: tuple[str, ...]  # ORT names, in the order ORT runs them
    rewrite_rules: Mapping[str, tuple[str, ...]]  # rule-based transformer name -> its rewrite rules
    ort_version: str  # of the ONNX Runtime the names were read from, for error messages

    @functools.cached_property
    def _members(self) -> dict[str, tuple[str, ...]]:
        """Rule name -> the ORT optimizer names it stands for."""
        members: dict[str, list[str]] = {}
        for name in self.transformers:
            members.setdefault(self.rule_of(name), []).append(name)
        for rules in self.rewrite_rules.values():
            for rule in rules:
                members.setdefault(rule, [rule])
        return {rule: tuple(names) for rule, names in members.items()}

    def rule_of(self, ort_name: str) -> str:
        """The switchable rule an ORT optimizer name belongs to (`GeluFusionL2` -> `GeluFusion`)."""
        match = _LEVEL_COPY.match(ort_name)
        if match and match.group("family") not in self.transformers and ort_name in self.transformers:
            return match.group("family")
        return ort_name

    def section_of(self, rule: str) -> str:
        return UB_FUSION if any(rule in rules for rules in self.rewrite_rules.values()) else GRAPH_FUSION

    def rules(self, section: str | None = None) -> list[str]:
        return sorted(rule for rule in self._members if section is None or self.section_of(rule) == section)

    def ort_names(self, rules: set[str] | frozenset[str]) -> frozenset[str]:
        return frozenset(name for rule in rules for name in self._members[rule])

    def check(self, name: str, where: str, section: str | None = None) -> str:
        """Returns the rule called `name`, or fails with the closest valid names."""
        if name in self._members and self.rule_of(name) == name:
            if section is not None and self.section_of(name) != section:
                raise RuleError(f"{where}: '{name}' is a {self.section_of(name)} rule; move it to that section")
            return name
        if name in self.transformers:  # a per-level copy such as GeluFusionL2
            raise RuleError(f"{where}: '{name}' is one level of rule '{self.rule_of(name)}'; switch that rule")
        close = difflib.get_close_matches(name, self.rules(section), n=3, cutoff=0.0)
        raise RuleError(f"{where}: unknown fusion rule '{name}' for ONNX Runtime {self.ort_version}; "
                        f"closest: {', '.join(close)} (`accubisect rules MODEL` lists the rules that fire on a model)")

