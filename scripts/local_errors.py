from accubisect.stages.local_error import local_errors
from accubisect.workflow.step import run_step

run_step(local_errors, snakemake)  # noqa: F821 (injected by Snakemake)
