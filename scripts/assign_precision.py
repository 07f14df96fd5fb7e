from accubisect.stages.precision_stage import assign_precision
from accubisect.workflow.step import run_step

run_step(assign_precision, snakemake)  # noqa: F821 (injected by Snakemake)
