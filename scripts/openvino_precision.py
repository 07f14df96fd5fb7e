from accubisect.bisection.openvino_precision import bisect_openvino_precision
from accubisect.workflow.step import run_step

if __name__ == "__main__":  # the probes' child process imports this module again
    run_step(bisect_openvino_precision, snakemake)  # noqa: F821 (injected by Snakemake)
