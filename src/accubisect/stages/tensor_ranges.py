"""The reference range of chosen tensors: their largest finite magnitude on each sample when the user's model
runs in fp32 with optimizations off, so under its own tensor names. The model runs once per sample and batch
of tensors (`dump.tensor_batches`), keeping only the maxima: memory follows a batch, as in a dump. The deploy
job reads it to see which tensors a configuration stores beyond its low type's range (`deployable.py`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from accubisect.core.tensor_sizes import tensor_bytes
from accubisect.runtime.backends import Backend
from accubisect.runtime.ort_exposed import run_exposed
from accubisect.stages.dump import tensor_batches


def reference_ranges(model: onnx.ModelProto, names: Iterable[str], feeds: Sequence[Mapping[str, np.ndarray]],
                     backend: Backend, threads: int | None, weights: Path) -> dict[str, list[float]]:
    """Per tensor of `names`: its largest finite |x| on each sample of `feeds`, in order (0 where it holds no
    finite value). `weights`: the folder of `model`'s external data, read without its weights."""
    wanted = list(dict.fromkeys(names))
    outputs = [value.name for value in model.graph.output]
    sizes = tensor_bytes(model, {name: array.shape for name, array in feeds[0].items()}) if feeds else {}
    ranges: dict[str, list[float]] = {name: [] for name in wanted}
    for sample in feeds:
        for batch in tensor_batches(wanted, outputs, sizes):
            tensors, _ = run_exposed(model, batch, dict(sample), backend, threads, weights)
            for name in batch:
                ranges[name].append(largest_finite(tensors[name]))
    return ranges


def largest_finite(array: np.ndarray) -> float:
    """The largest finite |x| of a float array (0 where it holds none), in its own dtype: no float64 copy."""
    magnitudes = np.abs(np.asarray(array))
    finite = magnitudes[np.isfinite(magnitudes)]
    return float(finite.max()) if finite.size else 0.0
