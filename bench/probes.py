"""What Snakemake adds to a bisection's probes, against the same probes in a plain Python loop.

    .venv/bin/python bench/probes.py [--repeat 3]

On a copy of the workflow (as the tests make one) and the bundled precision example, the stages before
the search are run first. Then, each `--repeat` times, best taken:
- workflow: `snakemake <search's result.json>` after deleting the search's files and every verdict, so
  the search job and its result job run in full (Snakemake's start, DAG, job processes, files);
- loop: the same configurations the search probed (its noise floor's included), each reduced as the
  backend runs it, compiled by ONNX Runtime, run on every sample and judged with numpy, in one process
  that has already imported everything;
- resume: `snakemake -n precision_bisect` on the finished workspace, the DAG a resumed run builds, which
  no longer grows with the rounds a search took.
Prints the overhead per probe, (workflow - loop) / probes, against the target of 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import yaml

from accubisect.formats.assignment import Assignment
from accubisect.formats.model import load_compiled
from accubisect.formats.samples import load_arrays, load_golden
from accubisect.runtime.backends import CPU
from accubisect.workflow.plan import Plan

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the workflow copier

from conftest import copy_workflow  # noqa: E402

CONFIG = "examples/precision/config.yaml"
TARGET_OVERHEAD = 0.3  # seconds per probe


def snakemake(folder: Path, *arguments: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", *arguments, "--cores", "2", "--configfile", CONFIG],
                   cwd=folder, check=True, capture_output=True)
    return time.perf_counter() - start


def workflow_search(folder: Path, plan: Plan) -> float:
    shutil.rmtree(plan.bisect_dir("precision"), ignore_errors=True)
    shutil.rmtree(plan.verdict_store("precision").root, ignore_errors=True)
    return snakemake(folder, str(plan.bisect_dir("precision").relative_to(folder) / "result.json"))


def probed_configurations(plan: Plan) -> list[frozenset[str]]:
    record = json.loads((plan.bisect_dir("precision") / "search.json").read_text())
    floor = [frozenset(record["floor"]["kept_fp32"])] if record["floor"] and record["floor"]["verdict"] else []
    return floor + [frozenset(probe["off"]) for probe in record["probes"]]


def plain_loop(plan: Plan, configurations: list[frozenset[str]]) -> float:
    """Reduce, compile, run and judge each configuration, with nothing but ORT and numpy around it."""
    assignment = Assignment.read(plan.precision_dir() / "assignment.json")
    model = load_compiled(plan.compile_dir(plan.precision_base) / "model.onnx")
    tolerance = plan.config["accuracy"]
    samples = [(load_arrays(s.inputs), load_golden(s.outputs)) for s in plan.samples]
    options = ort.SessionOptions()  # as the workflow runs a reduced model: already compiled, quiet
    options.graph_optimization_level, options.log_severity_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL, 3
    start = time.perf_counter()
    for off in configurations:
        reduced = CPU.reduced_model(model, set(assignment.reduced) - off, assignment.dtype, assignment.dtypes)
        session = ort.InferenceSession(reduced.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for inputs, golden in samples:
            outputs = dict(zip(golden, session.run(list(golden), inputs), strict=True))
            mismatch = max(np.mean(~np.isclose(outputs[name], golden[name], tolerance["rtol"], tolerance["atol"]))
                           for name in golden)
            if mismatch > tolerance["ntol"]:
                break
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = copy_workflow(Path(temporary) / "workflow")
        snakemake(folder, "precision_bisect")
        config = {**yaml.safe_load((folder / CONFIG).read_text())}
        plan = Plan.from_config({key: str(folder / value) if key in ("model", "samples", "workspace", "results")
                                 else value for key, value in {"workspace": "workspace", **config}.items()})
        configurations = probed_configurations(plan)
        workflow = min(workflow_search(folder, plan) for _ in range(arguments.repeat))
        loop = min(plain_loop(plan, configurations) for _ in range(arguments.repeat))
        resume = min(snakemake(folder, "-n", "precision_bisect") for _ in range(arguments.repeat))
        rounds = len({probe["round"] for probe in json.loads(
            (plan.bisect_dir("precision") / "search.json").read_text())["probes"]})
    overhead = (workflow - loop) / len(configurations)
    print(f"precision example: {len(configurations)} probes in {rounds} rounds, best of {arguments.repeat}")
    print(f"  workflow (snakemake, search + result jobs) {workflow:6.2f} s")
    print(f"  plain loop (ORT + numpy, one process)      {loop:6.2f} s")
    print(f"  Snakemake overhead per probe               {overhead:6.3f} s   target <= {TARGET_OVERHEAD} s: "
          f"{'PASS' if overhead <= TARGET_OVERHEAD else 'FAIL'}")
    print(f"  DAG of a resumed run (snakemake -n)        {resume:6.2f} s   target <= 5 s, whatever the rounds: "
          f"{'PASS' if resume <= 5 else 'FAIL'}")
    sys.exit(0 if overhead <= TARGET_OVERHEAD and resume <= 5 else 1)


if __name__ == "__main__":
    main()
