"""What the workflow will build for a configuration, and where: every stage's content-addressed path.

A stage's folder, `<workspace>/<stage>/<key>/` (formats/paths.py), is named by a hash of what determines its
files (model bytes, stage options, upstream keys), so an unrelated change reuses it, reverting an option finds
the old folder again, and two configurations never collide. `Plan.from_config`, run once when Snakemake parses
the workflow (also usable from Python), takes three steps:

1. `preflight(config)`: the configuration checked against this installation and the disk (session config
   keys, rule names, the mixlist and op types, the output folders, the backend), before anything is read;
2. `read_inputs(config)`: all the reading: the model and the samples (checked against each other), the
   fusion switch file, and the digest of every file a key names, as one frozen `Inputs` record;
3. `Plan.build(config, inputs)`: pure: every stage key and path from the validated config and the inputs.
   It touches no file, so the cache contract (which change re-keys which stage) is a table test over
   made-up digests (tests/workflow/test_cache_contract.py, docs/caching.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.bisection.search import check_budget
from accubisect.core.errors import ConfigError
from accubisect.core.precision import check_op_types
from accubisect.formats.compile_record import Variant
from accubisect.formats.config import validate_config
from accubisect.formats.digest import DigestCache, stage_key
from accubisect.formats.fusion_switch import load_fusion_switch
from accubisect.formats.linked_weights import WEIGHTS_FOLDER_LAYOUT
from accubisect.formats.mixlist import load_mixlist
from accubisect.formats.model import external_data_files, input_specs, load_graph, model_bytes, output_specs
from accubisect.formats.paths import digests_file, stage_dir, stage_root
from accubisect.formats.samples import Sample, check_distinct, check_samples, discover_samples, select_samples
from accubisect.formats.val_func import val_func_source
from accubisect.formats.verdict import VerdictStore
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import (
    DEPLOYABLE,
    FUSION_RULES,
    KEEP_FP32,
    LOCAL_ERRORS,
    PRECISION_MODES,
    Backend,
    OrtBackend,
    VariantPair,
    backend_named,
)
from accubisect.runtime.catalogue import installed_catalogue
from accubisect.runtime.host import cpu_signature
from accubisect.runtime.op_schema import known_op_types
from accubisect.runtime.session_config import check_session_config
from accubisect.workflow.resources import search_resources, stage_resources

REFERENCE, CANDIDATE, REDUCED = "fusion_off", "fusion_on", "reduced"
# rule -> the optional capability of the backend contract its jobs use; other rules use only its core
RULE_NEEDS = {"fusion_search": FUSION_RULES, "fusion_instances": FUSION_RULES, "reduce_search": FUSION_RULES,
              "fusion_local_errors": LOCAL_ERRORS, "local_errors": LOCAL_ERRORS, "assign_precision": PRECISION_MODES,
              "precision_search": KEEP_FP32, "precision_deploy": DEPLOYABLE}


@dataclass(frozen=True)
class Inputs:
    """What a plan reads from disk and the host: the digest of every file a stage key names, and the few
    facts about those files the plan needs besides. `read_inputs` builds it; tests make it up."""

    model: Path
    model_sha256: str
    model_bytes: int
    output_names: tuple[str, ...]
    samples: tuple[Sample, ...]  # the selected ones (dump.samples), in index order
    inputs_sha256: tuple[str, ...]  # per sample, of its inputs file
    golden_sha256: tuple[str | None, ...]  # per sample, of its golden outputs file; None where it has none
    largest_sample_bytes: int  # the largest inputs file's size (cluster resources)
    rules_off: frozenset[str]  # the rules compile.fusion_switch sets off
    mixlist_sha256: str | None  # of precision.modify_mixlist, if set
    val_func_sha256: str | None  # of the file defining accuracy.val_func, if set
    onnxruntime: str  # the installed version
    cpu: str  # host.cpu_signature(): what a level-`all` graph's key names
    shape_warning: str = ""  # golden outputs shaped otherwise than the model declares (a hint): the line to print
    data_sha256: tuple[str, ...] = ()  # per external data file of the model, in the order it names them
    runtime: str = ""  # the backend's runtime and version, where that is not ONNX Runtime (openvino 2026.4.1)

    def __post_init__(self) -> None:
        if not len(self.samples) == len(self.inputs_sha256) == len(self.golden_sha256) > 0:
            raise ValueError(f"{len(self.samples)} samples, {len(self.inputs_sha256)} input digests and "
                             f"{len(self.golden_sha256)} golden digests: one of each per sample, at least one")


@dataclass(frozen=True)
class DumpJob:
    variant: str
    model: Path  # the graph the dump runs
    compile_record: Path  # how it was compiled (a level-all graph must be dumped on its kind of CPU)
    sample: Sample


@dataclass(frozen=True)
class Comparison:
    """Two variants' dumps compared: fusion (fusion-off vs fusion-on) or precision (fp32 vs reduced)."""

    name: str
    reference: str
    candidate: str
    low_precision: str
    labels: tuple[str, str]  # how the report names the reference and the candidate


@dataclass(frozen=True)
class Plan:
    config: dict[str, Any]
    inputs: Inputs
    variants: Mapping[str, Variant]
    compile_keys: Mapping[str, str]  # variant name -> key
    dumps: Mapping[str, DumpJob]  # dump key -> job
    graph_keys: Mapping[str, str]  # variant name -> key
    comparisons: Mapping[str, Comparison]  # compare key -> comparison
    local_key: str  # the fusion comparison's local errors (the precision one's live in the precision folder)
    precision_key: str
    probe_base: Mapping[str, Any]  # what every bisection probe's key shares
    bisect_key: str
    precision_bisect_key: str

    @classmethod
    def from_config(cls, raw_config: dict[str, Any]) -> Plan:
        config = validate_config(raw_config)
        preflight(config)
        return cls.build(config, read_inputs(config))

    @classmethod
    def build(cls, config: dict[str, Any], inputs: Inputs) -> Plan:
        """Every stage key and path, from a validated config and what was read. Pure: it touches no file."""
        variants = build_variants(config, inputs.rules_off)
        base = key_base(config, inputs)
        compile_keys = {name: compile_key(variant, base, inputs.cpu) for name, variant in variants.items()}
        workspace = config["workspace"]
        compiled = {name: stage_dir(workspace, "compile", key) for name, key in compile_keys.items()}
        options = dump_options(config)
        dumps = {stage_key(stage="dump", compile=compile_keys[name], sample=sha, options=options):
                 DumpJob(name, compiled[name] / "model.onnx", compiled[name] / "compile.json", sample)
                 for name in variants for sample, sha in sample_digests(inputs)}
        graph_keys = {name: stage_key(stage="graph", compile=key) for name, key in compile_keys.items()}
        assigned_on = precision_base(config)
        precision_key = stage_key(stage="precision", compile=compile_keys[assigned_on], precision=config["precision"],
                                  mixlist=inputs.mixlist_sha256, sample=inputs.inputs_sha256[0])
        reduced = stage_dir(workspace, "precision", precision_key) / "model.onnx"
        dumps.update({stage_key(stage="dump", precision=precision_key, sample=sha, options=options):
                      DumpJob(REDUCED, reduced, compiled[assigned_on] / "compile.json", sample)
                      for sample, sha in sample_digests(inputs)})
        comparisons = plan_comparisons(config, inputs, dumps, sorted(graph_keys.values()), assigned_on)
        compare_key = {comparison.name: key for key, comparison in comparisons.items()}
        reference_dumps = sorted(k for k, job in dumps.items() if job.variant == REFERENCE)
        local_key = stage_key(stage="local", compile=compile_keys[CANDIDATE], dumps=reference_dumps)
        probe_base = probe_key_base(config, inputs, base, dumps)
        bisect_key = stage_key(stage="fusion_bisect", compare=compare_key["fusion"], bisect=config["bisect"],
                               variant=variants[CANDIDATE].to_json(), **probe_base)
        budget = {key: config["bisect"][key] for key in ("parallel", "max_probes", "max_minutes")}
        precision_bisect_key = stage_key(stage="precision_bisect", compare=compare_key["precision"], bisect=budget,
                                         precision=precision_key, **probe_base)
        return cls(config, inputs, variants, compile_keys, dumps, graph_keys, comparisons, local_key, precision_key,
                   probe_base, bisect_key, precision_bisect_key)

    def keys(self) -> dict[str, str]:
        """Every stage folder this configuration uses, by name: its key. A name starts with its stage (the
        folder is `paths.stage_dir(workspace, stage, key)`), then says which variant, comparison or sample.
        A bisection's probes are not listed: their keys come from `verdict_store`, `instance_store` and
        `reduce_store`."""
        return {**{f"compile {name}": key for name, key in self.compile_keys.items()},
                **{f"graph {name}": key for name, key in self.graph_keys.items()},
                **{f"dump {job.variant} {job.sample.name}": key for key, job in self.dumps.items()},
                **{f"compare {comparison.name}": key for key, comparison in self.comparisons.items()},
                "local fusion": self.local_key, "precision": self.precision_key,
                "bundle": self.compare_key("fusion"), "fusion_bisect": self.bisect_key,
                "precision_bisect": self.precision_bisect_key, "reduce": self.reduce_dir().name}

    @property
    def model(self) -> Path:
        return self.inputs.model

    @property
    def samples(self) -> tuple[Sample, ...]:
        return self.inputs.samples

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.inputs.output_names

    @property
    def model_sha256(self) -> str:
        return self.inputs.model_sha256

    @property
    def backend(self) -> Backend:
        return backend_named(self.config["backend"])

    @property
    def sample_inputs(self) -> list[Path]:
        return [sample.inputs for sample in self.samples]

    @property
    def sample_names(self) -> list[str]:
        return [sample.name for sample in self.samples]

    @property
    def golden_files(self) -> list[str]:
        """Per sample, its golden outputs file, or "" where it has none."""
        return [str(sample.outputs) if sample.outputs else "" for sample in self.samples]

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
        return stage_dir(self.workspace, "compile", self.compile_keys[variant])

    def graph_json(self, variant: str) -> Path:
        return stage_dir(self.workspace, "graph", self.graph_keys[variant]) / "graph.json"

    def dump_path(self, variant: str, sample: Sample) -> Path:
        key = next(k for k, job in self.dumps.items() if job.variant == variant and job.sample == sample)
        return stage_dir(self.workspace, "dump", key) / "dump.h5"

    def dumps_of(self, variant: str) -> list[Path]:
        return [self.dump_path(variant, sample) for sample in self.samples]

    def compare_key(self, name: str = "fusion") -> str:
        return next(key for key, comparison in self.comparisons.items() if comparison.name == name)

    def compare_dir(self, name: str = "fusion") -> Path:
        return stage_dir(self.workspace, "compare", self.compare_key(name))

    def bundle_dir(self) -> Path:
        """The fusion comparison's bundle, keyed as the comparison it packs."""
        return stage_dir(self.workspace, "bundle", self.compare_key("fusion"))

    def graph_of(self, variant: str) -> Path:
        """The graph JSON that names the nodes of a variant's dumps (the reduced model keeps fusion-on's)."""
        return self.graph_json(self.precision_base if variant == REDUCED else variant)

    @property
    def precision_base(self) -> str:
        """The variant whose graph precision is assigned on."""
        return precision_base(self.config)

    def precision_dir(self) -> Path:
        return stage_dir(self.workspace, "precision", self.precision_key)

    def local_errors_json(self, comparison: str) -> Path:
        """Where a comparison's local errors are: each candidate node run alone on the reference's tensors."""
        if comparison == "precision":
            return self.precision_dir() / "local.json"
        return stage_dir(self.workspace, "local", self.local_key) / "local.json"

    def compare_inputs(self, key: str) -> dict[str, Any]:
        """The files a comparison reads, by name, for the compare rule: the user's model too (node_data.json
        names its nodes), and for the precision comparison the assignment (its page marks each node's
        precision)."""
        comparison = self.comparisons[key]
        assignment = {"assignment": self.precision_dir() / "assignment.json"} if comparison.name == "precision" else {}
        # a backend that cannot run a node alone measures no local error
        local = ({"local_errors": self.local_errors_json(comparison.name)}
                 if LOCAL_ERRORS in self.backend.capabilities else {})
        return {
            "reference_dumps": self.dumps_of(comparison.reference),
            "candidate_dumps": self.dumps_of(comparison.candidate),
            "candidate_graph": self.graph_of(comparison.candidate),
            "model": self.model,
            **local,
            **assignment,
        }

    def resources(self) -> dict[str, dict[str, int]]:
        """Cluster resources per stage, from the sizes of the model and the largest sample."""
        stages = stage_resources(self.inputs.model_bytes, self.inputs.largest_sample_bytes, self.backend.gpus)
        bisect = self.config["bisect"]
        return {**stages, "search": search_resources(stages["probe"], bisect["parallel"], bisect["max_minutes"])}

    def references(self) -> list[Path]:
        """Per sample, what a probe's outputs are judged against: golden outputs, else the fusion-off dump."""
        return [s.outputs or self.dump_path(REFERENCE, s) for s in self.samples]

    def compared_with(self, key: str) -> list[str]:
        """The compiled models a dump is compared against, when it is only ever a comparison's candidate (no
        comparison's reference, nor the graph precision is assigned on, whose dumps local errors read
        whole): the dump keeps only the tensors they also have. Otherwise none: it keeps every chosen one."""
        variant = self.dumps[key].variant
        comparisons = self.comparisons.values()
        if variant == self.precision_base or any(c.reference == variant for c in comparisons):
            return []
        return sorted({str(self.compile_dir(c.reference) / "model.onnx") for c in comparisons
                       if c.candidate == variant})

    def verdict_store(self, kind: str = "fusion") -> VerdictStore:
        """Where a bisection's probes keep their verdicts: kind "fusion" (rules switched off on top of the
        fusion-on variant), "precision" (nodes kept in fp32) or "deployable" (the deploy job's: nodes of the
        user's model kept in fp32, beside the precision search's; its key names what the deploy verdict checks,
        so verdicts judged before the low-type range check are not read as its own)."""
        if kind == "deployable":
            precision = self.verdict_store("precision")
            checks = "low-type range, model.onnx and keep_dtype.txt"
            return VerdictStore(precision.root, {**precision.key, "probe": checks})
        if kind == "precision":
            return VerdictStore(stage_root(self.workspace, "precision_probe"),
                                {"stage": "precision_probe", "precision": self.precision_key, **self.probe_base})
        candidate = self.variants[CANDIDATE]
        # a level-`all` probe compiles CPU-specific kernels (NCHWc), so its verdict holds on this kind of CPU only
        cpu = {"cpu": self.inputs.cpu} if candidate.level == "all" else {}
        return VerdictStore(stage_root(self.workspace, "probe"),
                            {"stage": "probe", "variant": candidate.to_json(), **cpu, **self.probe_base})

    def openvino_store(self, level: str) -> VerdictStore:
        """Where an OpenVINO search keeps its probes' verdicts: level "precision" (executed nodes kept in f32 in
        precision.dtype), "rule" (switches off) or "instance" (barriers on fused nodes). The plugin picks its
        kernels for this CPU, so a verdict holds on this kind of CPU only; the OpenVINO version is the base's."""
        stage = {"precision": "precision_probe", "rule": "probe", "instance": "instance_probe"}[level]
        dtype = {"dtype": self.config["precision"]["dtype"]} if level == "precision" else {}
        return VerdictStore(stage_root(self.workspace, stage),
                            {"stage": stage, "openvino": level, **dtype, "cpu": self.inputs.cpu, **self.probe_base})

    def bisect_dir(self, kind: str = "fusion") -> Path:
        """A bisection's search record and results: kind "fusion" or "precision"."""
        if kind == "precision":
            return stage_dir(self.workspace, "precision_bisect", self.precision_bisect_key)
        return stage_dir(self.workspace, "fusion_bisect", self.bisect_key)

    def instance_store(self) -> VerdictStore:
        """Where fusion_instances keeps its probes' verdicts: hybrids of the fusion-on graph (its compile and
        graph keys) with chosen fused instances reverted, judged as every bisection probe is."""
        return VerdictStore(stage_root(self.workspace, "instance_probe"),
                            {"stage": "instance_probe", "compile": self.compile_keys[CANDIDATE],
                             "graph": self.graph_keys[CANDIDATE], "weights_layout": WEIGHTS_FOLDER_LAYOUT,
                             **self.probe_base})


    def refusal(self, rules: Iterable[str]) -> str:
        """The line refusing a run whose jobs (of `rules`) need a capability the backend lacks, or "": said
        before any job runs, not as a failed job."""
        backend = self.backend
        for rule in sorted(set(rules) & set(RULE_NEEDS)):
            if RULE_NEEDS[rule] not in backend.capabilities:
                return (f"backend: {backend.name} has no {RULE_NEEDS[rule]}, which rule {rule} needs; on "
                        f"{backend.name} run the targets compile, graph, dump, compare, fusion_bisect or "
                        f"precision_bisect (docs/backends.md), or use backend: ort-cpu")
        return ""

    @property
    def reduce_kind(self) -> str:
        """The candidate `snakemake reduce` cuts down: "fusion" or "precision" (config `reduce.bisection`)."""
        return self.config["reduce"]["bisection"]

    def reduce_variant(self) -> Variant:
        """How the candidate reduce cuts down compiles: fusion-on, or the variant precision is assigned on."""
        return self.variants[CANDIDATE if self.reduce_kind == "fusion" else self.precision_base]

    def reduce_store(self) -> VerdictStore:
        """Where reduce keeps its probes' verdicts: subgraphs of the original model compiled as the candidate
        (for precision, with the precision stage's assignment), judged on the reference's own tensors, as
        written and with the answer of the bisection (its key) applied."""
        variant = self.reduce_variant()
        cpu = {"cpu": self.inputs.cpu} if variant.level == "all" else {}
        precision = {"precision": self.precision_key} if self.reduce_kind == "precision" else {}
        return VerdictStore(stage_root(self.workspace, "reduce_probe"),
                            {"stage": "reduce_probe", "bisection": self.reduce_kind, "variant": variant.to_json(),
                             "answer": self.bisect_dir(self.reduce_kind).name, **precision, **cpu, **self.probe_base})

    def reduce_dir(self) -> Path:
        """The repro's files, keyed by the comparison it starts from and what its probes share (the answer's
        bisection among it)."""
        key = stage_key(stage="reduce", compare=self.compare_key(self.reduce_kind), reduce=self.config["reduce"],
                        probes=self.reduce_store().to_json()["key"])
        return stage_dir(self.workspace, "reduce", key)

    def reduce_inputs(self) -> dict[str, Any]:
        """The files the reduce job reads, by name: the answer that must fix the repro, and for precision the
        assignment and the graph it was made on. A backend without fusion rules has no fusion answer (its
        fusion_bisect writes none): the job is then refused before it runs (`refusal`)."""
        kind = self.reduce_kind
        files: dict[str, Any] = {"model": self.model, "compare_report": self.compare_dir(kind) / "report.json",
                                 "sample_inputs": self.sample_inputs, "reference_dumps": self.dumps_of(REFERENCE)}
        if kind == "fusion":
            has_rules = FUSION_RULES in self.backend.capabilities
            return {**files, **({"answer": self.bisect_dir("fusion") / "fusion_switch.cfg"} if has_rules else {})}
        return {**files, "answer": self.bisect_dir("precision") / "keep_dtype.txt",
                "assignment": self.precision_dir() / "assignment.json",
                "graph_json": self.graph_json(self.precision_base)}


def key_base(config: dict[str, Any], inputs: Inputs) -> dict[str, Any]:
    """What every compile key shares: the model (and its external data: none for a model saved whole), the
    backend and ORT, and the runtime of a backend other than ONNX Runtime's."""
    data = {"model_data": list(inputs.data_sha256)} if inputs.data_sha256 else {}
    runtime = {"runtime": inputs.runtime} if inputs.runtime else {}
    return {"model": inputs.model_sha256, **data, "backend": config["backend"], "onnxruntime": inputs.onnxruntime,
            **runtime}


def sample_digests(inputs: Inputs) -> list[tuple[str, str]]:
    """Each sample's name with the digest of its inputs, which its dumps' keys name."""
    return list(zip(inputs.samples, inputs.inputs_sha256, strict=True))


def plan_comparisons(config: dict[str, Any], inputs: Inputs, dumps: Mapping[str, DumpJob], graph_keys: list[str],
                     assigned_on: str) -> dict[str, Comparison]:
    """The fusion and precision comparisons by their compare key: the dumps of their two sides, every graph,
    the golden outputs and the check decide it."""
    precision = config["precision"]
    pair = variant_pair(config)  # the backend's: on OpenVINO, f32 against the reduced type
    first_low = pair.reduced or config["compare"]["low_precision"]
    comparisons = {}
    for comparison in (Comparison("fusion", REFERENCE, CANDIDATE, first_low, pair.labels),
                       Comparison("precision", assigned_on, REDUCED, precision["dtype"],
                                  ("fp32", f"{precision['dtype']} ({precision['mode']})"))):
        sides = (comparison.reference, comparison.candidate)
        chosen = sorted(k for k, job in dumps.items() if job.variant in sides)
        key = stage_key(stage="compare", dumps=chosen, graphs=graph_keys, golden=list(inputs.golden_sha256),
                        accuracy=config["accuracy"], val_func=inputs.val_func_sha256, comparison=comparison.name,
                        labels=comparison.labels, low_precision=comparison.low_precision)
        comparisons[key] = comparison
    return comparisons


def probe_key_base(config: dict[str, Any], inputs: Inputs, base: Mapping[str, Any],
                   dumps: Mapping[str, DumpJob]) -> dict[str, Any]:
    """What every bisection probe's key shares: the compile base, the samples, each sample's reference (its
    golden outputs, or the reference's dump) and the check."""
    dump_key = {(job.variant, job.sample): key for key, job in dumps.items()}
    references = [golden or dump_key[REFERENCE, sample]
                  for golden, sample in zip(inputs.golden_sha256, inputs.samples, strict=True)]
    return {**base, "samples": list(inputs.inputs_sha256), "references": references, "accuracy": config["accuracy"],
            "val_func": inputs.val_func_sha256}


def preflight(config: dict[str, Any]) -> None:
    """Checks of a validated configuration against this installation and the disk, before anything is read:
    each names the key to fix in one line."""
    check_backend(config)
    check_session_config(config["compile"]["session_config"])
    check_bisect_rules(config)
    check_budget(config["bisect"])
    check_precision(config)
    check_output_folders(config)


def check_backend(config: dict[str, Any]) -> None:
    """The backend is installed and runs the reduced type on this machine, and no key asks it for what it
    cannot do (a backend without fusion rules takes no rule names and no ONNX Runtime session entries)."""
    backend = backend_named(config["backend"])
    backend.check_installed()
    backend.check_dtype(config["precision"]["dtype"])
    if FUSION_RULES in backend.capabilities:
        return
    for key, value in (("compile.fusion_switch", config["compile"]["fusion_switch"]),
                       ("bisect.rules", config["bisect"]["rules"]),
                       ("compile.session_config", config["compile"]["session_config"])):
        if value:
            raise ConfigError(f"{key}: backend {backend.name} has no {FUSION_RULES} nor ONNX Runtime session "
                              f"entries; remove {key}, or use backend: ort-cpu")


def read_inputs(config: dict[str, Any]) -> Inputs:
    """Reads the model and the samples (refusing samples that do not fit the model, or repeat each other) and
    the fusion switch file, and hashes every file a key names (memoised in the workspace's digest file)."""
    model = Path(config["model"])
    original = load_graph(model)  # kilobytes, the model saved whole or not: no weight is read to plan
    data_files = tuple(path for path in external_data_files(original, model) if path != model)
    samples = tuple(select_samples(discover_samples(Path(config["samples"])), config["dump"]["samples"]))
    shape_warning = check_samples(list(samples), input_specs(original), output_specs(original))
    digests = DigestCache(digests_file(config["workspace"]))
    check_distinct(list(samples), digests.sha256)
    switch, mixlist = config["compile"]["fusion_switch"], config["precision"]["modify_mixlist"]
    val_func = val_func_source(config["accuracy"]["val_func"])
    inputs = Inputs(
        model=model,
        model_sha256=digests.sha256(model),
        model_bytes=model_bytes(original),
        output_names=tuple(spec.name for spec in output_specs(original)),
        samples=samples,
        inputs_sha256=tuple(digests.sha256(sample.inputs) for sample in samples),
        golden_sha256=tuple(digests.sha256(sample.outputs) if sample.outputs else None for sample in samples),
        largest_sample_bytes=max(sample.inputs.stat().st_size for sample in samples),
        rules_off=load_fusion_switch(Path(switch), installed_catalogue()) if switch else frozenset(),
        mixlist_sha256=digests.sha256(Path(mixlist)) if mixlist else None,
        val_func_sha256=digests.sha256(val_func) if val_func else None,
        onnxruntime=ort_compile.ort_version(),
        runtime="" if isinstance(backend := backend_named(config["backend"]), OrtBackend) else backend.version(),
        cpu=cpu_signature(),
        shape_warning=shape_warning,
        data_sha256=tuple(digests.sha256(path) for path in data_files),
    )
    digests.save()
    return inputs


def compile_key(variant: Variant, base: Mapping[str, Any], cpu: str) -> str:
    """Level-`all` graphs hold CPU-specific kernels and layouts, so their key names the instruction set;
    other levels are portable and shared across machines."""
    return stage_key(stage="compile", variant=variant.to_json(), cpu=cpu if variant.level == "all" else None, **base)


def dump_options(config: dict[str, Any]) -> dict[str, Any]:
    """What shapes a dump file; the sample selection only chooses which dumps there are."""
    return {key: value for key, value in config["dump"].items() if key != "samples"}


def precision_base(config: dict[str, Any]) -> str:
    return REFERENCE if config["precision"]["graph"] == "original" else CANDIDATE


def check_output_folders(config: dict[str, Any]) -> None:
    """Caught here, a file where a folder belongs names its key; later it is an OS error deep in a job."""
    for key in ("workspace", "results"):
        path = Path(config[key])
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{key}: {path} is a file; set `{key}` to a folder (it is created if missing)")
    check_apart(Path(config["workspace"]), Path(config["results"]))


def check_apart(workspace: Path, results: Path) -> None:
    """Publishing replaces whole folders under `results` and pruning removes folders under `workspace`: in
    one folder, or one inside the other, each would delete the other's files."""
    inner, outer = workspace.resolve(), results.resolve()
    if inner == outer or inner.is_relative_to(outer) or outer.is_relative_to(inner):
        how = "are the same folder" if inner == outer else "are nested"
        raise ConfigError(f"workspace: {workspace} and results: {results} {how}; set them to two separate folders "
                          "(publishing replaces folders under results, pruning removes folders under workspace)")


def check_precision(config: dict[str, Any]) -> None:
    """The mixlist file and the device profile, before anything runs."""
    known = known_op_types()
    load_mixlist(config["precision"]["modify_mixlist"], known)
    check_op_types(config["precision"]["no_fp32_ops"], "precision.no_fp32_ops", known)


def check_bisect_rules(config: dict[str, Any]) -> None:
    for name in config["bisect"]["rules"] or []:
        installed_catalogue().check(name, "bisect.rules")


def build_variants(config: dict[str, Any], rules_off: frozenset[str] = frozenset()) -> dict[str, Variant]:
    """As the backend pairs them (`Backend.variant_pair`). On ONNX Runtime, fusion_off: nothing optimized;
    fusion_on: the configured level, less `rules_off` (the rules the fusion switch file turns off). On
    OpenVINO, f32 against the reduced type's precision hint."""
    session_config = {key: str(value) for key, value in config["compile"]["session_config"].items()}
    pair = variant_pair(config)
    return {
        REFERENCE: Variant(REFERENCE, pair.reference[0], {**session_config, **pair.reference[1]}),
        CANDIDATE: Variant(CANDIDATE, pair.candidate[0], {**session_config, **pair.candidate[1]}, rules_off),
    }


def variant_pair(config: dict[str, Any]) -> VariantPair:
    return backend_named(config["backend"]).variant_pair(config["compile"]["level"], config["precision"]["dtype"])
