# Validates the config and plans every stage's content-addressed path before any job runs. Every path comes
# from the plan or from formats/paths.py: a rule's output is stage_dir(WS, "<stage>") / "<file>" (the key a
# wildcard); a target's answer files are published together by one job, whose output is the folder's manifest
# published_dir(RESULTS, "<target>") / PUBLISHED (formats/published.py).
# Planning and aggregating rules are `localrules`; the stages below ask a cluster for RESOURCES.
import sys

from accubisect.stages.disk import estimate_line
from accubisect.core.errors import AccubisectError
from accubisect.formats.paths import KEY_PATTERN, PUBLISHED, published_dir, stage_dir
from accubisect.workflow.plan import CANDIDATE, REDUCED, REFERENCE, Plan, dump_options
from accubisect.workflow.step import cancel_scheduler_timers
from accubisect.workflow.writable import unwritable_line
from accubisect.reports import console
from accubisect.reports.run_context import (
    LINE_FIELDS,
    compare_context,
    invocation,
    line_of,
    run_context,
)

try:
    PLAN = Plan.from_config(config)
except AccubisectError as error:
    sys.exit(f"accubisect: {error}")

if workflow.is_main_process:  # not again in each job process that re-reads the Snakefile
    DISK_WARNING = estimate_line(PLAN.workspace, PLAN.model, PLAN.dumps, dump_options(PLAN.config))
    if DISK_WARNING:
        print(DISK_WARNING, file=sys.stderr)
    if PLAN.inputs.shape_warning:
        print(f"WARNING accubisect: {PLAN.inputs.shape_warning}", file=sys.stderr)

WS = PLAN.workspace
RESOURCES = PLAN.resources()
RESULTS = PLAN.results
# What the run was made from, as params: the first line of every summary, the header of every page, and how
# snakemake was called (a bisect page's command to apply its answer); a compare job gets compare_context's part.
CONTEXT = run_context(
    PLAN.config,
    len(PLAN.samples),
    PLAN.model_sha256,
    invocation(workflow.config_settings.configfiles, workflow.config_settings.config),
)
# Only the summary's first line, for jobs that write a summary and no page: another config section or command
# line does not rerun them.
LINE_CONTEXT = {key: CONTEXT[key] for key in LINE_FIELDS}
VARIANTS = [REFERENCE, CANDIDATE]


wildcard_constraints:
    key=KEY_PATTERN,


# The terminal shows the jobs' own lines and errors; Snakemake's job chatter goes only to its log file
# (.snakemake/log/). Every successful run, cached or not, ends with the requested answers (docs/reports.md, "Console").
def print_end_of_run():
    files = [str(path) for job in workflow.dag.targetjobs for path in (*job.input, *job.output)]
    print(console.end_of_run(RESULTS, line_of(CONTEXT), files), end="", flush=True)


if workflow.is_main_process and not workflow.output_settings.dryrun:
    console.quiet_terminal(logger, print_end_of_run)


# A folder the jobs will write that refuses writes (read-only, full) ends the run here, in one line, before
# Snakemake prepares a job (removing its old outputs: Snakemake's own traceback). Snakemake calls onstart only
# when there are jobs to run, so a read-only project with everything cached still shows its answers.
def refuse_unwritable_folders():
    outputs = [str(path) for job in workflow.dag.needrun_jobs() for path in job.output]
    line = unwritable_line(outputs)
    if line:
        sys.exit(f"accubisect: {line}")


# A job whose backend lacks a capability it needs (fusion rules, a node run alone, nodes kept in fp32: the
# backend contract, runtime/backends.py) ends the run here too, in one line, before any job runs.
def refuse_what_the_backend_cannot_run():
    line = PLAN.refusal(job.rule.name for job in workflow.dag.needrun_jobs())
    if line:
        sys.exit(f"accubisect: {line}")


onstart:
    refuse_unwritable_folders()
    refuse_what_the_backend_cannot_run()
