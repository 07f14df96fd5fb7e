"""The console: Snakemake's job chatter in its log file only, and the answers printed at the end of every run."""

import logging
import re
from pathlib import Path

import pytest
from conftest import EXAMPLE, EXAMPLE_CONTEXT, copy_workflow, snakemake, snakemake_log

from accubisect.reports.console import JobChatter, NothingToDo, end_of_run, quiet_terminal

CONTEXT = "model m.onnx; 1 sample(s) from s; compile level all; session config none; switch file none; backend ort-cpu"


def record(message: str, level: int = logging.INFO, event: str | None = None) -> logging.LogRecord:
    made = logging.LogRecord("snakemake.logging", level, __file__, 1, message, None, None)
    if event:
        made.event = event
    return made


@pytest.mark.parametrize("chatter", [record("", event="job_info"), record("1 of 18 steps (6%) done", event="progress"),
                                     record("Finished jobid: 4", event="job_finished"),
                                     record("Job stats: ...", event="run_info"),
                                     record("Select jobs to execute..."), record("Execute 2 jobs..."),
                                     record("Building DAG of jobs..."), record("Updating checkpoint dependencies."),
                                     record("DAG of jobs will be updated after completion.")])
def test_job_chatter_is_dropped(chatter):
    assert not JobChatter().filter(chatter)


@pytest.mark.parametrize("outcome", [record("Error in rule compare_dumps: ...", logging.ERROR, "job_error"),
                                     record("Exiting because a job execution failed.", logging.ERROR),
                                     record("some warning", logging.WARNING, "progress"),
                                     record("Nothing to be done (all requested files are present and up to date)."),
                                     record("Complete log(s): /x/.snakemake/log/a.snakemake.log"),
                                     record("Unlocked working directory.")])
def test_errors_and_outcomes_pass(outcome):
    assert JobChatter().filter(outcome)


def test_quiet_terminal_filters_only_the_terminal_handler_and_reports_nothing_to_do():
    logger = logging.getLogger("test_console.snakemake")
    terminal, logfile = logging.StreamHandler(), logging.NullHandler()
    terminal.name = "DefaultStreamHandler"
    logger.handlers, logger.propagate = [terminal, logfile], False
    logger.setLevel(logging.INFO)
    reports = []
    quiet_terminal(logger, lambda: reports.append(1))
    assert [type(f) for f in terminal.filters] == [JobChatter] and not logfile.filters
    logger.info("Select jobs to execute...")
    assert reports == []
    logger.info("Nothing to be done (all requested files are present and up to date).")
    assert reports == [1] and isinstance(logger.handlers[-1], NothingToDo)


def publish(folder: Path, summary: str | None, *names: str) -> list[str]:
    folder.mkdir(parents=True)
    if summary is not None:
        (folder / "summary.txt").write_text(summary)
    for name in names:
        (folder / name).write_text("x")
    return [str(folder / name) for name in (*names, "summary.txt")]


def test_end_of_run_prints_summaries_and_answer_files_of_the_requested_targets(tmp_path):
    results = tmp_path / "results"
    compare = publish(results / "compare", f"{CONTEXT}\ncompare: FAIL\n", "report.json", "report.html")
    publish(results / "precision", f"{CONTEXT}\nprecision: not requested\n", "report.json")
    text = end_of_run(results, CONTEXT, [*compare, str(tmp_path / "workspace" / "compare" / "k" / "report.json")])
    assert text == (f"{results}/compare/summary.txt:\n{CONTEXT}\ncompare: FAIL\nanswer files:\n"
                    f"  {results}/compare/report.json\n  {results}/compare/report.html\n")


def test_end_of_run_leaves_out_a_summary_of_another_configuration(tmp_path):
    results = tmp_path / "results"
    stale = publish(results / "compare", "model other.onnx; ...\ncompare: PASS\n", "report.json")
    current = publish(results / "fusion_bisect", f"{CONTEXT}\n1 of 9 rules\n", "fusion_switch.cfg")
    text = end_of_run(results, CONTEXT, [*stale, *current])
    assert "other.onnx" not in text and f"{results}/compare" not in text
    assert f"{results}/fusion_bisect/fusion_switch.cfg" in text


def test_end_of_run_prints_the_instance_lines_through_the_bisection_summary(tmp_path):
    results = tmp_path / "results"
    bisect = publish(results / "fusion_bisect",
                     f"{CONTEXT}\n1 of 9 fired rules\nrule R: 1 of 3 instances breaks accuracy: n1\n",
                     "fusion_switch.cfg", "instances.txt")
    (results / "fusion_bisect" / "instances.txt").write_text(f"{CONTEXT}\nrule R: 1 of 3 instances breaks accuracy\n")
    text = end_of_run(results, CONTEXT, bisect)
    assert text == (f"{results}/fusion_bisect/summary.txt:\n{CONTEXT}\n1 of 9 fired rules\n"
                    "rule R: 1 of 3 instances breaks accuracy: n1\nanswer files:\n"
                    f"  {results}/fusion_bisect/fusion_switch.cfg\n  {results}/fusion_bisect/instances.txt\n")


def test_end_of_run_lists_the_files_of_a_target_without_summary(tmp_path):
    results = tmp_path / "results"
    bundle = publish(results / "bundle", None, "compare_bundle.tar.gz")[:1]
    assert end_of_run(results, CONTEXT, bundle) == f"answer files:\n  {results}/bundle/compare_bundle.tar.gz\n"


# Snakemake's job blocks open with "rule <name>:" alone on its line; an answer line may start "rule R: ..."
CHATTER = re.compile(r"(local)?rule \w+:$|\d+ of \d+ steps \(|Finished jobid|Select jobs to execute|Job stats")


@pytest.mark.e2e
def test_the_console_shows_the_answers_every_run_and_the_log_file_the_jobs(tmp_path):
    folder = copy_workflow(tmp_path)
    first = snakemake(folder, "fusion_bisect", *EXAMPLE)
    cached = snakemake(folder, "fusion_bisect", *EXAMPLE)
    assert "Nothing to be done" in cached.stderr
    for run in (first, cached):
        console = run.stdout + run.stderr
        assert not [line for line in console.splitlines() if CHATTER.match(line)], console
        summary = run.stdout.split("results/fusion_bisect/summary.txt:\n", 1)[1].split("answer files:", 1)[0]
        assert summary.startswith(f"{EXAMPLE_CONTEXT}\n1 of 9 fired rules"), run.stdout
        assert "\nrule GeluApproximation: 1 of 1 instances breaks accuracy" in summary, run.stdout
        for answer in ("fusion_switch.cfg", "result.json", "report.html"):
            assert f"  results/fusion_bisect/{answer}\n" in run.stdout
        assert "  results/compare/report.json\n" in run.stdout
    log = snakemake_log(first)
    assert "localrule compile_variant:" in log and "steps (100%) done" in log
