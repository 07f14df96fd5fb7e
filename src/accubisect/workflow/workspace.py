"""Pruning the workspace: it only grows, since every configuration keeps its own stage folders.

A stage folder is `<workspace>/<stage>/<key>/` (formats/paths.py). Prune removes those not touched for a given number of
days, or those the current configuration does not need, or (both given) those that are both; and
temporary `*.part` files left by killed runs, once an hour old. Listing (`removals`) and removing
(`remove`) are separate steps, so a caller shows what goes before anything goes.

A folder given as the workspace may hold the user's own folders under a stage's name (`--workspace examples`
holds examples/precision/samples): prune removes only folders it can prove the workflow made, named like a key
and holding the file their stage writes first (`MARKERS`), and `.part` files only in those and the digest
cache's.
"""

from __future__ import annotations

import math
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from accubisect.core.errors import PruneError
from accubisect.formats.deployed import DeployedRecord
from accubisect.formats.instances import InstancesRecord
from accubisect.formats.openvino_fusion_result import OpenVinoFusionResult
from accubisect.formats.openvino_precision_result import OpenVinoPrecisionResult
from accubisect.formats.paths import DIGESTS, KEY_PATTERN, STAGES, digests_file, stage_root
from accubisect.formats.reduce_record import ReduceRecord
from accubisect.formats.search_record import SearchRecord
from accubisect.workflow.plan import Plan

STRAY_AGE_SECONDS = 3600
# The file a stage's first job writes into each folder it makes: its log (rules/*.smk), or a probe's verdict.
MARKERS = {"compile": "compile.log", "graph": "graph.log", "dump": "dump.log", "compare": "compare.log",
           "local": "local.log", "probe": "verdict.json", "fusion_bisect": "search.log",
           "instance_probe": "verdict.json", "bundle": "bundle.log", "precision": "assignment.log",
           "precision_probe": "verdict.json", "precision_bisect": "search.log", "reduce": "reduce.log",
           "reduce_probe": "verdict.json"}
LOCK_FILE = re.compile(r"^[0-9]+\.(input|output)\.lock$")  # how Snakemake 9 names them (persistence/file.py)


@dataclass(frozen=True)
class Removal:
    path: Path
    bytes: int
    why: str


def needed_keys(plan: Plan) -> set[str]:
    """Every stage key the configuration behind `plan` uses, the probes of its bisections, instance search
    and reduce included."""
    probes = [key for kind in ("fusion", "precision") for key in probe_keys(plan, kind)]
    return {*plan.keys().values(), *probes, *deployed_probe_keys(plan), *instance_probe_keys(plan),
            *reduce_probe_keys(plan), *openvino_probe_keys(plan)}


def probe_keys(plan: Plan, kind: str) -> list[str]:
    """The verdicts a bisection's last search used, its noise floor's included."""
    path = plan.bisect_dir(kind) / "search.json"
    if not path.exists():
        return []
    record, store = SearchRecord.read(path), plan.verdict_store(kind)
    floor = [record.floor["verdict"]] if record.floor and record.floor["verdict"] else []
    return [store.key_of(frozenset(probe["off"])) for probe in record.probes] + floor


def deployed_probe_keys(plan: Plan) -> list[str]:
    """The verdicts the last deploy pass of precision_bisect used (`bisection/deployable.py`)."""
    path = plan.bisect_dir("precision") / "deployed.json"
    if not path.exists():
        return []
    store = plan.verdict_store("deployable")
    return [store.key_of(frozenset(probe["off"])) for probe in DeployedRecord.read(path).probes]


def instance_probe_keys(plan: Plan) -> list[str]:
    """The verdicts the last instance search (`fusion_instances`) used."""
    path = plan.bisect_dir("fusion") / "instances.json"
    if not path.exists():
        return []
    store = plan.instance_store()
    return [store.key_of(frozenset(probe["off"])) for probe in InstancesRecord.read(path).search["probes"]]


def openvino_probe_keys(plan: Plan) -> list[str]:
    """The verdicts the last OpenVINO searches used: their result.json lists every probe (they write no
    search.json)."""
    if plan.config["backend"] != "openvino-cpu":
        return []
    keys = []
    path = plan.bisect_dir("precision") / "result.json"
    if path.exists():
        store = plan.openvino_store("precision")
        keys += [store.key_of(frozenset(p["kept_fp32"])) for p in OpenVinoPrecisionResult.read(path).probes]
    path = plan.bisect_dir() / "result.json"
    if path.exists():
        stores = {level: plan.openvino_store(level) for level in ("rule", "instance")}
        keys += [stores[p["level"]].key_of(frozenset(p["off"] if p["level"] == "rule" else p["barriers"]))
                 for p in OpenVinoFusionResult.read(path).probes]
    return keys


def reduce_probe_keys(plan: Plan) -> list[str]:
    """The verdicts the last reduce used: each step of its search names its own."""
    path = plan.reduce_dir() / "reduce.json"
    return [step.key for step in ReduceRecord.read(path).steps] if path.exists() else []


def check_workspace(workspace: Path) -> None:
    """Pruning a path that is no workspace folder would list nothing and look like success."""
    if not workspace.is_dir():
        what = "is not a folder" if workspace.exists() else "does not exist"
        raise PruneError(f"{workspace}: {what}; give --workspace the workflow's workspace folder")


def check_unlocked(workspace: Path, workdir: Path) -> None:
    """Refuses while a workflow running in `workdir` holds a path inside `workspace`. Snakemake lists every
    input and output of a running workflow, one path a line, in `.snakemake/locks/<n>.input.lock` and
    `<n>.output.lock` of the folder it runs in (relative paths are relative to that folder), and deletes
    them when the run ends; a killed run leaves them until `snakemake --unlock`."""
    inside = workspace.resolve()
    locks = workdir / ".snakemake" / "locks"
    for lock in sorted(locks.iterdir()) if locks.is_dir() else []:
        for listed in _lines(lock) if LOCK_FILE.match(lock.name) else []:
            if (workdir / listed).resolve().is_relative_to(inside):
                raise PruneError(
                    f"{workspace}: a workflow running in {workdir} holds it ({lock} lists {listed}); wait for "
                    "that run to end, or if no run is alive, run `snakemake --unlock` there and prune again")


def _lines(lock: Path) -> list[str]:
    try:
        return [line.strip() for line in lock.read_text().splitlines() if line.strip()]
    except FileNotFoundError:  # the run ended while we looked
        return []


def removals(workspace: Path, older_than_days: float | None, keep: set[str] | None) -> list[Removal]:
    """What prune would free: stage folders old and/or not in `keep` (whichever are given), and stray
    `.part` files (or `files.atomic_model`'s `.part` folders, a model and its data) outside those folders, so
    each byte is counted, and removed, once."""
    if older_than_days is not None and not (math.isfinite(older_than_days) and older_than_days >= 0):
        raise PruneError(f"older than {older_than_days} days: an age is a number of days >= 0")
    now = time.time()
    found = []
    for folder in _stage_folders(workspace):
        stale = older_than_days is not None and now - _last_touched(folder) > older_than_days * 86400
        unneeded = keep is not None and folder.name not in keep
        if (stale or older_than_days is None) and (unneeded or keep is None):
            why = " and ".join(w for w, yes in (("not touched", stale), ("not needed", unneeded)) if yes)
            found.append(Removal(folder, _size(folder.rglob("*")), why))
    going = [removal.path for removal in found]
    found += [Removal(part, _size([part, *part.rglob("*")]), "left by a killed run") for part in _stray_parts(workspace)
              if now - part.stat().st_mtime > STRAY_AGE_SECONDS and not any(part.is_relative_to(f) for f in going)]
    return found


def remove(found: Sequence[Removal]) -> None:
    for removal in found:
        if removal.path.is_dir():
            shutil.rmtree(removal.path)
        else:
            removal.path.unlink(missing_ok=True)  # a stray .part another run's cleanup got to first


def _stage_folders(workspace: Path) -> list[Path]:
    """The folders the workflow made: a key's name, its stage's marker, and real (a symlinked key points
    outside what this workspace owns)."""
    roots = [stage_root(workspace, stage) for stage in STAGES]
    return [key for root in roots if root.is_dir() for key in sorted(root.iterdir())
            if re.fullmatch(KEY_PATTERN, key.name) and key.is_dir() and not key.is_symlink()
            and (key / MARKERS[root.name]).is_file()]


def _stray_parts(workspace: Path) -> list[Path]:
    """Where the workflow writes: in the folders it made, and the digest cache at the top."""
    return [*digests_file(workspace).parent.glob(f".{DIGESTS}.*.part"),
            *(part for key in _stage_folders(workspace) for part in key.rglob(".*.part"))]


def _last_touched(folder: Path) -> float:
    return max((path.stat().st_mtime for path in folder.rglob("*")), default=folder.stat().st_mtime)


def _size(paths: Iterable[Path]) -> int:
    return sum(path.stat().st_size for path in paths if path.is_file())
