from accubisect.formats.published import publish
from accubisect.workflow.step import run_step

run_step(publish, snakemake)  # noqa: F821 (injected by Snakemake)
