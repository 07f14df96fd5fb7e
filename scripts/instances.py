from accubisect.bisection.instances import fusion_instances
from accubisect.workflow.step import run_step

run_step(fusion_instances, snakemake)  # noqa: F821 (injected by Snakemake)
