"""The mixlist files: the bundled default lists (`data/mixlist.yaml`) and a user's modify_mixlist JSON.

Reading them is I/O, so it lives here; what the lists mean (`core.precision`) stays pure.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import yaml

from accubisect.core.errors import PrecisionError
from accubisect.core.precision import GRAY, apply_modify_mixlist


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
