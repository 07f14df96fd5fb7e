"""manifest.json, the first member of a bundle (`snakemake bundle` writes it, `accubisect reproduce` reads it):
what the bundled comparison was made from and with.

Its shape, and every other JSON member's, is data/bundle.schema.yaml, whose `format` constant is the
bundle layout's version: a bundle is data from elsewhere, so a reader checks the members against the schema
(`stages/bundle.py`) before it builds this record.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml


@functools.cache
def bundle_schema() -> dict[str, Any]:
    return yaml.safe_load(resources.files("accubisect").joinpath("data/bundle.schema.yaml").read_text())


BUNDLE_FORMAT = bundle_schema()["$defs"]["manifest"]["properties"]["format"]["const"]


@dataclass(frozen=True)
class BundleManifest:
    versions: Mapping[str, str]  # library -> version where the bundle was made
    model_sha256: str  # of the compared model's graph file (the model is not bundled)
    model_data_sha256: tuple[str, ...]  # of each external data file, in the order the model names them
    config: Mapping[str, Any]  # the validated workflow config
    samples: tuple[str, ...]
    output_names: tuple[str, ...]
    golden: tuple[bool, ...]  # per sample: whether its golden outputs are bundled

    def to_json(self) -> dict[str, Any]:
        return {"format": BUNDLE_FORMAT, "versions": dict(self.versions), "model_sha256": self.model_sha256,
                "model_data_sha256": list(self.model_data_sha256), "config": dict(self.config),
                "samples": list(self.samples), "output_names": list(self.output_names), "golden": list(self.golden)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BundleManifest:
        """`data` already checked against the schema."""
        return cls(dict(data["versions"]), data["model_sha256"], tuple(data["model_data_sha256"]),
                   dict(data["config"]), tuple(data["samples"]), tuple(data["output_names"]), tuple(data["golden"]))
