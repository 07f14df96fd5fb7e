from accubisect.precision_bisect import plan_round
from accubisect.workflow import run_step

run_step(plan_round, snakemake)  # noqa: F821 (injected by Snakemake)
