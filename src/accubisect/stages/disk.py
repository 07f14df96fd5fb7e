"""How many bytes dumps will take, before they are written: for the workspace warning and the dump stage's
batches. The warning counts the model copies the dumps run as well (graph plus external data files; the
precision stage's reduced model, which references its compiled copy's data file, its graph alone).

Sizes come from shape inference with the samples' concrete input shapes (the npz headers say them,
`core.tensor_sizes`). A dump already written for the same compiled model and sample shapes is measured instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from accubisect.core.tensor_sizes import tensor_bytes
from accubisect.formats.graph_only import graph_only
from accubisect.formats.model import model_bytes
from accubisect.formats.paths import stage_dir, stage_root
from accubisect.formats.samples import npz_signature
from accubisect.stages.dump import DumpOptions

WARN_BYTES = 2 * 10**9  # a run whose missing dumps and model copies would write more than this prints one line first
SHRINK = ("dump.statistics_only: true (statistics and 4096 values per tensor), fewer samples (dump.samples) "
          "or a dump.op_type_filter shrink it")


def dump_bytes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]],
               dump_options: Mapping[str, Any] | None = None) -> int:
    """Bytes one whole dump of `model` would hold for inputs of `input_shapes`: the chosen tensors plus the
    model outputs, as shape inference sizes them (tensors it cannot size are not counted)."""
    options = DumpOptions.from_config(dump_options or {})
    sizes = tensor_bytes(model, input_shapes)
    if options.statistics_only:
        return 0  # about 50 KiB a tensor: never what fills a disk
    names = {*options.tensors(model.graph), *(value.name for value in model.graph.output)}
    return sum(sizes.get(name, 0) for name in names)


def estimate_line(workspace: Path, model: Path, dumps: Mapping[str, Any], dump_options: Mapping[str, Any] | None,
                  limit: int = WARN_BYTES) -> str | None:
    """One line to print before a run whose missing dumps and model copies would write more than `limit`
    bytes, else None.

    `dumps` is the plan's {key: DumpJob}; a dump is missing when `workspace/dump/<key>/dump.h5` does not
    exist. Each missing dump is sized as an existing dump of the same compiled model and sample shapes, or
    else by shape inference on the original `model`'s graph (`graph_only`: no weight read, saved whole or
    not). The models the dumps run are written by the run too: each compiled copy with its weights (in its own
    data file when the model keeps them in one), counted as the model's graph plus its weights
    (`formats.model.model_bytes`), which for a gigabyte model is what fills a disk before any dump does; the
    reduced model adds Casts and hard-links its compiled copy's data file (`save_referencing`), counted as the
    model's graph file."""
    missing = {key: job for key, job in dumps.items() if not _dump_file(workspace, key).is_file()}
    copies = {str(job.model) for job in dumps.values() if not Path(job.model).is_file()}
    if not missing and not copies:
        return None
    graph = graph_only(Path(model))
    precision = stage_root(workspace, "precision").resolve()
    total = _dumps_bytes(workspace, graph, dumps, missing, dump_options) + sum(
        Path(model).stat().st_size if Path(copy).resolve().parent.parent == precision else model_bytes(graph)
        for copy in copies)
    if total <= limit:
        return None
    return (f"accubisect: the {len(missing)} dump(s) and {len(copies)} model copies still to write need about "
            f"{total / 1e9:.1f} GB in {Path(workspace).resolve()}; {SHRINK}")


def _dumps_bytes(workspace: Path, graph: onnx.ModelProto, dumps: Mapping[str, Any], missing: Mapping[str, Any],
                 dump_options: Mapping[str, Any] | None) -> int:
    """Bytes of the `missing` dumps of `dumps`, as `estimate_line` sizes them."""
    written: dict[tuple[str, tuple], int] = {}
    for key, job in dumps.items():
        if key not in missing:
            written[(str(job.model), _shapes_key(job.sample.inputs))] = _dump_file(workspace, key).stat().st_size
    inferred: dict[tuple, int] = {}
    total = 0
    for job in missing.values():
        shapes = _shapes_key(job.sample.inputs)
        if (str(job.model), shapes) in written:
            total += written[(str(job.model), shapes)]
            continue
        if shapes not in inferred:
            inferred[shapes] = dump_bytes(graph, dict(shapes), dump_options)
        total += inferred[shapes]
    return total


def _dump_file(workspace: Path, key: str) -> Path:
    return stage_dir(workspace, "dump", key) / "dump.h5"


def _shapes_key(sample_inputs: Path) -> tuple:
    return tuple(sorted((name, shape) for name, (_, shape) in npz_signature(Path(sample_inputs)).items()))
