from accubisect.bundle import make_bundle
from accubisect.workflow import run_step

run_step(make_bundle, snakemake)  # noqa: F821 (injected by Snakemake)
