"""A comparison packed to travel: `snakemake bundle` writes it, `accubisect reproduce` checks it elsewhere.

The archive holds what the comparison read — both variants' dumps for every sample, both graph JSONs,
the golden outputs, the `val_func` module if one judged the outputs — plus the validated config, the model
hash, the tool and library versions, and the report it produced. Reproducing runs the same comparison
on the unpacked files and checks the new report equals the bundled one byte for byte.
"""

from __future__ import annotations

import importlib
import io
import json
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.accuracy import val_func_source
from accubisect.compare import attach_local_errors, build_report
from accubisect.errors import AccubisectError
from accubisect.files import atomic_path, json_text, read_json
from accubisect.graph import load_graph

FORMAT = 1
LIBRARIES = ("accubisect", "onnxruntime", "onnx", "numpy", "h5py")


class BundleError(AccubisectError):
    """A bundle is missing, unreadable or not one accubisect wrote."""


def versions() -> dict[str, str]:
    """By module, not by distribution: onnxruntime-gpu installs the `onnxruntime` module under another name."""
    return {name: importlib.import_module(name).__version__ for name in LIBRARIES}


def make_bundle(reference_dumps: Sequence[str], candidate_dumps: Sequence[str], reference_graph: str,
                candidate_graph: str, local_errors: str, report_json: str, golden: Sequence[str],
                samples: Sequence[str], output_names: Sequence[str], config: Mapping[str, Any], model_sha256: str,
                bundle: str) -> None:
    """Bundle stage: one .tar.gz with everything the comparison needs and the report it made."""
    members: dict[str, Path] = {"report.json": Path(report_json), "graphs/reference.json": Path(reference_graph),
                                "graphs/candidate.json": Path(candidate_graph), "local.json": Path(local_errors)}
    for sample, ref, cand, truth in zip(samples, reference_dumps, candidate_dumps, golden, strict=True):
        members[f"dumps/reference/{sample}.h5"] = Path(ref)
        members[f"dumps/candidate/{sample}.h5"] = Path(cand)
        if truth:
            members[f"golden/{sample}_outputs.npz"] = Path(truth)
    val_func = val_func_source(config["accuracy"]["val_func"])
    if val_func is not None:
        members[f"val_func/{val_func.name}"] = val_func
    manifest = {"format": FORMAT, "versions": versions(), "model_sha256": model_sha256, "config": dict(config),
                "samples": list(samples), "output_names": list(output_names),
                "golden": [bool(truth) for truth in golden]}
    with atomic_path(Path(bundle)) as temporary, tarfile.open(temporary, "w:gz") as archive:
        _add_bytes(archive, "manifest.json", json.dumps(manifest, indent=2).encode())
        for name, path in members.items():
            _add_bytes(archive, name, path.read_bytes())


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)  # mtime 0, owner root: the archive depends on the contents alone
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


@dataclass(frozen=True)
class Reproduction:
    matches: bool
    report: dict[str, Any]
    difference: str  # the first place the reports differ, "" when they match
    versions: dict[str, tuple[str, str]]  # library -> (bundled, here), where they differ


def reproduce(bundle: Path) -> Reproduction:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _unpack(Path(bundle), root)
        manifest = read_json(root / "manifest.json")
        samples, bundled_report = manifest["samples"], read_json(root / "report.json")
        if (root / "val_func").is_dir():
            sys.path.insert(0, str(root / "val_func"))
        report = build_report(
            [str(root / f"dumps/reference/{s}.h5") for s in samples],
            [str(root / f"dumps/candidate/{s}.h5") for s in samples],
            load_graph(root / "graphs/candidate.json"), (bundled_report["reference"], bundled_report["candidate"]),
            [str(root / f"golden/{s}_outputs.npz") if g else "" for s, g in zip(samples, manifest["golden"],
                                                                                 strict=True)],
            samples, manifest["output_names"], manifest["config"]["accuracy"], bundled_report["low_precision"])
        attach_local_errors(report, read_json(root / "local.json"))
        bundled = (root / "report.json").read_bytes()
    produced = json_text(report).encode()
    here = versions()
    changed = {k: (v, here.get(k, "?")) for k, v in manifest["versions"].items() if here.get(k) != v}
    difference = "" if produced == bundled else _first_difference(json.loads(bundled), report)
    return Reproduction(produced == bundled, report, difference, changed)


def _unpack(bundle: Path, root: Path) -> None:
    try:
        with tarfile.open(bundle, "r:gz") as archive:
            archive.extractall(root, filter="data")
    except (OSError, tarfile.TarError) as error:
        raise BundleError(f"{bundle}: not a readable bundle ({error}); make one with `snakemake bundle`") from None
    manifest = root / "manifest.json"
    if not manifest.is_file() or json.loads(manifest.read_text()).get("format") != FORMAT:
        raise BundleError(f"{bundle}: no accubisect bundle manifest (format {FORMAT}) inside")


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
