"""What the workflow will build for a configuration, and where: every stage's content-addressed path.

A stage's folder is named by a hash of what determines its files (model bytes, stage options, upstream
keys), so an unrelated change reuses it, reverting an option finds the old folder again, and two
configurations never collide. Computed once when Snakemake parses the workflow; also usable from Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect import ort_compile
from accubisect.accuracy import val_func_source
from accubisect.catalogue import installed_catalogue
from accubisect.compile_stage import Variant
from accubisect.config import validate_config
from accubisect.digest import DigestCache, stage_key
from accubisect.fusion_switch import load_fusion_switch
from accubisect.model import input_specs, load_model, output_specs
from accubisect.samples import Sample, check_samples, discover_samples

REFERENCE, CANDIDATE = "fusion_off", "fusion_on"


@dataclass(frozen=True)
class DumpJob:
    variant: str
    compile_key: str
    sample: Sample


@dataclass(frozen=True)
class Plan:
    config: dict[str, Any]
    model: Path
    samples: tuple[Sample, ...]
    output_names: tuple[str, ...]
    variants: dict[str, Variant]
    compile_keys: dict[str, str]  # variant name -> key
    dumps: dict[str, DumpJob]  # dump key -> job
    graph_keys: dict[str, str]  # variant name -> key
    compare_key: str

    @classmethod
    def from_config(cls, raw_config: dict[str, Any]) -> Plan:
        config = validate_config(raw_config)
        model = Path(config["model"])
        original = load_model(model, load_weights=False)
        samples = tuple(discover_samples(Path(config["samples"])))
        check_samples(list(samples), input_specs(original), output_specs(original))
        digests = DigestCache(Path(config["workspace"]) / ".digests.json")
        variants = build_variants(config)
        base = {"model": digests.sha256(model), "backend": config["backend"], "onnxruntime": ort_compile.ort_version()}
        compile_keys = {name: stage_key(stage="compile", variant=v.to_json(), **base) for name, v in variants.items()}
        dumps = {stage_key(stage="dump", compile=compile_keys[name], sample=digests.sha256(sample.inputs)):
                 DumpJob(name, compile_keys[name], sample) for name in variants for sample in samples}
        graph_keys = {name: stage_key(stage="graph", compile=key) for name, key in compile_keys.items()}
        golden = [digests.sha256(s.outputs) if s.outputs else None for s in samples]
        val_func = val_func_source(config["accuracy"]["val_func"])
        compare_key = stage_key(stage="compare", dumps=sorted(dumps), graphs=sorted(graph_keys.values()),
                                golden=golden, accuracy=config["accuracy"],
                                val_func=digests.sha256(val_func) if val_func else None)
        digests.save()
        return cls(config, model, samples, tuple(o.name for o in output_specs(original)), variants, compile_keys,
                   dumps, graph_keys, compare_key)

    @property
    def workspace(self) -> Path:
        return Path(self.config["workspace"])

    @property
    def results(self) -> Path:
        return Path(self.config["results"])

    def variant_of_compile(self, key: str) -> Variant:
        return next(self.variants[name] for name, k in self.compile_keys.items() if k == key)

    def variant_of_graph(self, key: str) -> str:
        return next(name for name, k in self.graph_keys.items() if k == key)

    def compile_dir(self, variant: str) -> Path:
        return self.workspace / "compile" / self.compile_keys[variant]

    def graph_json(self, variant: str) -> Path:
        return self.workspace / "graph" / self.graph_keys[variant] / "graph.json"

    def dump_path(self, variant: str, sample: Sample) -> Path:
        key = next(k for k, job in self.dumps.items() if job.variant == variant and job.sample == sample)
        return self.workspace / "dump" / key / "dump.h5"

    def dumps_of(self, variant: str) -> list[Path]:
        return [self.dump_path(variant, sample) for sample in self.samples]

    def compare_dir(self) -> Path:
        return self.workspace / "compare" / self.compare_key


def build_variants(config: dict[str, Any]) -> dict[str, Variant]:
    """fusion_off: nothing optimized. fusion_on: the configured level, less the rules the switch file turns off."""
    session_config = {key: str(value) for key, value in config["compile"]["session_config"].items()}
    switch = config["compile"]["fusion_switch"]
    rules_off = load_fusion_switch(Path(switch), installed_catalogue()) if switch else frozenset()
    return {
        REFERENCE: Variant(REFERENCE, "off", session_config),
        CANDIDATE: Variant(CANDIDATE, config["compile"]["level"], session_config, rules_off),
    }
