from accubisect.bisection.precision_bisect import search_nodes
from accubisect.workflow.step import run_step

run_step(search_nodes, snakemake)  # noqa: F821 (injected by Snakemake)
