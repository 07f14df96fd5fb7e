"""`run_step`, the edge every `scripts/*.py` goes through, given Snakemake's own `snakemake` object (built
from Snakemake's containers as a job builds them, not a stand-in): the step function gets one record of the
rule's named files, typed as its fields say, and its params; a rule whose names differ from the record's
fails naming both; its log lines reach the rule's log file, a user error ends the job with exit status 1 and
one line, anything else with a traceback in the log, and an input another run is re-creating is waited for; a
disk that refuses a write and Ctrl-C end the job with one line too."""

import logging
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from snakemake.io import IOFile
from snakemake.iocontainers import InputFiles, Log, OutputFiles, Params, ResourceList, Wildcards
from snakemake.script import Snakemake

from accubisect.core.errors import SampleError, StepError
from accubisect.formats.files import write_json
from accubisect.formats.step import Step
from accubisect.workflow.step import run_step


@dataclass(frozen=True)
class Nothing(Step):
    """The record of a rule that names no file and no param."""


@dataclass(frozen=True)
class Compiled(Step):
    record: Path


@dataclass(frozen=True)
class Summarise(Step):
    """A step record as a stage declares one: typed files and params by the rule's names."""

    report: Path
    dumps: tuple[Path, ...]
    summary: Path
    accuracy: Mapping[str, Any]
    names: tuple[str, ...]
    threads: int | None = None
    graph: Path | None = None


def named_list(kind, **named):
    """A Snakemake Namedlist as a job holds it: every item in one flat list, each name a slice (a list
    value) or one item."""
    items, spans = [], {}
    for name, value in named.items():
        values = value if isinstance(value, list) else [value]
        spans[name] = (len(items), len(items) + len(values) if isinstance(value, list) else None)
        items += values
    made = kind(toclone=items)
    for name, (start, end) in spans.items():
        made._set_name(name, start, end)
    return made


def job(tmp_path, inputs, outputs, params, log=True):
    files = lambda names: {k: [IOFile(str(tmp_path / p)) for p in v] if isinstance(v, list)  # noqa: E731
                           else IOFile(str(tmp_path / v)) for k, v in names.items()}
    logs = named_list(Log, log=IOFile(str(tmp_path / "step.log"))) if log else Log()
    return Snakemake(named_list(InputFiles, **files(inputs)), named_list(OutputFiles, **files(outputs)),
                     named_list(Params, **params), Wildcards(), 1, ResourceList(), logs, {}, "step", None)


@pytest.fixture(autouse=True)
def root_logger():
    """run_step configures the root logger and Ctrl-C, as a job's process does; put pytest's back after."""
    root = logging.getLogger()
    handlers, level, interrupt = root.handlers[:], root.level, signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, interrupt)
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


def test_the_step_gets_one_record_of_typed_files_and_params(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    for name in ("a.h5", "b.h5"):
        (tmp_path / name).write_text("")
    seen = []

    def summarise(step: Summarise) -> None:
        seen.append(step)

    params = {"accuracy": {"rtol": 0.001}, "threads": 2, "names": ["y"]}
    run_step(summarise, job(tmp_path, {"report": "report.json", "dumps": ["a.h5", "b.h5"]},
                           {"summary": "summary.txt"}, params))
    dumps = (tmp_path / "a.h5", tmp_path / "b.h5")
    assert seen == [Summarise(tmp_path / "report.json", dumps, tmp_path / "summary.txt", {"rtol": 0.001}, ("y",), 2)]
    assert seen[0].graph is None  # a field with a default the rule does not give


def test_one_file_given_for_a_list_of_files_is_a_list_of_one(tmp_path):
    (tmp_path / "a.h5").write_text("")
    assert Summarise.from_named({"report": "r", "dumps": str(tmp_path / "a.h5"), "summary": "s", "accuracy": {},
                                 "names": "y", "graph": None}).dumps == (tmp_path / "a.h5",)


@pytest.mark.parametrize("names, words", [
    ({"report": "r", "dumps": [], "summary": "s", "accuracy": {}, "names": [], "sumary": "s"}, "['sumary']"),
    ({"report": "r", "dumps": [], "accuracy": {}, "names": []}, "lacks ['summary']"),
])
def test_a_rule_whose_names_differ_from_its_step_record_fails_naming_them(tmp_path, names, words):
    """A wiring mistake, not a user's: it fails with its traceback in the log, naming the names."""
    def summarise(step: Summarise) -> None:
        raise AssertionError("not reached")

    with pytest.raises(StepError, match=re.escape(words)):
        run_step(summarise, job(tmp_path, {}, {}, names))
    assert "Traceback" in (tmp_path / "step.log").read_text()


def test_a_function_not_taking_a_step_record_is_refused(tmp_path):
    def untyped(step) -> None:
        raise AssertionError("not reached")

    with pytest.raises(StepError, match="untyped: a step function takes one parameter annotated with its Step"):
        run_step(untyped, job(tmp_path, {}, {}, {}))


def test_the_steps_log_lines_go_to_the_rules_log_file_and_stderr(tmp_path, capsys):
    def step(_: Nothing) -> None:
        logging.getLogger("accubisect.stages.compare").info("compared %d tensors", 9)

    run_step(step, job(tmp_path, {}, {}, {}))
    assert (tmp_path / "step.log").read_text() == "INFO accubisect.stages.compare: compared 9 tensors\n"
    assert "INFO accubisect.stages.compare: compared 9 tensors" in capsys.readouterr().err


def test_a_user_error_ends_the_job_with_status_1_and_one_line(tmp_path, capsys):
    def step(_: Nothing) -> None:
        raise SampleError("samples/sample0_inputs.npz: input 'x' is missing; add it")

    with pytest.raises(SystemExit) as ended:
        run_step(step, job(tmp_path, {}, {}, {}))
    assert ended.value.code == 1
    line = "ERROR accubisect: samples/sample0_inputs.npz: input 'x' is missing; add it\n"
    assert (tmp_path / "step.log").read_text() == line
    assert capsys.readouterr().err == line


def test_any_other_error_is_raised_with_its_traceback_in_the_log(tmp_path):
    def broken_step(_: Nothing) -> None:
        raise KeyError("tensors")

    with pytest.raises(KeyError):
        run_step(broken_step, job(tmp_path, {}, {}, {}))
    written = (tmp_path / "step.log").read_text()
    assert written.startswith("ERROR accubisect: broken_step failed\nTraceback (most recent call last):")
    assert written.rstrip().endswith("KeyError: 'tensors'")


def test_a_rule_without_a_log_logs_to_stderr_only(tmp_path, capsys):
    def step(_: Nothing) -> None:
        logging.getLogger("accubisect").info("done")

    run_step(step, job(tmp_path, {}, {}, {}, log=False))
    assert capsys.readouterr().err == "INFO accubisect: done\n"
    assert not (tmp_path / "step.log").exists()


def test_an_input_another_run_is_re_creating_is_waited_for(tmp_path):
    """On a shared workspace, Snakemake in another run deletes a stage file before re-creating it."""
    late = tmp_path / "compile.json"
    threading.Timer(0.3, late.write_text, args=("{}",)).start()
    start, seen = time.monotonic(), []
    def step(files: Compiled) -> None:
        seen.append(files.record.read_text())

    run_step(step, job(tmp_path, {"record": "compile.json"}, {}, {}))
    assert seen == ["{}"] and time.monotonic() - start < 5
    assert (tmp_path / "step.log").read_text().startswith(f"INFO accubisect: waiting for {late}\n")


@dataclass(frozen=True)
class Written(Step):
    summary: Path


@pytest.fixture
def file_size_limit():
    """RLIMIT_FSIZE at 64 KiB, as `ulimit -f 64` sets it: the kernel refuses a write past it (EFBIG, with
    SIGXFSZ ignored as a shell's job would not be); any user can lower it and put it back."""
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, limits[1]))
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, handler)


def test_a_write_the_disk_refuses_ends_the_job_with_one_line_naming_the_folder(tmp_path, capsys, file_size_limit):
    def step(files: Written) -> None:
        write_json(files.summary, {"values": list(range(100_000))})

    with pytest.raises(SystemExit) as ended:
        run_step(step, job(tmp_path, {}, {"summary": "out/summary.json"}, {}))
    assert ended.value.code == 1
    line = (f"ERROR accubisect: {tmp_path / 'out'}: File too large; a file outgrew the file size limit: raise it "
            "(ulimit -f) or free space, and rerun\n")
    assert capsys.readouterr().err == line and (tmp_path / "step.log").read_text() == line
    assert not list((tmp_path / "out").iterdir())  # the half-written file is gone


INTERRUPTED_JOB = """
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from test_run_step import Nothing, job
from accubisect.workflow.step import run_step

def step(_: Nothing) -> None:
    threading.Thread(target=time.sleep, args=(60,)).start()  # a probe still running in the round's pool
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)

run_step(step, job(__import__("pathlib").Path(sys.argv[2]), {}, {}, {}))
"""


def test_ctrl_c_ends_the_job_at_once_with_status_130_and_one_line(tmp_path):
    """A real SIGINT while a probe thread still runs: the job does not wait for it, nor print a traceback."""
    start = time.monotonic()
    ended = subprocess.run([sys.executable, "-c", INTERRUPTED_JOB, str(Path(__file__).parent), str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    assert ended.returncode == 130 and time.monotonic() - start < 30, ended.stderr
    line = ("ERROR accubisect: interrupted (Ctrl-C): finished stages and verdicts are kept; run the same command "
            "again to go on from them\n")
    assert ended.stderr == line and (tmp_path / "step.log").read_text() == line
