"""Reading the versioned JSON records the stages write (compile.json, graph.json, report.json, local.json,
assignment.json, verdict.json, search.json, instances.json, reduce.json): one frozen dataclass per file, each
written with a `format` field.

A reader takes a record of its own format whole or refuses it in one line naming the file and the folder to
delete: a record of another format, or one missing a field, was written by another version of accubisect
(or edited), and its stage folder is the unit the workflow rebuilds. It never surfaces as a KeyError.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from accubisect.core.errors import WorkspaceError
from accubisect.formats.files import read_json, rebuild_advice

Record = TypeVar("Record")


def read_record(path: str | Path, kind: str, version: int, build: Callable[[dict[str, Any]], Record]) -> Record:
    """The record `build` makes of the JSON file at `path`, a `kind` (e.g. "compile record") of format
    `version`."""
    path = Path(path)
    try:
        data = read_json(path)
    except OSError as error:
        raise WorkspaceError(f"{path}: cannot read the {kind} ({error.strerror}); {rebuild_advice(path)}") from None
    return record_from(data, path, kind, version, build)


def record_from(data: Any, source: str | Path, kind: str, version: int,
                build: Callable[[dict[str, Any]], Record]) -> Record:
    """`build(data)` when `data` is a `kind` of format `version` with every field `build` reads; otherwise a
    one-line WorkspaceError naming `source` (the file the data came from)."""
    found = data.get("format") if isinstance(data, dict) else None
    if found != version:
        written = f"format {found}" if found is not None else "no format"
        raise WorkspaceError(f"{source}: not a {kind} of this accubisect version ({written}, this version reads "
                             f"format {version}); {rebuild_advice(Path(source))}")
    try:
        return build(data)
    except KeyError as error:
        raise WorkspaceError(f"{source}: not a {kind} of this accubisect version (no field {error}); "
                             f"{rebuild_advice(Path(source))}") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise WorkspaceError(f"{source}: not a {kind} of this accubisect version ({error}); "
                             f"{rebuild_advice(Path(source))}") from None
