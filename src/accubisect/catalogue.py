"""The fusion rules of the installed ONNX Runtime, and the names a user may switch.

ORT's `disabled_optimizers` takes graph-transformer names and the names of rewrite rules inside its
rule-based transformers, and silently ignores any other name. So every name a user writes is checked here.

Graph transformers are read from the installed ORT itself: its verbose log names every transformer it
runs. Some come in per-level copies (`GeluFusionL1`, `GeluFusionL2`); the rule a user switches is the
family (`GeluFusion`), which stands for all its copies. Rewrite rules are never logged, so their names
come from ORT's sources for the installed version (`data/ort_rewrite_rules.yaml`).
"""

from __future__ import annotations

import difflib
import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

import onnx
import yaml

from accubisect import ort_compile
from accubisect.backends import CPU
from accubisect.errors import RuleError

log = logging.getLogger(__name__)

GRAPH_FUSION = "GraphFusion"  # fusion_switch.cfg section of graph transformers
UB_FUSION = "UBFusion"  # fusion_switch.cfg section of rewrite rules
_CONTAINER = re.compile(r"^Level\d+_RuleBasedTransformer$")
_LEVEL_COPY = re.compile(r"^(?P<family>\w+?)L\d$")


@dataclass(frozen=True)
class RuleCatalogue:
    transformers: tuple[str, ...]  # ORT names, in the order ORT runs them
    rewrite_rules: Mapping[str, tuple[str, ...]]  # rule-based transformer name -> its rewrite rules

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
        raise RuleError(f"{where}: unknown fusion rule '{name}' for ONNX Runtime {ort_compile.ort_version()}; "
                        f"closest: {', '.join(close)} (`accubisect rules MODEL` lists the rules that fire on a model)")


@functools.cache
def installed_catalogue() -> RuleCatalogue:
    """The catalogue of the ONNX Runtime this process imports."""
    probe = _probe_model()
    everything = ort_compile.compile_model(probe, _all_options(), CPU).ran
    required = set(ort_compile.compile_model(probe, ort_compile.CompileOptions("off"), CPU).ran)
    transformers = tuple(n for n in everything if n not in required and not _CONTAINER.match(n))
    return RuleCatalogue(transformers, _rewrite_rules(ort_compile.ort_version()))


def _all_options() -> ort_compile.CompileOptions:
    """Level `all` with every config entry that registers an extra transformer."""
    return ort_compile.CompileOptions("all", {"optimization.enable_gelu_approximation": "1"})


def _probe_model() -> bytes:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def _rewrite_rules(version: str) -> dict[str, tuple[str, ...]]:
    table = yaml.safe_load(resources.files("accubisect").joinpath("data/ort_rewrite_rules.yaml").read_text())
    minor = ".".join(version.split(".")[:2])
    if minor not in table:
        newest = max(table, key=lambda v: tuple(int(p) for p in v.split(".")))
        log.warning("no rewrite-rule list for ONNX Runtime %s; using the one of %s", version, newest)
        minor = newest
    return {container: tuple(rules) for container, rules in table[minor].items()}
