"""What each stage's job asks a cluster for: a formula fitted to measured peaks.

Inputs are what the plan knows before anything runs: `m`, the model file's size, and `s`, the largest
sample's inputs file, both in MiB. Per stage (`mem_mb` in MiB, `runtime` in minutes):

    mem_mb  = base + per_model * m + per_sample * s   (+ GPU_HOST_MB where the stage runs the model on a GPU)
    runtime = max(MIN_RUNTIME, 5 + m / model_mib_per_minute + s / sample_mib_per_minute)

- `base` is the interpreter with numpy, h5py, onnx and onnxruntime loaded (75-105 MiB measured) plus headroom.
- `per_model`: a job that runs the model holds the parsed protobuf, the copy with every tensor exposed, its
  serialization and ORT's session (~10x the file); `graph` also compiles the model twice.
- `per_sample` stands for the activations, which the plan cannot see: a dump or a probe holds every exposed
  tensor of a run at once, a comparison a few float64 copies of the largest tensor pair. The largest
  input is the proxy for the largest activation. A network whose activations are far larger than its
  input (a CNN on a small image) is carried by `base` and `per_model`; one with a huge input by this term.

The coefficients are fitted by `bench/resources.py`, which runs the real workflow on the bundled examples,
three corpus models and a 25M-float load model and reads every job's peak (Snakemake's benchmark
`max_rss`, and the job process's VmHWM); they give asks between 1.15x and 2x of each measured peak. The
measured peaks are tabulated in docs/cluster.md ("Resources"). Where a stage runs the model on a GPU, the
process also holds the CUDA libraries and context in host memory: GPU_HOST_MB is an estimate, not
measured here. Override one rule with `--set-resources dump_sample:mem_mb=64000`. Stages that only read
files (compare, bundle) ask for no GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GPU_HOST_MB = 2048  # CUDA, cuDNN and cuBLAS libraries and the context, in host memory (estimate, not measured)
MIN_RUNTIME = 5  # minutes: below that a cluster's scheduling granularity dominates anyway


@dataclass(frozen=True)
class StageCost:
    """One stage's fitted formula (see the module docstring)."""

    base: float  # MiB
    per_model: float  # MiB per MiB of model file
    per_sample: float  # MiB per MiB of the largest sample's inputs
    model_mib_per_minute: float
    sample_mib_per_minute: float
    runs_model: bool = True  # asks for the backend's GPUs

    def mem_mb(self, model: float, sample: float, gpus: int) -> int:
        memory = self.base + self.per_model * model + self.per_sample * sample
        return math.ceil(memory + (GPU_HOST_MB if gpus and self.runs_model else 0))

    def runtime(self, model: float, sample: float) -> int:
        minutes = 5 + model / self.model_mib_per_minute + sample / self.sample_mib_per_minute
        return max(MIN_RUNTIME, math.ceil(minutes))


# Fitted on peaks measured by bench/resources.py (docs/cluster.md, "Resources"). assign_precision uses `dump`
# (one run with every tensor exposed); precision_deploy uses `probe` (one probe at a time, then the model it makes).
STAGES = {
    "compile": StageCost(base=110, per_model=3, per_sample=0, model_mib_per_minute=20, sample_mib_per_minute=math.inf),
    "graph": StageCost(base=90, per_model=12, per_sample=0, model_mib_per_minute=5, sample_mib_per_minute=math.inf),
    "dump": StageCost(base=140, per_model=12, per_sample=8, model_mib_per_minute=20, sample_mib_per_minute=10),
    "local": StageCost(base=160, per_model=13, per_sample=7, model_mib_per_minute=20, sample_mib_per_minute=10),
    "probe": StageCost(base=120, per_model=11, per_sample=18, model_mib_per_minute=20, sample_mib_per_minute=10),
    "compare": StageCost(base=130, per_model=0, per_sample=14, model_mib_per_minute=math.inf,
                         sample_mib_per_minute=10, runs_model=False),
    "bundle": StageCost(base=130, per_model=0, per_sample=6, model_mib_per_minute=math.inf,
                        sample_mib_per_minute=10, runs_model=False),
}


SEARCH_PROBES = 60  # the probes a search with no bisect.max_minutes is given time for


def search_resources(probe: dict[str, int], parallel: int, max_minutes: float | None) -> dict[str, int]:
    """A search job runs `parallel` probes at a time, round after round: memory for each of them, and its
    time budget (or 60 probes' worth) plus one probe's time to finish the round it is in."""
    rounds = math.ceil(SEARCH_PROBES / parallel)
    runtime = math.ceil(max_minutes) + probe["runtime"] if max_minutes else rounds * probe["runtime"]
    return {"mem_mb": parallel * probe["mem_mb"], "runtime": runtime, "gpu": probe["gpu"]}


def stage_resources(model_bytes: int, sample_bytes: int, gpus: int) -> dict[str, dict[str, int]]:
    """Per stage: mem_mb, runtime (minutes) and gpu for a model of `model_bytes` and samples of
    `sample_bytes`, where a run of the model needs `gpus` GPUs."""
    model, sample = model_bytes / 2**20, sample_bytes / 2**20
    return {name: {"mem_mb": cost.mem_mb(model, sample, gpus), "runtime": cost.runtime(model, sample),
                   "gpu": gpus if cost.runs_model else 0}
            for name, cost in STAGES.items()}
