from accubisect.stages.dump import dump_sample
from accubisect.workflow.step import run_step

run_step(dump_sample, snakemake)  # noqa: F821 (injected by Snakemake)
