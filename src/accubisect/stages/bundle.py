"""A comparison packed to travel: `snakemake bundle` writes it, `accubisect reproduce` checks it elsewhere.

The archive holds what the comparison read — both variants' dumps for every sample, both graph JSONs,
the golden outputs, the `val_func` module if one judged the outputs — plus the validated config, the tool and
library versions, and the report it produced. The model itself is not bundled (the comparison reads only
its dumps and graphs, and a model may weigh gigabytes): it is named by reference, by the sha256 of its graph
file and of each of its external data files, the digests its stage keys are made of. Reproducing runs the
same comparison on the unpacked files and checks the new report equals the bundled one byte for byte.

A bundle comes from elsewhere, so it is data: its members and JSON files are checked against
data/bundle.schema.yaml and its config against the config schema before anything is used, and the
`val_func` module it holds runs only when the caller trusts the bundle (`--trust-bundle-code`).
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import reprlib
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema

from accubisect.core.accuracy import ValFunc
from accubisect.core.errors import AccubisectError, BundleError, ConfigError
from accubisect.formats.bundle_manifest import BUNDLE_FORMAT, BundleManifest, bundle_schema
from accubisect.formats.compare_report import CompareReport
from accubisect.formats.config import validate_config
from accubisect.formats.files import atomic_path, json_text
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.local_errors import LocalErrors
from accubisect.formats.step import Step
from accubisect.formats.val_func import val_func_source
from accubisect.stages.compare import Compared, build_report, with_local_errors

LIBRARIES = ("accubisect", "onnxruntime", "onnx", "numpy", "h5py")
JSON_MEMBERS = ("manifest.json", "report.json", "local.json", "graphs/candidate.json")
TRUST_FLAG = "--trust-bundle-code"


def versions() -> dict[str, str]:
    """By module, not by distribution: onnxruntime-gpu installs the `onnxruntime` module under another name."""
    return {name: importlib.import_module(name).__version__ for name in LIBRARIES}


@dataclass(frozen=True)
class BundleStep(Step):
    reference_dumps: tuple[Path, ...]
    candidate_dumps: tuple[Path, ...]
    reference_graph: Path
    candidate_graph: Path
    local_errors: Path
    report_json: Path
    golden: tuple[str, ...]  # per sample, "" where it has no golden outputs
    samples: tuple[str, ...]
    output_names: tuple[str, ...]
    config: Mapping[str, Any]  # the validated workflow config
    model_sha256: str  # of the graph file
    model_data_sha256: tuple[str, ...]  # of each external data file, in the order the model names them
    bundle: Path


def make_bundle(step: BundleStep) -> None:
    """Bundle stage: one .tar.gz with everything the comparison needs and the report it made."""
    members: dict[str, Path] = {"report.json": step.report_json, "graphs/reference.json": step.reference_graph,
                                "graphs/candidate.json": step.candidate_graph, "local.json": step.local_errors}
    for sample, ref, cand, truth in zip(step.samples, step.reference_dumps, step.candidate_dumps, step.golden,
                                        strict=True):
        members[f"dumps/reference/{sample}.h5"] = ref
        members[f"dumps/candidate/{sample}.h5"] = cand
        if truth:
            members[f"golden/{sample}_outputs.npz"] = Path(truth)
    val_func = val_func_source(step.config["accuracy"]["val_func"])
    if val_func is not None:
        members[f"val_func/{val_func.name}"] = val_func
    manifest = BundleManifest(versions(), step.model_sha256, step.model_data_sha256, step.config, step.samples,
                              step.output_names, tuple(bool(truth) for truth in step.golden))
    with atomic_path(step.bundle) as temporary, tarfile.open(temporary, "w:gz") as archive:
        _add_bytes(archive, "manifest.json", json.dumps(manifest.to_json(), indent=2).encode())
        for name, path in members.items():
            _add_bytes(archive, name, path.read_bytes())


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)  # mtime 0, owner root: the archive depends on the contents alone
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


@dataclass(frozen=True)
class Reproduction:
    matches: bool
    report: CompareReport
    difference: str  # the first place the reports differ, "" when they match
    versions: dict[str, tuple[str, str]]  # library -> (bundled, here), where they differ


def reproduce(bundle: Path, trust_code: bool = False) -> Reproduction:
    """Re-runs the bundled comparison on the unpacked files. A bundle is data: everything it holds is checked
    before use, and its `val_func` module (Python code) is run only when `trust_code` says so."""
    bundle = Path(bundle)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _unpack(bundle, root)
        files = {name: _read_member_json(bundle, root, name) for name in JSON_MEMBERS}
        manifest, bundled_report = _checked(bundle, files), files["report.json"]
        config = _bundled_config(bundle, manifest)
        samples = manifest.samples
        dumps = {side: tuple(Path(_member(bundle, root, f"dumps/{side}/{s}.h5")) for s in samples)
                 for side in ("reference", "candidate")}
        comparison = Compared(dumps["reference"], dumps["candidate"], tuple(_golden_members(bundle, root, manifest)),
                              samples, manifest.output_names, config["accuracy"],
                              bundled_report["low_precision"], (bundled_report["reference"],
                                                                bundled_report["candidate"]))
        graph = _in_bundle(bundle, root, GraphRecord.from_json, files["graphs/candidate.json"],
                           root / "graphs/candidate.json")
        local = _in_bundle(bundle, root, LocalErrors.from_json, files["local.json"], root / "local.json")
        val_func = _bundled_val_func(bundle, root, config["accuracy"]["val_func"], trust_code)
        report = with_local_errors(_in_bundle(bundle, root, build_report, comparison, graph, val_func), local)
        bundled = (root / "report.json").read_bytes()
    produced = json_text(report.to_json()).encode()
    here = versions()
    changed = {k: (v, here.get(k, "?")) for k, v in manifest.versions.items() if here.get(k) != v}
    difference = "" if produced == bundled else _first_difference(json.loads(bundled), report.to_json())
    return Reproduction(produced == bundled, report, difference, changed)


def _unpack(bundle: Path, root: Path) -> None:
    """Regular files and folders only: the `data` filter refuses paths and links that leave `root`, and a
    bundle `make_bundle` wrote holds no link at all, so any link is refused too."""
    try:
        with tarfile.open(bundle, "r:gz") as archive:
            links = [member.name for member in archive.getmembers() if not (member.isfile() or member.isdir())]
            if links:
                raise BundleError(f"{bundle}: member {links[0]!r} is a link or device; a bundle holds plain "
                                  "files only, so this one was not made by `snakemake bundle`")
            archive.extractall(root, filter="data")
    except (OSError, tarfile.TarError, EOFError) as error:
        raise BundleError(f"{bundle}: not a readable bundle ({_one_line(error)}); make one with "
                          "`snakemake bundle`") from None


def _read_member_json(bundle: Path, root: Path, name: str) -> Any:
    path = Path(_member(bundle, root, name))
    try:
        return json.loads(path.read_text())
    except ValueError as error:  # UnicodeDecodeError too
        raise BundleError(f"{bundle}: {name} is not JSON ({_one_line(error)}); the bundle is damaged, "
                          "make it again with `snakemake bundle`") from None


def _member(bundle: Path, root: Path, name: str) -> str:
    """The unpacked member's path; a member a manifest promises but the archive lacks fails here, not deep
    inside the comparison."""
    path = root / name
    if not path.is_file():
        raise BundleError(f"{bundle}: member {name} is missing; the bundle is incomplete, make it again with "
                          "`snakemake bundle`")
    return str(path)


def _checked(bundle: Path, files: Mapping[str, Any]) -> BundleManifest:
    """The bundle's manifest, once its JSON members fit the schema and its lists agree."""
    problem = shape_problem(files, None)
    if problem:
        raise BundleError(f"{bundle}: {problem}; this is not a bundle `snakemake bundle` (format {BUNDLE_FORMAT}) "
                          "wrote")
    manifest = BundleManifest.from_json(files["manifest.json"])
    if len(manifest.golden) != len(manifest.samples):
        raise BundleError(f"{bundle}: manifest.json.golden has {len(manifest.golden)} entries for "
                          f"{len(manifest.samples)} samples; make the bundle again with `snakemake bundle`")
    return manifest


def _bundled_config(bundle: Path, manifest: BundleManifest) -> dict[str, Any]:
    try:
        return validate_config(dict(manifest.config))
    except ConfigError as error:
        lines = (line.removeprefix("config: ") for line in str(error).splitlines())  # the config as a whole
        raise BundleError(f"{bundle}: manifest.json config: {'; '.join(lines)}") from None


def _golden_members(bundle: Path, root: Path, manifest: BundleManifest) -> list[str]:
    return [_member(bundle, root, f"golden/{sample}_outputs.npz") if has else ""
            for sample, has in zip(manifest.samples, manifest.golden, strict=True)]


def _bundled_val_func(bundle: Path, root: Path, spec: str | None, trusted: bool) -> ValFunc | None:
    """The bundle's own `val_func`, loaded from its file in the unpacked bundle and never by searching
    sys.path, so neither a module of that name beside the user nor one already imported can stand in for it."""
    if spec is None:
        return None
    if not trusted:
        raise BundleError(f"{bundle}: judged by val_func '{spec}', Python code inside the bundle; reproduce runs "
                          f"it only when given {TRUST_FLAG}, so pass it if you trust where the bundle comes from")
    name, _, function_name = spec.partition(":")
    files = sorted((root / "val_func").glob("*.py"))
    if len(files) != 1:
        raise BundleError(f"{bundle}: val_func '{spec}' needs one module file in val_func/, found {len(files)}; "
                          "make the bundle again with `snakemake bundle`")
    function = getattr(_import_file(bundle, name, files[0]), function_name, None)
    if not callable(function):
        raise BundleError(f"{bundle}: val_func/{files[0].name} has no function '{function_name}'")
    return ValFunc(spec, function)


def _import_file(bundle: Path, name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the bundle's own code: whatever it raises
        raise BundleError(f"{bundle}: val_func/{path.name} fails to import ({type(error).__name__}: "
                          f"{_one_line(error)})") from None
    return module


def _in_bundle(bundle: Path, root: Path, function: Callable[..., Any], *arguments: Any) -> Any:
    """Runs `function`, naming a failing member by its name in the bundle rather than its temporary path."""
    try:
        return function(*arguments)
    except AccubisectError as error:
        message = _one_line(error).replace(f"{root}{os.sep}", "")
        raise BundleError(f"{bundle}: {message}") from None


def shape_problem(data: Any, definition: str | None) -> str:
    """The first way `data` departs from bundle.schema.yaml (from its `definition`, or the whole bundle's
    JSON files when None) as one line naming the key, or "" when it fits."""
    schema = bundle_schema()
    if definition is not None:
        schema = {"$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(data))
    if error is None:
        return ""
    where = ".".join(str(part) for part in error.absolute_path) or "top level"
    if len(error.message) > 200:
        return f"{where}: {reprlib.repr(error.instance)} fails {error.validator} {error.validator_value!r}"
    return f"{where}: {_one_line(error.message)}"


def _one_line(error: object) -> str:
    return "; ".join(str(error).splitlines())


def _first_difference(expected: Any, got: Any, where: str = "report") -> str:
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            found = _first_difference(expected.get(key), got.get(key), f"{where}.{key}")
            if found:
                return found
        return ""
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for index, (a, b) in enumerate(zip(expected, got, strict=True)):
            found = _first_difference(a, b, f"{where}[{index}]")
            if found:
                return found
        return ""
    return "" if expected == got else f"{where}: bundled {expected!r}, reproduced {got!r}"
