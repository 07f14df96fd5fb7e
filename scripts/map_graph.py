from accubisect.stages.graph import write_graph
from accubisect.workflow.step import run_step

run_step(write_graph, snakemake)  # noqa: F821 (injected by Snakemake)
