from accubisect.bisection.jobs import run_search
from accubisect.workflow.step import run_step

run_step(run_search, snakemake)  # noqa: F821 (injected by Snakemake)
