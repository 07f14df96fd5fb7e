"""Per-op dumps: the output of every compiled node for one sample, in one HDF5 file.

The dump runs the optimized graph that the compile stage saved, with optimizations off and every node
output made a graph output. Adding outputs to the *original* model instead would stop ORT from fusing
across them and measure a different graph. A reduced model emulated on the CPU is dumped as the model it
emulates: its own tensors, as the device would store them, named and ordered as in the compiled graph,
and none of the emulation's Casts (`emulate.unemulated`). A tensor of a type numpy lacks (a finalized
model's bfloat16) is stored widened to float32, which holds its values exactly.

The file's layout is `accubisect.formats.dump_file`'s.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import onnx

from accubisect.core.emulate import unemulated
from accubisect.core.errors import DumpError
from accubisect.core.onnx_graph import Node, graph_nodes
from accubisect.core.tensor_sizes import tensor_bytes
from accubisect.formats.compile_record import CompileRecord
from accubisect.formats.digest import file_sha256
from accubisect.formats.dump_file import (
    GROUP,
    OUTPUTS,
    escape,
    tensor_attrs,
    write_index,
    write_statistics,
    write_tensor,
)
from accubisect.formats.files import atomic_path
from accubisect.formats.model import input_specs, load_compiled, load_model
from accubisect.formats.samples import check_arrays, load_arrays, npz_signature
from accubisect.formats.step import Step
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import ExposedRun, backend_named
from accubisect.runtime.host import cpu_signature

log = logging.getLogger(__name__)
BATCH_BYTES = 256 * 2**20  # a dump runs the model once per batch of tensors this large (a larger one alone)


@dataclass(frozen=True)
class DumpOptions:
    """Which tensors a dump keeps, as the seeds' dump options: `mode` output/input/all; at most one of
    the four node filters (op types, or node names as fnmatch patterns); whole tensors or statistics."""

    mode: str = "output"
    op_type_filter: tuple[str, ...] | None = None
    op_type_bypass: tuple[str, ...] | None = None
    op_name_filter: tuple[str, ...] | None = None
    op_name_bypass: tuple[str, ...] | None = None
    statistics_only: bool = False

    @classmethod
    def from_config(cls, dump: Mapping[str, Any]) -> DumpOptions:
        lists = {key: tuple(dump[key]) if dump.get(key) is not None else None for key in FILTERS}
        return cls(dump.get("mode", "output"), **lists, statistics_only=dump.get("statistics_only", False))

    def selects(self, node: Node) -> bool:
        if self.op_type_filter is not None:
            return node.op_type in self.op_type_filter
        if self.op_type_bypass is not None:
            return node.op_type not in self.op_type_bypass
        if self.op_name_filter is not None:
            return any(fnmatch.fnmatchcase(node.name, pattern) for pattern in self.op_name_filter)
        if self.op_name_bypass is not None:
            return not any(fnmatch.fnmatchcase(node.name, pattern) for pattern in self.op_name_bypass)
        return True

    def tensors(self, graph: onnx.GraphProto) -> dict[str, tuple[Node | None, str]]:
        """Tensor name -> (producing node or None for a graph input, "output" or "input"), in order."""
        nodes = graph_nodes(graph)
        producer = {out: node for node in nodes for out in node.outputs if out}
        constants = {init.name for init in graph.initializer}
        chosen: dict[str, tuple[Node | None, str]] = {}
        for node in filter(self.selects, nodes):
            if self.mode in ("input", "all"):
                for name in node.inputs:
                    if name and name not in constants:
                        chosen.setdefault(name, (producer.get(name), "input"))
            if self.mode in ("output", "all"):
                for name in node.outputs:
                    if name:
                        chosen[name] = (node, "output")
        return chosen


FILTERS = ("op_type_filter", "op_type_bypass", "op_name_filter", "op_name_bypass")


@dataclass(frozen=True)
class DumpStep(Step):
    model: Path
    compiled_model: Path
    sample_inputs: Path
    dump: Path
    variant: str
    sample: str
    backend: str
    dump_options: Mapping[str, Any] | None = None
    compile_record: Path | None = None  # checked: a level-all graph runs only on the CPU it was compiled on
    threads: int | None = None  # ORT's intra-op pool: the job's
    compared_with: tuple[Path, ...] = ()


def dump_sample(step: DumpStep) -> None:
    """Dump stage: runs one sample through one compiled variant and writes the chosen tensors. The model runs
    once per batch of at most BATCH_BYTES of tensors (sized by shape inference on the original model), each
    batch written and dropped before the next, so memory follows the batch, not the dump. HDF5 writes
    through a Python file: on a full disk, HDF5 writing by itself leaves its objects unclosable (a traceback
    per object at exit, then a segmentation fault), while a Python file's write fails as one OSError that
    `run_step` reports in one line."""
    if step.compile_record is not None:
        check_same_cpu(step.compile_record)
    options = DumpOptions.from_config(step.dump_options or {})
    original = load_model(step.model, load_weights=False)
    check_arrays(step.sample_inputs, input_specs(original), "input")
    compiled = load_compiled(step.compiled_model, load_weights=False)  # ORT reads the weights from beside it
    chosen = chosen_tensors(step, options, compiled)
    model_outputs = [value.name for value in compiled.graph.output]
    shapes = {name: shape for name, (_, shape) in npz_signature(step.sample_inputs).items()}
    batches = tensor_batches(list(chosen), model_outputs, tensor_bytes(original, shapes))
    feeds = load_arrays(step.sample_inputs)
    backend = backend_named(step.backend)
    run_options = variant_options(step.compile_record)
    start = time.perf_counter()
    with atomic_path(step.dump) as temporary, open(temporary, "w+b") as stream, h5py.File(stream, "w") as h5:
        h5.attrs.update({"model_sha256": file_sha256(step.model), "compiled_sha256": file_sha256(step.compiled_model),
                         "variant": step.variant, "sample": step.sample, "backend": step.backend,
                         "onnxruntime": ort_compile.ort_version(), "backend_version": backend.version(),
                         "statistics_only": options.statistics_only})
        writer = DumpWriter(h5, chosen, model_outputs, options.statistics_only)
        for number, batch in enumerate(batches):
            writer.add(batch, backend.run_exposed(step.model, step.compiled_model, run_options,
                                                  [*batch, *model_outputs], feeds, step.threads),
                       last=number == len(batches) - 1)
        write_index(h5, writer.index)
    log.info("%s %s: %d tensors in %.2f s (%d run(s) of the model)", step.variant, step.sample, len(writer.index),
             time.perf_counter() - start, len(batches))
    writer.report()


def chosen_tensors(step: DumpStep, options: DumpOptions, compiled: onnx.ModelProto) -> dict[str, tuple[Node, str]]:
    """The tensors to dump, each with its node and role. A dump that is only ever a comparison's candidate gets
    the compiled models it is `compared_with` and keeps only the tensors they also have: the comparison reads no
    other (level all's NCHWc reorders: 175 of the 640x640 OCR detector's 848 MB)."""
    chosen = options.tensors(unemulated(compiled))  # the model's tensors, not the emulation's
    if step.compared_with:
        read = set().union(*(tensor_names(load_compiled(path, load_weights=False)) for path in step.compared_with))
        chosen = {name: entry for name, entry in chosen.items() if name in read}
    return chosen


class DumpWriter:
    """Writes each batch's tensors into the dump as its run returns them, dropping each once written; the last
    run's model outputs also go under OUTPUTS (a hard link where the tensor is stored whole: stored once)."""

    def __init__(self, h5: h5py.File, chosen: Mapping[str, tuple[Node, str]], model_outputs: list[str],
                 statistics_only: bool) -> None:
        self.chosen, self.model_outputs, self.statistics_only = chosen, model_outputs, statistics_only
        self.group, self.outputs = h5.create_group(GROUP), h5.create_group(OUTPUTS)
        self.write = write_statistics if statistics_only else write_tensor
        self.index: list[dict[str, Any]] = []
        self.widened: dict[str, str] = {}
        self.unfaithful: dict[str, str] = {}

    def add(self, batch: list[str], run: ExposedRun, last: bool) -> None:
        """One run's tensors: the batch's written, and on the `last` run the model's outputs."""
        tensors = run.tensors
        self.widened.update(run.widened)
        self.unfaithful.update(run.unfaithful)
        for name in batch:
            if name in tensors:
                node, role = self.chosen[name]
                array = tensors[name] if name in self.model_outputs else tensors.pop(name)
                why = {"unfaithful": run.unfaithful[name]} if name in run.unfaithful else {}
                self.index.append({**tensor_attrs(name, array, node, role, run.widened.get(name)),
                                   **self.write(self.group, name, array), **why})
                del array
        if last:
            for name in self.model_outputs:
                if escape(name) in self.group and not self.statistics_only:
                    self.outputs[escape(name)] = self.group[escape(name)]
                else:
                    self.outputs.create_dataset(escape(name), data=tensors[name])

    def report(self) -> None:
        """What a user should know of the tensors written: those not as the undumped program computes them,
        and those stored widened."""
        unfaithful, widened = self.unfaithful, self.widened
        if unfaithful:
            log.warning("%d tensor(s) not as the undumped program computes them (marked unfaithful in the dump): %s",
                        len(unfaithful), "; ".join(f"{name}: {why}" for name, why in list(unfaithful.items())[:5]))
        if widened:
            log.info("%d tensor(s) of a type numpy lacks stored widened, exactly (model_dtype says which): %s",
                     len(widened), ", ".join(f"{name} ({dtype})" for name, dtype in widened.items()))


def variant_options(compile_record: Path | None) -> ort_compile.CompileOptions:
    """What the variant was compiled with, as far as a run of it needs: its level and session config (an
    OpenVINO variant's precision hint is there). The rules it has off are the compile's: a dump runs what
    the compile saved."""
    if compile_record is None:
        return ort_compile.CompileOptions("off")
    variant = CompileRecord.read(compile_record).variant
    return ort_compile.CompileOptions(variant.level, dict(variant.session_config))


def tensor_names(model: onnx.ModelProto) -> set[str]:
    """Every tensor a dump of `model` could hold: its graph inputs and its nodes' outputs."""
    return {value.name for value in model.graph.input} | {out for node in model.graph.node for out in node.output}


def tensor_batches(names: list[str], model_outputs: list[str], sizes: Mapping[str, int],
                   limit: int | None = None) -> list[list[str]]:
    """`names` in order, cut into batches whose tensors, with the model outputs every run returns, stay
    within `limit` bytes (BATCH_BYTES; a larger tensor alone); a tensor shape inference could not size
    counts as the largest it sized. Always at least one batch, so the model outputs are run once."""
    limit = BATCH_BYTES if limit is None else limit
    largest = max(sizes.values(), default=0)
    fixed = sum(sizes.get(name, largest) for name in model_outputs)
    batches: list[list[str]] = [[]]
    size = fixed
    for name in names:
        if name in model_outputs:
            batches[-1].append(name)
            continue
        tensor = sizes.get(name, largest)
        if batches[-1] and size + tensor > limit:
            batches.append([])
            size = fixed
        batches[-1].append(name)
        size += tensor
    return batches


def check_same_cpu(compile_record: Path) -> None:
    """A level-`all` graph runs only on the kind of CPU it was compiled on."""
    record = CompileRecord.read(compile_record)
    if record.variant.level == "all" and record.cpu != cpu_signature():
        raise DumpError(f"{compile_record}: compiled on a CPU with {record.cpu}, dumping on {cpu_signature()}; "
                        "level-all graphs are CPU-specific: run compile and dump on the same kind of node")


