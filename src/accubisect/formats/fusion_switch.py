"""The seeds' `fusion_switch.cfg`: which fusion rules are on and off.

    {"Switch": {"GraphFusion": {"MatMulAddFusion": "off", ...}, "UBFusion": {"ConvBNFusion": "off"}}}

`GraphFusion` holds ONNX Runtime graph transformers, `UBFusion` the rewrite rules inside its rule-based
transformers. `"ALL": "off"` switches a whole section off; names set `"on"` beside it stay on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from accubisect.core.errors import RuleError
from accubisect.core.rules import GRAPH_FUSION, UB_FUSION, RuleCatalogue
from accubisect.formats.files import write_json

SECTIONS = (GRAPH_FUSION, UB_FUSION)
EXPECTED = 'write it as {"Switch": {"GraphFusion": {"GeluApproximation": "off"}, "UBFusion": {}}}'


def load_fusion_switch(path: Path, catalogue: RuleCatalogue) -> frozenset[str]:
    """The rules `path` switches off."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise RuleError(f"{path}: fusion switch file not found; fix compile.fusion_switch") from None
    except ValueError as error:
        raise RuleError(f"{path}: not valid JSON ({error}); {EXPECTED}") from None
    return rules_switched_off(document, catalogue, str(path))


def write_fusion_switch(path: Path, rules_off: Iterable[str], catalogue: RuleCatalogue) -> None:
    """Writes the file that switches exactly `rules_off` off, each under its catalogue section (fusion_bisect's
    answer): the seeds' format, which has no version key, read back by `load_fusion_switch`."""
    sections: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for rule in sorted(rules_off):
        sections[catalogue.section_of(rule)][rule] = "off"
    write_json(path, {"Switch": sections})


def rules_switched_off(document: object, catalogue: RuleCatalogue, where: str) -> frozenset[str]:
    switch = document.get("Switch") if isinstance(document, dict) else None
    if not isinstance(switch, dict) or set(document) != {"Switch"}:
        raise RuleError(f"{where}: not a fusion switch file; {EXPECTED}")
    unknown = sorted(set(switch) - set(SECTIONS))
    if unknown:
        raise RuleError(f"{where}: unknown section(s) {unknown} under Switch; use {list(SECTIONS)}")
    off: set[str] = set()
    for section, states in switch.items():
        off |= _section_off(section, states, catalogue, f"{where}: Switch.{section}")
    return frozenset(off)


def _section_off(section: str, states: object, catalogue: RuleCatalogue, where: str) -> set[str]:
    if not isinstance(states, dict):
        raise RuleError(f'{where}: expected an object of rule names to "on" or "off"')
    for name, state in states.items():
        if state not in ("on", "off"):
            raise RuleError(f'{where}.{name}: "{state}" must be "on" or "off"')
    named = {catalogue.check(name, where, section): state for name, state in states.items() if name != "ALL"}
    base = set(catalogue.rules(section)) if states.get("ALL") == "off" else set()
    return (base | {rule for rule, state in named.items() if state == "off"}) - {
        rule for rule, state in named.items() if state == "on"
    }
