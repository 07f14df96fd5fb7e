"""The mixlist files: the bundled default lists (`data/mixlist.yaml`), a user's modify_mixlist JSON, and the
precision answer's modify_mixlist.json and keep_dtype.txt, in the seeds' formats (which carry no version).

Reading and writing them is I/O, so it lives here; what the lists mean (`core.precision`) stays pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import yaml

from accubisect.core.errors import PrecisionError
from accubisect.core.precision import GRAY, apply_modify_mixlist
from accubisect.formats.files import write_atomic, write_json


def default_mixlist() -> dict[str, dict[str, str]]:
    """List name -> {op type: the reason it is there}."""
    return yaml.safe_load(resources.files("accubisect").joinpath("data/mixlist.yaml").read_text())


def load_mixlist(path: str | None, known: frozenset[str]) -> dict[str, set[str]]:
    """The default lists, modified by the JSON file at `path` if one is given."""
    defaults = {name: set(ops) for name, ops in default_mixlist().items() if name != GRAY}
    if path is None:
        return defaults
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PrecisionError(f"{path}: modify_mixlist file not found; fix precision.modify_mixlist") from None
    except ValueError as error:
        raise PrecisionError(f"{path}: not valid JSON ({error})") from None
    return apply_modify_mixlist(defaults, document, str(path), known)


def write_modify_mixlist(path: Path, black_added: Iterable[str]) -> None:
    """Writes the op types `black_added` to the black list (precision_bisect's answer), read back by
    `load_mixlist` when given as precision.modify_mixlist."""
    write_json(path, {"black-list": {"to-add": list(black_added)}})


def write_keep_dtype(path: Path, nodes: Iterable[str]) -> None:
    """Writes the nodes an answer keeps in fp32, one name a line."""
    write_atomic(path, "".join(f"{node}\n" for node in nodes))
