from accubisect.compare import publish_report
from accubisect.workflow import run_step

run_step(publish_report, snakemake)  # noqa: F821 (injected by Snakemake)
