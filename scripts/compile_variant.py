from accubisect.stages.compile_stage import compile_variant
from accubisect.workflow.step import run_step

run_step(compile_variant, snakemake)  # noqa: F821 (injected by Snakemake)
