from accubisect.bisection.jobs import write_result
from accubisect.workflow.step import run_step

run_step(write_result, snakemake)  # noqa: F821 (injected by Snakemake)
