"""Publishing a target's answer files together: `<results>/<target>/` holds one run's set, never a mix.

A target has one publish job (rules/*.smk, `publish_*`), which runs only once every answer file of the target
exists. It builds the whole set in a staging folder beside the target's, `.<target>.new`, and puts it in the
old folder's place in one step: `renameat2(RENAME_EXCHANGE)` on Linux; where the filesystem cannot exchange
(NFS), two renames, the old set first moved to `.<target>.old`. So a failed run publishes nothing, a killed
publish leaves the old set or the new one (or, between the two renames, the old set under `.<target>.old`),
the rerun completes it, and files the new run does not write (a sample no longer configured) go with the
old set.

Snakemake deletes a job's outputs before it runs the job, unless flagged `update`: the answer files are (it
copies them aside, and back if the job fails), so they stay in place until the swap; the manifest,
`published.json` (this module's record: every file the job published, with its sha256), is not.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from accubisect.core.errors import StepError
from accubisect.formats.digest import file_sha256
from accubisect.formats.files import write_json
from accubisect.formats.record import read_record
from accubisect.formats.step import Step

PUBLISHED_FORMAT = 1
KIND = "record of published files"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>
_CANNOT_EXCHANGE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)  # the filesystem or kernel has no exchange


@dataclass(frozen=True)
class PublishedFile:
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Published:
    """A publish job's manifest: the files it put in its target's folder, in the rule's order."""

    files: Mapping[str, PublishedFile]  # name in the folder ("inputs/sample0.npz" in a subfolder) -> digest

    def to_json(self) -> dict[str, Any]:
        return {"format": PUBLISHED_FORMAT,
                "files": {name: {"sha256": f.sha256, "bytes": f.bytes} for name, f in self.files.items()}}

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> Published:
        return cls({str(name): PublishedFile(str(f["sha256"]), int(f["bytes"])) for name, f in data["files"].items()})

    @classmethod
    def read(cls, path: str | Path) -> Published:
        return read_record(path, KIND, PUBLISHED_FORMAT, cls._build)


@dataclass(frozen=True)
class PublishStep(Step):
    """A publish rule's files. Each named input `x` is published under its file name, a named list of files
    into a subfolder `x`; the rule declares each copy as its output `published_x`, flagged `update` (Snakemake
    then leaves the old set in place until the swap, and republishes a deleted copy), and the manifest as
    `published` (whose folder is the target's)."""

    published: Path
    files: tuple[tuple[str, Path], ...]  # (name in the folder, workspace file), in the rule's order

    @classmethod
    def from_named(cls, named: Mapping[str, Any]) -> Self:
        sources = dict(named)
        if "published" not in sources:
            raise StepError(f"{cls.__name__}: the rule names no output `published`; its names: {sorted(named)}")
        published = Path(sources.pop("published"))
        copies = {name.removeprefix("published_"): _paths(sources.pop(name)) for name in list(sources)
                  if name.startswith("published_")}
        placed = {name: _placed(name, value) for name, value in sources.items()}
        files = [pair for pairs in placed.values() for pair in pairs]
        wrong = sorted(f"published_{name}" for name in {*copies, *placed}
                       if copies.get(name) != [published.parent / where for where, _ in placed.get(name, [])])
        if wrong or len(dict(files)) != len(files):
            raise StepError(f"{cls.__name__}: outputs {wrong} are not the copies in {published.parent} of the inputs "
                            f"of their names, or two inputs share a name there: {[name for name, _ in files]}")
        return cls(published, tuple(files))


def _placed(name: str, value: Any) -> list[tuple[str, Path]]:
    """Where an input's files go in the target's folder: a list of files into the subfolder `name`."""
    if isinstance(value, list):
        return [(f"{name}/{path.name}", path) for path in _paths(value)]
    return [(Path(value).name, Path(value))]


def _paths(value: Any) -> list[Path]:
    return [Path(path) for path in value] if isinstance(value, list) else [Path(value)]


def publish(step: PublishStep) -> None:
    """Publishes the step's files as one set in its folder, in place of the folder's previous set. The
    summaries are printed once, at the end of the run (`console.end_of_run`)."""
    folder = step.published.parent
    new = _beside(folder, "new")
    for leftover in (new, _beside(folder, "old")):  # a killed publish's
        _discard(leftover)
    try:
        _build(step, new)
    except BaseException:
        _discard(new)
        raise
    _replace(folder, new)
    shutil.rmtree(new, ignore_errors=True)  # the old set, exchanged: the job has succeeded, whatever stays of it


def _build(step: PublishStep, new: Path) -> None:
    new.mkdir(parents=True)
    files = {name: _copy(source, new / name) for name, source in step.files}
    write_json(new / step.published.name, Published(files).to_json())


def _copy(source: Path, target: Path) -> PublishedFile:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return PublishedFile(file_sha256(target), target.stat().st_size)


def _replace(folder: Path, new: Path) -> None:
    """`new` takes `folder`'s place (under Snakemake the folder exists: it holds the job's output). Exchanged,
    the old set is left at `new`."""
    if not folder.exists():
        os.rename(new, folder)
    elif not _exchange(new, folder):
        old = _beside(folder, "old")
        os.rename(folder, old)
        os.rename(new, folder)
        shutil.rmtree(old, ignore_errors=True)


def _exchange(first: Path, second: Path) -> bool:
    """Swaps two paths in one step (Linux's renameat2); False where the system or filesystem cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if sys.platform == "linux" else None
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(second))


def _beside(folder: Path, what: str) -> Path:
    return folder.parent / f".{folder.name}.{what}"


def _discard(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()

