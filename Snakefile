# accubisect: compile an ONNX model with fusion on and off, dump every op, map fused nodes back to the
# original graph, compare op by op, and bisect the fusion rules that break accuracy.
# Targets: all (default), compile, graph, dump, compare, fusion_bisect, bundle, precision, precision_bisect,
# precision_finalize.
# No configfile: a run is configured by --configfile FILE and/or --config key=value only, over the schema's
# defaults, so no example setting leaks into it. The bundled example: --configfile examples/config.yaml.
from snakemake.utils import min_version

min_version("9.0")


include: "rules/common.smk"
include: "rules/compile.smk"
include: "rules/graph.smk"
include: "rules/dump.smk"
include: "rules/compare.smk"
include: "rules/fusion_bisect.smk"
include: "rules/bundle.smk"
include: "rules/precision.smk"
include: "rules/precision_bisect.smk"


rule all:
    default_target: True
    input:
        rules.compare.input,
        rules.fusion_bisect.input,


# The terminal shows the jobs' own lines and errors; Snakemake's job chatter goes only to its log file
# (.snakemake/log/). Every successful run, cached or not, ends with the requested answers (README, "Console").
from accubisect.reports import console
from accubisect.reports.run_context import context_line


def print_end_of_run():
    files = [str(path) for job in workflow.dag.targetjobs for path in (*job.input, *job.output)]
    print(console.end_of_run(RESULTS, context_line(**CONTEXT), files), end="", flush=True)


if workflow.is_main_process and not workflow.output_settings.dryrun:
    console.quiet_terminal(logger, print_end_of_run)


onsuccess:
    print_end_of_run()
