"""Workflow edge: the plan, workspace layout, cluster resources, the CLI and the Snakemake adapter."""
