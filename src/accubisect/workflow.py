"""The edge between Snakemake and the library: every `scripts/*.py` is one call to `run_step`.

The library never imports Snakemake; this module only reads the `snakemake` object a script is given.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from accubisect.errors import AccubisectError

log = logging.getLogger("accubisect")


def run_step(function: Callable[..., None], snakemake: Any) -> None:
    """Calls `function` with the rule's named inputs, outputs and params as keyword arguments.

    Logging goes to the rule's log file and to stderr. A user error ends the job with its one-line
    message and exit status 1, not a traceback.
    """
    _configure_logging(snakemake.log[0] if snakemake.log else None)
    arguments = {**_named(snakemake.input), **_named(snakemake.output), **_named(snakemake.params)}
    try:
        function(**arguments)
    except AccubisectError as error:
        log.error("%s", error)
        sys.exit(1)
    except Exception:
        log.exception("%s failed", function.__name__)
        raise


def _named(items: Any) -> dict[str, Any]:
    return {name: _plain(value) for name, value in items.items()}


def _plain(value: Any) -> Any:
    """Snakemake's Namedlist of files becomes a plain list of str; single files become str."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return str(value) if type(value).__name__ in ("_IOFile", "AnnotatedString") else value


def _configure_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", handlers=handlers,
                        force=True)
