from accubisect.stages.bundle import make_bundle
from accubisect.workflow.step import run_step

run_step(make_bundle, snakemake)  # noqa: F821 (injected by Snakemake)
