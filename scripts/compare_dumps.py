from accubisect.stages.compare import compare_dumps
from accubisect.workflow.step import run_step

run_step(compare_dumps, snakemake)  # noqa: F821 (injected by Snakemake)
