from accubisect.bisection.openvino_fusion import bisect_openvino_fusion
from accubisect.workflow.step import run_step

run_step(bisect_openvino_fusion, snakemake)  # noqa: F821 (injected by Snakemake)
