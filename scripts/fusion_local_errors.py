from accubisect.precision_stage import fusion_local_errors
from accubisect.workflow import run_step

run_step(fusion_local_errors, snakemake)  # noqa: F821 (injected by Snakemake)
