from accubisect.stages.precision_stage import fusion_local_errors
from accubisect.workflow.step import run_step

run_step(fusion_local_errors, snakemake)  # noqa: F821 (injected by Snakemake)
