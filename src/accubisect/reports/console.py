"""What a `snakemake` run shows at the terminal: the jobs' own lines, errors, and at the end the answers.

Snakemake writes a block per job, "x of y steps done" and scheduler notices to the terminal; with checkpoints
the step count grows as rounds unfold, so its percentage misleads, and a real model's run is hundreds of
such lines around the few that matter. `--quiet` cannot help: Snakemake filters its log file
(.snakemake/log/) with the same settings, so the chatter would be lost for good. `JobChatter` filters only
the terminal handler; the log file keeps everything.

The end of a run prints each requested result's summary and answer files (`end_of_run`), also when
Snakemake had nothing to do, which it ends without calling any `onsuccess` handler (`NothingToDo`).

This module never imports Snakemake: the Snakefile hands it Snakemake's logger and plain file names.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from accubisect.formats.paths import PUBLISHED

# Snakemake's LogEvent values (a StrEnum) of the records that describe jobs being scheduled and run.
CHATTER_EVENTS = frozenset({"workflow_started", "run_info", "resources_info", "job_info", "job_started",
                            "job_finished", "group_info", "progress", "shellcmd"})
# Scheduler notices Snakemake logs at INFO without an event.
CHATTER_MESSAGES = re.compile(r"Building DAG of jobs\.\.\.|Using shell: |Select jobs to execute\.\.\."
                              r"|Execute \d+ jobs\.\.\.|Updating checkpoint dependencies\."
                              r"|DAG of jobs will be updated after completion\.")
NOTHING_TO_DO = "Nothing to be done"
TERMINAL_HANDLER = "DefaultStreamHandler"  # the name Snakemake gives its terminal handler


class JobChatter(logging.Filter):
    """Drops Snakemake's per-job and scheduling records; warnings and errors (a failed job's block with the
    path of its log) always pass, as does every other notice (`--unlock`'s, the log file's path)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        if str(getattr(record, "event", "")) in CHATTER_EVENTS:
            return False
        return not CHATTER_MESSAGES.match(str(record.msg))


class NothingToDo(logging.Handler):
    """Calls `report` when Snakemake logs that nothing is to be done: a run found entirely cached ends there,
    skipping the `onsuccess` handler, yet its answers are exactly as current as after a run that did work."""

    def __init__(self, report: Callable[[], None]) -> None:
        super().__init__(logging.INFO)
        self.report = report

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith(NOTHING_TO_DO):
            self.report()


def quiet_terminal(logger: logging.Logger, report: Callable[[], None]) -> None:
    """Installs `JobChatter` on Snakemake's terminal handler (none there: the user chose a logger plugin,
    whose console is its own) and `NothingToDo` on its logger."""
    for handler in logger.handlers:
        if handler.name == TERMINAL_HANDLER:
            handler.addFilter(JobChatter())
    logger.addHandler(NothingToDo(report))


def end_of_run(results: Path, context: str, target_files: Iterable[str]) -> str:
    """For each folder of `results` holding a requested target's files: its summary and the answer files.

    Only the requested targets' folders are shown, so results an earlier run left for other targets stay
    silent; a folder whose summary names another run's context (its first line) is left out whole, so
    nothing another configuration made is shown as this run's answer.
    """
    folders: dict[Path, list[Path]] = {}
    for name in target_files:
        path = Path(name)
        if path.parent.parent == results and path.name != PUBLISHED:  # the manifest is no answer
            folders.setdefault(path.parent, []).append(path)
    blocks = [_folder_block(folder, files, context) for folder, files in sorted(folders.items())]
    return "".join(block for block in blocks if block)


def _folder_block(folder: Path, files: list[Path], context: str) -> str:
    """The summary (when the folder has one) followed by the folder's answer files, one path a line."""
    summary = folder / "summary.txt"
    text = summary.read_text(errors="replace") if summary.is_file() else ""
    if text and text.splitlines()[0] != context:
        return ""
    answers = [path for path in dict.fromkeys(files) if path != summary]
    lines = [f"{summary}:", text.rstrip("\n")] if text else []
    lines += ["answer files:", *(f"  {path}" for path in answers)]
    return "\n".join(lines) + "\n"
