"""The reference range of chosen tensors: their largest finite magnitude on each sample when the user's model
runs in fp32 with optimizations off, so under its own tensor names. The model runs once per sample and batch
of tensors (`dump.tensor_batches`, sized by `batch_limit` from issue 22's memory target), keeping only the
maxima: memory follows a batch, not every tensor measured. Each batch gets a session of its own, which exposes
that batch alone and runs every sample: ORT holds each output a session exposes until a run ends, asked for or
not (one session exposing all 672 tensors of the OCR detector at 640x640, 663 MiB, peaked 743 MiB above the
job's start whichever batch a run asked for). The deploy job reads it to see which tensors a configuration
stores beyond its low type's range (`deployable.py`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from accubisect.core.tensor_sizes import tensor_bytes
from accubisect.formats.model import model_bytes
from accubisect.runtime.backends import Backend
from accubisect.runtime.ort_exposed import ExposedSession
from accubisect.stages.dump import BATCH_BYTES, tensor_batches


def reference_ranges(model: onnx.ModelProto, names: Iterable[str], feeds: Sequence[Mapping[str, np.ndarray]],
                     backend: Backend, threads: int | None, weights: Path) -> dict[str, list[float]]:
    """Per tensor of `names`: its largest finite |x| on each sample of `feeds`, in order (0 where it holds no
    finite value). `weights`: the folder of `model`'s external data, read without its weights."""
    wanted = list(dict.fromkeys(names))
    outputs = [value.name for value in model.graph.output]
    ranges: dict[str, list[float]] = {name: [] for name in wanted}
    if not feeds:
        return ranges
    sizes = tensor_bytes(model, {name: array.shape for name, array in feeds[0].items()})
    batches = tensor_batches(wanted, outputs, sizes, batch_limit(model, sizes))
    for batch in batches:
        asked = [name for name in batch if name not in feeds[0]]
        session = ExposedSession(model, asked, backend, threads, weights) if asked else None
        for sample in feeds:
            tensors = {**(session.infer(sample, asked) if session else {}), **sample}
            for name in batch:
                ranges[name].append(largest_finite(tensors[name]))
            del tensors
        del session  # its outputs' memory, before the next batch's session
    return ranges


def batch_limit(model: onnx.ModelProto, sizes: Mapping[str, int]) -> int:
    """Bytes of tensors one run returns: what issue 22's memory target (the job's imports + 1.5 x the model + 7 x
    the largest tensor pair) leaves once ORT holds the weights (1 x the model) and a batch is held twice (ORT's
    output values, then the arrays measured), at most the dump's BATCH_BYTES. A fixed 256 MiB ran a model of a
    few MB once, holding every tensor measured at once; a model of 1 GB or more still runs once per 256 MiB."""
    largest = max(sizes.values(), default=0)
    return min(BATCH_BYTES, (model_bytes(model) // 2 + 14 * largest) // 2)


def largest_finite(array: np.ndarray) -> float:
    """The largest finite |x| of a float array (0 where it holds none), in its own dtype: no float64 copy."""
    magnitudes = np.abs(np.asarray(array))
    finite = magnitudes[np.isfinite(magnitudes)]
    return float(finite.max()) if finite.size else 0.0
