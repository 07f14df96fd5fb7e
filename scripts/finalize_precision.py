from accubisect.bisection.deployable import finalize_answer
from accubisect.workflow.step import run_step

run_step(finalize_answer, snakemake)  # noqa: F821 (injected by Snakemake)
