from accubisect.files import publish
from accubisect.workflow import run_step

run_step(publish, snakemake)  # noqa: F821 (injected by Snakemake)
