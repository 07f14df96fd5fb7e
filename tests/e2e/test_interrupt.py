"""Ctrl-C in the middle of a long job: the terminal's SIGINT reaches every process of the run's group, and
the job ends at once with one line and no traceback (`run_step`), Snakemake stops, and what finished is
kept: the rerun reuses the finished search. The job (`fusion_instances`) is made long for real, by a
val_func that takes two seconds per sample once a marker file exists (so the comparison before it runs
at full speed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow, snakemake

from accubisect.workflow.step import INTERRUPTED

pytestmark = pytest.mark.e2e

SLOW_CHECK = """import os
import time

import numpy as np


def check(reference, candidate):
    if os.path.exists("SLOW"):
        time.sleep(2)
    return all(np.allclose(reference[name], candidate[name], rtol=1e-3, atol=1e-4) for name in reference)
"""


# Snakemake's "Terminating processes…" and the job's line share one pipe and can land on one line.
ERROR = "ERROR accubisect: "


def test_ctrl_c_during_the_instance_search_ends_in_one_line_and_keeps_the_rule_search(tmp_path: Path):
    folder = copy_workflow(tmp_path / "project")
    (folder / "slow_check.py").write_text(SLOW_CHECK)
    config = yaml.safe_load((folder / "examples/config.yaml").read_text())
    config["accuracy"] = {**config.get("accuracy", {}), "val_func": "slow_check:check"}
    (folder / "my.yaml").write_text(yaml.safe_dump(config))
    snakemake(folder, "compare", "--configfile", "my.yaml")
    (folder / "SLOW").touch()
    run = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "fusion_bisect", "--configfile", "my.yaml", "--cores", "2"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    running = wait_for_line(folder, "workspace/fusion_bisect/*/instances.log", "fusion_instances round 0", run)
    searched = next(running.parent.glob("search.json")).stat().st_mtime_ns
    os.killpg(run.pid, signal.SIGINT)  # the instance search's probe sleeps through its samples
    output, _ = run.communicate(timeout=120)
    assert run.returncode != 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    lines = output.splitlines()
    errors = {line[line.index(ERROR) :] for line in lines if ERROR in line} | {
        line for line in lines if line.startswith("accubisect: ")
    }
    assert errors == {f"ERROR accubisect: {INTERRUPTED}"}, output
    (folder / "SLOW").unlink()
    snakemake(folder, "fusion_bisect", "--configfile", "my.yaml")
    assert (running.parent / "search.json").stat().st_mtime_ns == searched  # the finished search was kept


def wait_for_line(folder: Path, pattern: str, text: str, run: subprocess.Popen, seconds: float = 120) -> Path:
    """The log file matching `pattern` once it holds `text`: the job is running."""
    deadline = time.monotonic() + seconds
    while not (logs := [path for path in folder.glob(pattern) if text in path.read_text()]):
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            pytest.fail(f"no {pattern} says {text!r}: {run.communicate()[0]}")
        time.sleep(0.1)
    return logs[0]
