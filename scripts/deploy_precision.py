from accubisect.bisection.deployable import deploy_answer
from accubisect.workflow.step import run_step

run_step(deploy_answer, snakemake)  # noqa: F821 (injected by Snakemake)
