"""compile.json: how one variant was compiled and the rules that fired.

The variant is data here (its name, level, session entries and rules off); turning it into ORT's compile
options needs the rule catalogue and the runtime, so that lives in `runtime/catalogue.py`
(`compile_options`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record

COMPILE_FORMAT = 1
SignatureCounts = Counter[tuple[str, ...]]  # node signature -> how many nodes of a graph have it


@dataclass(frozen=True)
class Variant:
    name: str  # fusion_off, fusion_on, ...
    level: str  # off, basic, extended or all
    session_config: Mapping[str, str] = field(default_factory=dict)
    rules_off: frozenset[str] = frozenset()  # catalogue rule names

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "level": self.level, "session_config": dict(sorted(self.session_config.items())),
                "rules_off": sorted(self.rules_off)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Variant:
        return cls(data["name"], data["level"], dict(data["session_config"]), frozenset(data["rules_off"]))


@dataclass(frozen=True)
class CompileRecord:
    variant: Variant
    backend: str
    disabled_optimizers: tuple[str, ...]  # ORT names passed
    fired_rules: tuple[str, ...]  # in the order ORT applied them
    without_rules: Mapping[str, SignatureCounts]  # per rewrite rule the probe found: the graph compiled without it
    onnxruntime: str
    cpu: str  # `host.cpu_signature()` of the machine that compiled it
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"format": COMPILE_FORMAT, "variant": self.variant.to_json(), "backend": self.backend,
                "disabled_optimizers": list(self.disabled_optimizers), "fired_rules": list(self.fired_rules),
                "without_rules": {rule: encode_counts(counts) for rule, counts in self.without_rules.items()},
                "onnxruntime": self.onnxruntime, "cpu": self.cpu, "seconds": self.seconds}

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> CompileRecord:
        return cls(Variant.from_json(data["variant"]), data["backend"], tuple(data["disabled_optimizers"]),
                   tuple(data["fired_rules"]), {rule: decode_counts(c) for rule, c in data["without_rules"].items()},
                   data["onnxruntime"], data["cpu"], data["seconds"])

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> CompileRecord:
        return read_record(path, "compile record", COMPILE_FORMAT, cls._build)


def encode_counts(counts: SignatureCounts) -> list[list[Any]]:
    """Node signature counts as JSON: [[signature strings...], count] per signature, sorted."""
    return [[list(signature), count] for signature, count in sorted(counts.items())]


def decode_counts(encoded: list[list[Any]]) -> SignatureCounts:
    return Counter({tuple(signature): count for signature, count in encoded})
