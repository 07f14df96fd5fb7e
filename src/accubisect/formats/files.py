"""Writing files so that a killed run never leaves a half-written one under its final name."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accubisect.core.errors import WorkspaceError

# how long a job waits for a file another run on a shared workspace is re-creating
SHARED_WORKSPACE_WAIT_SECONDS = 120
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yields a temporary path beside `path`; renames it to `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(handle)
    os.chmod(temporary, 0o666 & ~_UMASK)  # mkstemp makes 0600; a shared workspace needs the usual mode
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


@contextlib.contextmanager
def atomic_model(path: Path) -> Iterator[Path]:
    """Yields `path`'s name in a new temporary folder beside it, for a model and the external data file a
    writer puts beside it (`<name>.data`: its `location` is relative, so the two are written under their
    final names). When the block succeeds every file is renamed into place, the model last, so a model
    under its final name always has its data; otherwise the folder is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent))
    try:
        yield folder / path.name
        for made in sorted(folder.iterdir(), key=lambda file: file.name == path.name):
            os.replace(made, path.parent / made.name)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as temporary:
        temporary.write_text(text)


def read_json(path: str | Path) -> Any:
    """A stage file is written whole or not at all, so one that does not parse was damaged after the
    fact; its folder is the unit the workflow rebuilds."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise WorkspaceError(f"{path}: damaged JSON ({error}); {rebuild_advice(path)}") from None


def rebuild_advice(path: Path) -> str:
    """What to do about a damaged file the workflow wrote: its stage folder is the unit it rebuilds."""
    return f"delete {Path(path).parent} and rerun to rebuild it"


def json_text(data: Any) -> str:
    """The one JSON layout every file of the workflow uses, so equal data gives equal bytes. Compact: with
    `indent`, Python encodes in pure Python, 0.7 s of a recognizer's 3 s compare job for its report alone
    (`python -m json.tool FILE` shows one indented)."""
    return json.dumps(data, separators=(",", ":")) + "\n"


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json_text(data))


def link_or_copy(source: Path, target: Path) -> None:
    """`source` hard-linked at `target` (one file on disk); copied where they are on two filesystems."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copyfile(source, target)
