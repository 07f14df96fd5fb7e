"""Content keys for workspace paths: what determines a stage's files names the folder they live in."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_atomic

KEY_LENGTH = 16
CLOCK_SLACK_NS = 1_000_000_000  # file times come from a coarse clock (and, on NFS, the server's)
DIGESTS_FORMAT = 1  # <workspace>/.digests.json; the file written before the field existed held the entries alone


def stage_key(**parts: Any) -> str:
    """A short hash of a stage's inputs; `parts` must be JSON-serialisable (digests, options, upstream keys)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class DigestCache:
    """File digests memoised in a JSON file, so that parsing the workflow does not re-read a large model on
    every `snakemake` call. A digest is reused only while the file provably has not changed since it was
    hashed: same inode, size, mtime and ctime (which no user call can set back), and a ctime older than the
    hashing by more than the clock's granularity, so that a rewrite in the same clock tick cannot hide.

    The file is `{"format": DIGESTS_FORMAT, "entries": {path: [inode, size, mtime, ctime, hashed at,
    sha256]}}`. It is only a cache: one of another format (an older accubisect's held the entries alone),
    damaged or missing is discarded and rebuilt by hashing again, never an error."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self._entries: dict[str, list[Any]] = self._load()
        self._dirty = False

    def _load(self) -> dict[str, list[Any]]:
        try:
            data = json.loads(self.store.read_text())
        except (OSError, ValueError):
            return {}  # a missing or torn cache only costs re-hashing
        entries = data.get("entries") if isinstance(data, dict) and data.get("format") == DIGESTS_FORMAT else None
        if not isinstance(entries, dict):
            return {}  # another format's entries need not mean what ours do: hashing again is always right
        return {path: entry for path, entry in entries.items() if _valid(entry)}

    def sha256(self, path: Path) -> str:
        stat = path.stat()
        key = str(path.resolve())
        stamp = [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
        cached = self._entries.get(key)
        if cached and cached[:4] == stamp and stat.st_ctime_ns < cached[4] - CLOCK_SLACK_NS:
            return cached[5]
        hashed_at = time.time_ns()
        digest = file_sha256(path)
        self._entries[key] = [*stamp, hashed_at, digest]
        self._dirty = True
        return digest

    def save(self) -> None:
        """Writes the cache only when a file was hashed, so a fully cached run writes nothing; a workspace
        that cannot be written (read-only, full) is no reason to stop: the cache only saves re-hashing."""
        if self._dirty:
            try:
                os.makedirs(self.store.parent, exist_ok=True)
                write_atomic(self.store, json.dumps({"format": DIGESTS_FORMAT, "entries": self._entries}, indent=0,
                                                 sort_keys=True))
            except OSError:
                return
            self._dirty = False


def _valid(entry: Any) -> bool:
    """An entry as `DigestCache.sha256` writes it: inode, size, mtime, ctime and the hashing time (integers),
    then the digest; any other is dropped from a damaged cache, to be hashed again."""
    return (isinstance(entry, list) and len(entry) == 6 and all(type(value) is int for value in entry[:5])
            and isinstance(entry[5], str))
