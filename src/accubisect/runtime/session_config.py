"""ORT session config keys. ORT silently ignores a key it does not know, so a misspelt
`compile.session_config` key would change nothing without a word; it is refused when the workflow is parsed.

The Python API does not list the keys. They are string constants (onnxruntime_session_options_config_keys.h)
compiled into ORT's library, so they are read from the installed one: NUL-terminated strings with the
header's prefixes. A key the library never mentions is one ORT never reads.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.core.errors import ConfigError
from accubisect.runtime.ort_compile import ort_version

log = logging.getLogger(__name__)

PREFIXES = (b"session.", b"optimization.", b"ep.", b"mlas.")
_KEY_BYTE = re.compile(rb"[A-Za-z0-9_.]")
_KEY_TAIL = re.compile(rb"[a-z0-9_.]*")


@dataclass(frozen=True)
class KnownKeys:
    """Keys stored whole, and stems: the first piece of a key the compiler builds from pieces (a long constant
    split into chunks, the rest as immediates in the code), which stands for every key it starts."""

    keys: frozenset[str]
    stems: frozenset[str]

    def __contains__(self, key: str) -> bool:
        return key in self.keys or key.startswith(tuple(self.stems))

    def __bool__(self) -> bool:
        return bool(self.keys)

    def listed(self, first: list[str]) -> str:
        """Every known key, `first` first, a stem followed by "…"."""
        every = [*sorted(self.keys), *(f"{stem}…" for stem in sorted(self.stems))]
        return ", ".join([*first, *(key for key in every if key not in first)])


def check_session_config(entries: Mapping[str, Any]) -> None:
    """Fails on the first key the installed ORT does not know, listing the known keys, the closest first."""
    if not entries:
        return
    version = ort_version()
    known = known_keys(version)
    for key in sorted(entries):
        if known and key not in known:
            closest = difflib.get_close_matches(key, sorted(known.keys), n=3)
            raise ConfigError(f"compile.session_config: '{key}' is not a session config key of ONNX Runtime "
                              f"{version}, which would ignore it; known keys: {known.listed(closest)}")


@functools.cache
def known_keys(version: str) -> KnownKeys:
    """The session config keys of the installed ORT (`version` keys the cache); none if its library is not
    where the wheel puts it, and then nothing is refused."""
    spec = importlib.util.find_spec("onnxruntime")
    libraries = sorted((Path(spec.origin).parent / "capi").glob("onnxruntime_pybind11_state*")) if spec else []
    if not libraries:
        log.warning("ONNX Runtime %s: library not found; compile.session_config keys are not checked", version)
        return KnownKeys(frozenset(), frozenset())
    return scan_keys(libraries[0].read_bytes())


def scan_keys(data: bytes) -> KnownKeys:
    """Strings in `data` that start with one of PREFIXES (not inside a longer string): NUL-terminated ones are
    keys, others stems (a stem no longer than its prefix would admit every key, and is left out)."""
    keys, stems = set(), set()
    for prefix in PREFIXES:
        at = data.find(prefix)
        while at >= 0:
            if at > 0 and not _KEY_BYTE.match(data, at - 1):
                end = _KEY_TAIL.match(data, at + len(prefix)).end()
                if data[end:end + 1] == b"\0":
                    keys.add(data[at:end].decode())
                elif end > at + len(prefix):
                    stems.add(data[at:end].decode())
            at = data.find(prefix, at + 1)
    return KnownKeys(frozenset(keys), frozenset(stems - keys))
