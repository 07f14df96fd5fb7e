"""A disk that refuses a write: full, read-only, or not the user's. That is the disk's state, not a bug, so
the user gets one line naming the folder and what to do, instead of a traceback.

Checked twice: before the first job runs (`unwritable_line`, from the Snakefile's `onstart`), because a
read-only folder otherwise fails inside Snakemake itself as it prepares a job (removing the old output, with
Snakemake's traceback); and in each job (`write_failure`, from `run_step`), for a disk that fills up while
it writes. A run with nothing to do writes nothing and is not checked, so a read-only, fully cached project
still shows its answers.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

WRITABLE = "make it writable, or set workspace/results to a writable folder, and rerun"
# errno -> what the user does about it
WRITE_FAILURES = {
    errno.ENOSPC: "free space there and rerun",
    errno.EDQUOT: "free space within your quota there and rerun",
    errno.EFBIG: "a file outgrew the file size limit: raise it (ulimit -f) or free space, and rerun",
    errno.EROFS: WRITABLE,
    errno.EACCES: WRITABLE,
    errno.EPERM: WRITABLE,
}


def write_failure(error: OSError, outputs: list[str]) -> str | None:
    """The one line for a disk that is full or cannot be written, naming the folder: the one of the file
    written (a copy's or a rename's target, `filename2`), or of the job's first output when the writer does
    not say (h5py, a write to an open file). None for any other OS error, a bug that keeps its traceback."""
    if error.errno not in WRITE_FAILURES:
        return None
    named = error.filename2 or error.filename or (outputs[0] if outputs else None)
    return _line(Path(named).parent if named else Path.cwd(), error)


def unwritable_line(outputs: Iterable[str]) -> str | None:
    """The line for the first folder the jobs' `outputs` go to (the nearest that exists: the rest a job
    creates there) in which no file can be created, or None. The probe is an unnamed temporary file: nothing
    appears in the folder."""
    for folder in sorted({_nearest_existing(Path(path).parent) for path in outputs}):
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as error:
            return _line(folder, error)
    return None


def _line(folder: Path, error: OSError) -> str:
    advice = WRITE_FAILURES.get(error.errno or 0, WRITABLE)
    return f"{folder}: {error.strerror or os.strerror(error.errno or 0)}; {advice}"


def _nearest_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder
