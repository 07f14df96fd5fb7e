from accubisect.precision_bisect import run_probe
from accubisect.workflow import run_step

run_step(run_probe, snakemake)  # noqa: F821 (injected by Snakemake)
