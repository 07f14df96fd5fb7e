from accubisect.bisection.reduce import reduce
from accubisect.workflow.step import run_step

run_step(reduce, snakemake)  # noqa: F821 (injected by Snakemake)
