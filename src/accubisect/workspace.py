"""Pruning the workspace: it only grows, since every configuration keeps its own stage folders.

A stage folder is `<workspace>/<stage>/<key>/`. Prune removes those not touched for a given number of
days, or those the current configuration does not need, or (both given) those that are both; and
temporary `*.part` files left by killed runs, once an hour old. `dry_run` only reports.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from accubisect.plan import Plan

STAGES = ("compile", "graph", "dump", "compare", "local", "probe", "fusion_bisect", "bundle", "precision",
          "precision_probe", "precision_bisect")
STRAY_AGE_SECONDS = 3600


@dataclass(frozen=True)
class Removal:
    path: Path
    bytes: int
    why: str


def needed_keys(plan: Plan) -> set[str]:
    """Every stage key the configuration behind `plan` uses, probes of its bisection included."""
    probes = [verdict for kind in ("fusion", "precision")
              for verdict in plan.verdicts_of_rounds(sorted(plan.bisect_dir(kind).glob("round*/plan.json")), kind)]
    return {*plan.compile_keys.values(), *plan.graph_keys.values(), *plan.dumps, *plan.comparisons,
            plan.bisect_key, plan.precision_key, plan.precision_bisect_key,
            plan.local_errors_json("fusion").parent.name, *(path.parent.name for path in probes)}


def prune(workspace: Path, older_than_days: float | None, keep: set[str] | None, dry_run: bool) -> list[Removal]:
    now = time.time()
    removals = []
    for folder in _stage_folders(Path(workspace)):
        stale = older_than_days is not None and now - _last_touched(folder) > older_than_days * 86400
        unneeded = keep is not None and folder.name not in keep
        if (stale or older_than_days is None) and (unneeded or keep is None):
            why = " and ".join(w for w, yes in (("not touched", stale), ("not needed", unneeded)) if yes)
            removals.append(Removal(folder, _size(folder.rglob("*")), why))
    removals += [Removal(part, part.stat().st_size, "left by a killed run")
                 for part in Path(workspace).rglob(".*.part") if now - part.stat().st_mtime > STRAY_AGE_SECONDS]
    if not dry_run:
        for removal in removals:
            shutil.rmtree(removal.path) if removal.path.is_dir() else removal.path.unlink()
    return removals


def _stage_folders(workspace: Path) -> list[Path]:
    return [key for stage in STAGES if (workspace / stage).is_dir() for key in sorted((workspace / stage).iterdir())
            if key.is_dir()]


def _last_touched(folder: Path) -> float:
    return max((path.stat().st_mtime for path in folder.rglob("*")), default=folder.stat().st_mtime)


def _size(paths: Iterable[Path]) -> int:
    return sum(path.stat().st_size for path in paths if path.is_file())
