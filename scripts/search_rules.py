from accubisect.bisection.fusion_bisect import search_rules
from accubisect.workflow.step import run_step

run_step(search_rules, snakemake)  # noqa: F821 (injected by Snakemake)
