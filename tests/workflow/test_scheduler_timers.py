"""The Snakefile's onsuccess/onerror cancel the timers Snakemake's scheduler left armed, so the run exits at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLE, copy_workflow, snakemake

from accubisect.workflow.step import cancel_scheduler_timers

# The scheduler arms a timer of the rate limiter's timespan on every pass; this one would keep a run that does
# not cancel it alive for a minute after its last job.
TIMESPAN = ("--max-jobs-per-timespan", "100/60s")
PROMPT = 40  # seconds a run of the example's compare may take, far below the timespan


def test_an_armed_timer_is_cancelled_and_never_fires():
    fired = threading.Event()
    timer = threading.Timer(30, fired.set)
    timer.start()
    cancel_scheduler_timers()
    timer.join(5)
    assert not timer.is_alive() and not fired.is_set()


@pytest.mark.e2e
def test_a_run_exits_without_waiting_for_the_rate_limiters_timer_on_success_and_on_error(tmp_path: Path):
    """The Snakefile's hooks themselves: without `cancel_scheduler_timers` in onsuccess (or onerror) the run
    would end a timespan after its last scheduler pass."""
    folder = copy_workflow(tmp_path)
    start = time.perf_counter()
    snakemake(folder, "compare", *EXAMPLE, *TIMESPAN)
    assert time.perf_counter() - start < PROMPT
    (folder / "failing_check.py").write_text("def check(reference, candidate):\n    raise RuntimeError('no')\n")
    config = yaml.safe_load((folder / "examples/config.yaml").read_text())
    config["accuracy"] = {**config["accuracy"], "val_func": "failing_check:check"}
    (folder / "failing.yaml").write_text(yaml.safe_dump(config))
    start = time.perf_counter()
    failed = snakemake(folder, "compare", "--configfile", "failing.yaml", *TIMESPAN, check=False)
    assert failed.returncode != 0 and time.perf_counter() - start < PROMPT, failed.stderr[-2000:]
