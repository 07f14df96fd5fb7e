from accubisect.graph import write_graph
from accubisect.workflow import run_step

run_step(write_graph, snakemake)  # noqa: F821 (injected by Snakemake)
