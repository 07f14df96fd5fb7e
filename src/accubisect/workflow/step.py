"""The edge between Snakemake and the library: every `scripts/*.py` is one call to `run_step`.

The library never imports Snakemake; this module only reads the `snakemake` object a script is given.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
import threading
import time
import typing
from collections.abc import Callable
from typing import Any

from accubisect.core.errors import AccubisectError, StepError
from accubisect.formats.files import SHARED_WORKSPACE_WAIT_SECONDS
from accubisect.formats.step import Step
from accubisect.workflow.writable import write_failure

log = logging.getLogger("accubisect")


def run_step(function: Callable[..., None], snakemake: Any) -> None:
    """Calls `function` with the rule's named inputs, outputs and params as one record: the `Step`
    subclass its one parameter is annotated with (`formats/step.py`), built by name.

    Logging goes to the rule's log file and to stderr. A user error, a full or read-only disk, and Ctrl-C
    end the job with one line, not a traceback.
    """
    _configure_logging(snakemake.log[0] if snakemake.log else None)
    signal.signal(signal.SIGINT, _interrupted)
    _wait_for(_files(snakemake.input))
    named = {**_named(snakemake.input), **_named(snakemake.output), **_named(snakemake.params)}
    try:
        function(step_type_of(function).from_named(named))
    except AccubisectError as error:
        log.error("%s", error)
        sys.exit(1)
    except OSError as error:
        line = write_failure(error, _files(snakemake.output))
        if line is None:
            log.exception("%s failed", function.__name__)
            raise
        log.error("%s", line)
        sys.exit(1)
    except Exception:
        log.exception("%s failed", function.__name__)
        raise


INTERRUPTED = ("interrupted (Ctrl-C): finished stages and verdicts are kept; run the same command again to go "
               "on from them")


def _interrupted(signum: int, frame: object) -> typing.NoReturn:
    """The job's SIGINT handler, from its start to its exit (a KeyboardInterrupt could also come as the
    interpreter shuts down, after the step): one line and status 130 (128 + SIGINT), at once. A search's
    round runs its probes in threads that cannot be interrupted, and the interpreter would wait for them at
    exit (a whole probe: minutes on a real model). Every verdict and stage file is written atomically, so
    what finished is kept, and a probe cut short leaves at most a `.part` file that nothing reads."""
    log.error("%s", INTERRUPTED)
    logging.shutdown()
    os._exit(130)


def cancel_scheduler_timers() -> None:
    """Cancels the timers this process has armed, from the Snakefile's `onsuccess`/`onerror`. Snakemake's
    scheduler arms one on every pass (its job-rate limiter, `--max-jobs-per-timespan`, 1 s by default) and the
    interpreter waits for the last one at exit, so a finished run sat idle for up to a second
    (docs/benchmarks.md: 4.2 -> 3.2 s for the example's compare). Nothing is scheduled once the run has ended."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.cancel()


def step_type_of(function: Callable[..., None]) -> type[Step]:
    """The `Step` record `function` takes: the annotation of its one parameter."""
    parameters = list(inspect.signature(function).parameters.values())
    hint = typing.get_type_hints(function).get(parameters[0].name) if len(parameters) == 1 else None
    if not (isinstance(hint, type) and issubclass(hint, Step)):
        raise StepError(f"{function.__qualname__}: a step function takes one parameter annotated with its Step "
                        "record (formats/step.py)")
    return hint


def _wait_for(files: list[str], seconds: float = SHARED_WORKSPACE_WAIT_SECONDS) -> None:
    """Snakemake deletes a job's outputs before it runs the job; when another run on a shared workspace
    re-creates a stage file this run needs, the file is briefly missing. Wait for it, as for a shared
    filesystem's latency; the content will be the same, since paths are content-addressed."""
    deadline = time.monotonic() + seconds
    missing = [path for path in files if not os.path.exists(path)]
    while missing and time.monotonic() < deadline:
        log.info("waiting for %s", ", ".join(missing))
        time.sleep(1)
        missing = [path for path in missing if not os.path.exists(path)]


def _files(items: Any) -> list[str]:
    return [str(item) for item in items]


def _named(items: Any) -> dict[str, Any]:
    return {name: _plain(value) for name, value in items.items()}


def _plain(value: Any) -> Any:
    """Snakemake's Namedlist of files becomes a plain list of str; single files become str."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return str(value) if type(value).__name__ in ("_IOFile", "AnnotatedString") else value


def _configure_logging(log_file: str | None) -> None:
    """A log line that cannot be written (the log file's disk is full) is dropped, not printed as a
    traceback: stderr still shows it."""
    logging.raiseExceptions = False
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", handlers=handlers,
                        force=True)
