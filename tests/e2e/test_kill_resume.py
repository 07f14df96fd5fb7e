"""kill -9 a running bisection at random moments, rerun it as docs/recovery.md says, get the same answer.

One copy of the workflow per target, reused across kills. An uninterrupted run gives the reference answer
and the run's duration; uninterrupted runs after deleting only the bisection's folders, and only results/,
give the durations of those shorter runs (and must give the same answer). Then each round deletes results/
and, by turns, the whole workspace, the bisection's folders or nothing more, so that kills land in
compile, dump, compare, the search jobs and publishing; starts the run in its own
process group; kill -9s the whole group after a seeded random time drawn over that run's duration; and
reruns the way docs/recovery.md says: `snakemake --unlock` where the killed run left its lock, then the plain
command (profiles/default adds --rerun-incomplete). The rerun must exit 0 without a traceback, leave no
`.part` file under results/, and publish the reference answer byte for byte (result.json: every field but
the probes' `seconds`, their wall time, and `from_disk`, which says a resumed search found the verdict).

Marked slow (excluded by the default run): `./run test` runs it as its second pytest invocation. The table
of kills (time, the jobs running at the kill, the rerun's time) is printed: `pytest -m slow -rP ...`.
"""

from __future__ import annotations

import base64
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE, copy_workflow

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

KILLS = 10  # per target: 20 in all
SPARE_ROUNDS = 6  # rounds whose run ends before its kill time do not count; at most this many
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Target:
    name: str
    config: tuple[str, ...]
    results: str  # the config's results folder
    answers: tuple[str, ...]  # published files compared with the reference
    bisection: tuple[str, ...]  # workspace folders of the bisection alone
    # What each round deletes besides results/, by turns: everything ("workspace": kills land anywhere from
    # compile to publishing), the bisection's folders ("bisection": its search and verdicts), nothing ("results").
    rounds: tuple[str, ...]


FUSION = Target("fusion_bisect", EXAMPLE, "results",
                ("fusion_bisect/fusion_switch.cfg", "fusion_bisect/result.json", "fusion_bisect/summary.txt"),
                ("fusion_bisect", "probe"), ("workspace", "bisection", "results", "workspace", "bisection"))
PRECISION = Target("precision_bisect", ("--configfile", "examples/precision/config.yaml"), "results/precision_example",
                   ("precision_bisect/keep_dtype.txt", "precision_bisect/modify_mixlist.json",
                    "precision_bisect/result.json", "precision_bisect/summary.txt"),
                   ("precision_bisect", "precision_probe"),  # the search job's 18 probes: kill there most
                   ("bisection", "workspace", "bisection", "results", "bisection"))


@dataclass(frozen=True)
class Kill:
    deleted: str  # what the round deleted (Target.rounds)
    at: float  # seconds after the start
    running: tuple[str, ...]  # rules of the jobs running at the kill; () before the first job
    started: bool  # whether any job had started
    landed: bool  # False: the run had finished before its kill time
    unlock: bool  # the killed run left its lock: the rerun needed `snakemake --unlock` first
    incomplete: int  # outputs marked incomplete that exist: a rerun without --rerun-incomplete stops on them
    rerun: float  # seconds: unlock and rerun

    @property
    def stage(self) -> str:
        if not self.landed:
            return "finished before the kill"
        if not self.running:
            return "between jobs" if self.started else "startup (parse, DAG)"
        return "+".join(f"{rule}x{n}" if n > 1 else rule for rule, n in sorted(Counter(self.running).items()))


def command(target: Target) -> list[str]:
    return [sys.executable, "-m", "snakemake", target.name, *target.config, "--cores", "2"]


def run(folder: Path, arguments: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    result = subprocess.run(arguments, check=False, cwd=folder, env=ENV, capture_output=True, text=True, timeout=600)
    return result, time.perf_counter() - start


def answers(folder: Path, target: Target) -> dict[str, bytes]:
    """The published answer; result.json without any probe's wall time and whether it was on disk (the
    search's probes and the deploy job's)."""
    found = {}
    for name in target.answers:
        data = (folder / target.results / name).read_bytes()
        if name.endswith("result.json"):
            data = json.dumps(without_timings(json.loads(data)), indent=1).encode()  # NaN stays "NaN": as text
        found[name] = data
    return found


def without_timings(value: object) -> object:
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in ("seconds", "from_disk")}
    if isinstance(value, list):
        return [without_timings(item) for item in value]
    return value


def check_rerun(result: subprocess.CompletedProcess, folder: Path, target: Target, reference: dict[str, bytes],
                what: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{what}: the rerun failed:\n{output[-4000:]}"
    assert "Traceback" not in output, f"{what}: the rerun printed a traceback:\n{output[-4000:]}"
    parts = sorted(str(p.relative_to(folder)) for p in (folder / "results").rglob("*.part"))
    assert not parts, f"{what}: .part files left under results/: {parts}"
    got = answers(folder, target)
    for name, data in reference.items():
        diff = difflib.unified_diff(data.decode(errors="replace").splitlines(),
                                    got[name].decode(errors="replace").splitlines(), "reference", "rerun", lineterm="")
        assert got[name] == data, f"{what}: {name} differs from the uninterrupted run's:\n" + "\n".join(
            list(diff)[:40])


def delete(folder: Path, target: Target, what: str) -> None:
    shutil.rmtree(folder / "results", ignore_errors=True)
    if what == "workspace":
        shutil.rmtree(folder / "workspace", ignore_errors=True)
    elif what == "bisection":
        for name in target.bisection:
            shutil.rmtree(folder / "workspace" / name, ignore_errors=True)


START = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+)")


def running_jobs(log: str) -> tuple[tuple[str, ...], bool]:
    """The rules of the jobs a Snakemake log shows started and not finished, and whether any started."""
    running: dict[str, str] = {}
    rule, started = None, False
    for line in log.splitlines():
        if match := START.match(line):
            rule, started = match[1], True
        elif rule and (match := JOBID.match(line)):
            running[match[1]], rule = rule, None
        elif match := FINISHED.match(line):
            running.pop(match[1], None)
    return tuple(sorted(running.values())), started


def incomplete_outputs(folder: Path) -> int:
    """Existing files Snakemake's metadata marks incomplete (.snakemake/incomplete/<urlsafe base64 of the path,
    cut into folders named @...>); only a figure for the report, so unreadable markers are skipped."""
    root = folder / ".snakemake" / "incomplete"
    count = 0
    for marker in root.rglob("*") if root.is_dir() else ():
        if marker.is_file():
            encoded = "".join(part.lstrip("@") for part in marker.relative_to(root).parts)
            try:
                count += (folder / base64.urlsafe_b64decode(encoded).decode()).exists()
            except ValueError:
                continue
    return count


def kill_at(folder: Path, target: Target, delay: float) -> tuple[float | None, str]:
    """Start the run in its own process group and kill -9 the group after `delay` s. Returns the run's
    duration if it finished first (None if the kill landed) and the log Snakemake wrote (its console leaves
    the job lines out), empty if it was killed before writing one."""
    logs = folder / ".snakemake" / "log"
    earlier = set(logs.glob("*.snakemake.log"))
    start = time.perf_counter()
    proc = subprocess.Popen(command(target), cwd=folder, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=delay)
        finished = time.perf_counter() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        finished = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the jobs die with the group; wait until none is left
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    written = sorted(set(logs.glob("*.snakemake.log")) - earlier)
    return finished, written[-1].read_text() if written else ""


def report(target: Target, durations: dict[str, float], kills: list[Kill]) -> str:
    landed = [k for k in kills if k.landed]
    lines = [f"{target.name}: {len(landed)} kills, every rerun exit 0 with the reference answer; uninterrupted runs "
             + ", ".join(f"{what} {seconds:.1f} s" for what, seconds in durations.items()),
             f"  {'#':>2}  {'deleted':<9}  {'kill at':>7}  {'lock':<4}  {'incompl':>7}  {'rerun':>7}  "
             "running at the kill"]
    for i, k in enumerate(kills, 1):
        lines.append(f"  {i:>2}  {k.deleted:<9}  {k.at:>5.1f} s  {'yes' if k.unlock else 'no':<4}  {k.incomplete:>7}  "
                     f"{k.rerun:>5.1f} s  {k.stage}")
    stages = Counter(rule for k in landed for rule in (k.running or (k.stage,)))
    lines.append(f"  jobs hit: {dict(sorted(stages.items()))}; locks left {sum(k.unlock for k in landed)}, "
                 f"kills that left a file marked incomplete (a rerun without --rerun-incomplete stops) "
                 f"{sum(k.incomplete > 0 for k in landed)}, "
                 f"rerun mean {np.mean([k.rerun for k in landed]):.1f} s, max {max(k.rerun for k in landed):.1f} s")
    return "\n".join(lines)


@pytest.mark.parametrize("target", [FUSION, PRECISION], ids=lambda t: t.name)
def test_kill_9_then_rerun_gives_the_same_answer(tmp_path, target):
    folder = copy_workflow(tmp_path / "workflow")
    durations: dict[str, float] = {}
    result, durations["workspace"] = run(folder, command(target))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reference = answers(folder, target)
    for what in ("bisection", "results"):  # the shorter runs later rounds kill, uninterrupted
        delete(folder, target, what)
        result, durations[what] = run(folder, command(target))
        check_rerun(result, folder, target, reference, f"uninterrupted run after deleting {what}")

    measured = dict(durations)
    rng = np.random.default_rng(0)
    kills: list[Kill] = []
    for i in range(KILLS + SPARE_ROUNDS):
        if sum(k.landed for k in kills) == KILLS:
            break
        what = target.rounds[i % len(target.rounds)]
        delete(folder, target, what)
        delay = float(rng.uniform(0, durations[what]))
        finished, log = kill_at(folder, target, delay)
        landed = finished is None
        if not landed:  # a shared machine runs faster or slower by turns: draw over the latest duration
            durations[what] = finished
        running, started = running_jobs(log)
        unlock = any((folder / ".snakemake" / "locks").glob("*.lock"))
        incomplete = incomplete_outputs(folder)
        start = time.perf_counter()
        if unlock:  # docs/recovery.md: after a hard kill, `snakemake --unlock`, then the same command again
            unlocked, _ = run(folder, [*command(target), "--unlock"])
            assert unlocked.returncode == 0, unlocked.stderr[-3000:]
        result, _ = run(folder, command(target))
        kill = Kill(what, delay, running, started, landed, unlock, incomplete, time.perf_counter() - start)
        kills.append(kill)
        check_rerun(result, folder, target, reference, f"kill {i + 1} ({what}, at {delay:.1f} s, {kill.stage})")
    print(report(target, measured, kills))
    assert sum(k.landed for k in kills) == KILLS, report(target, measured, kills)
