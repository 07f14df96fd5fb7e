"""What each stage's job asks a cluster for, estimated from the model's size.

The numbers are deliberately generous estimates, not measurements of the job: ORT holds several copies of
the graph while it optimizes, and a dump holds every exposed activation at once. Override one rule with
`--set-resources dump_sample:mem_mb=64000`. On a GPU backend every stage that runs the model asks for one
GPU (the slurm executor turns `gpu` into `--gpus`); comparing and bundling need none.
"""

from __future__ import annotations

import math


def stage_resources(model_bytes: int, sample_bytes: int, gpus: int) -> dict[str, dict[str, int]]:
    """Per stage: mem_mb, runtime (minutes) and gpu for a model of `model_bytes` and samples of
    `sample_bytes`, where a run of the model needs `gpus` GPUs."""
    model, sample = model_bytes / 2**20, sample_bytes / 2**20

    def ask(memory: float, minutes: float, runs_model: bool = True) -> dict[str, int]:
        return {"mem_mb": int(math.ceil(memory)), "runtime": int(math.ceil(minutes)), "gpu": gpus if runs_model else 0}

    running = 1024 + 4 * model + 256 * sample  # weights, an arena, and activations that scale with the input
    return {
        "compile": ask(1024 + 12 * model, 10 + model / 20),
        "graph": ask(1024 + 12 * model, 15 + model / 5),  # one compile per fired rule
        "dump": ask(running, 10 + model / 50),
        "probe": ask(running, 10 + model / 20),
        "compare": ask(2048 + 64 * sample, 10 + model / 50, runs_model=False),
        "bundle": ask(1024, 10, runs_model=False),
    }
