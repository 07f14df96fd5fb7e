"""Per-op dumps: the output of every compiled node for one sample, in one HDF5 file.

The dump runs the optimized graph that the compile stage saved, with optimizations off and every node
output made a graph output. Adding outputs to the *original* model instead would stop ORT from fusing
across them and measure a different graph. A reduced model emulated on the CPU is dumped as the model it
emulates: its own tensors, as the device would store them, named and ordered as in the compiled graph,
and none of the emulation's Casts (`emulate.unemulated`). A tensor of a type numpy lacks (a finalized
model's bfloat16) is stored widened to float32, which holds its values exactly.

Layout (format DUMP_FORMAT): `/tensors/<escaped name>`, one dataset per tensor, without attributes; `/index`,
one JSON document (UTF-8 bytes) listing every tensor once, in topological order: `name` (the ONNX tensor
name), `node`, `op_type`, `topo_index` (of the producing node; "" and -1 for a graph input), `role` (output
or input), `dtype` (the array's, as `read` returns it), `model_dtype` (the tensor's in the model:
`bfloat16` where it was widened, else `dtype`), `shape` and `stored` (how the dataset holds it). One table
instead of 8 HDF5 attributes per dataset: those cost ~1.3 ms per tensor to write and as much to read.
A float32 tensor whose every value a 16-bit type holds exactly — a reduced variant's, emulated — is stored
in it, losslessly: `stored` `float16` (an HDF5 float16 dataset) or `bfloat16` (a uint16 dataset holding
the upper half of each float32); `read` returns float32 bit for bit. File attributes `dump_format`,
`model_sha256`, `compiled_sha256`, `variant`, `sample`, `backend`, `onnxruntime` and `statistics_only`;
`/outputs/<escaped name>` holds the model outputs whole (a hard link to the tensor's dataset where the
dump holds it whole, so no byte is stored twice).
A statistics-only dump holds a group per tensor under `/tensors` instead, with datasets `values` and
`positions`: SAMPLE_SIZE values at flat positions chosen by the tensor's size alone; its index entries add
min, max, mean, std, NaN/Inf counts and fp16/bf16 overflow/underflow fractions.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import h5py
import numpy as np
import onnx

from accubisect import ort_compile
from accubisect.backends import Backend, backend_named
from accubisect.digest import file_sha256
from accubisect.disk import tensor_bytes
from accubisect.emulate import unemulated
from accubisect.errors import DumpError
from accubisect.files import atomic_path, read_json, rebuild_advice
from accubisect.host import cpu_signature
from accubisect.model import input_specs, load_compiled, load_model
from accubisect.metrics import LOW_PRECISION, range_fractions
from accubisect.onnx_graph import Node, graph_nodes
from accubisect.samples import check_arrays, load_arrays, npz_signature

log = logging.getLogger(__name__)
GROUP = "tensors"
OUTPUTS = "outputs"  # the model outputs, always whole: the accuracy verdict needs them
INDEX = "index"  # one JSON table of every tensor's metadata
SAMPLE_SIZE = 4096  # values kept per tensor by a statistics-only dump
DUMP_FORMAT = 2  # the layout's version; a reader refuses any other (1: attributes per dataset, no index)
BATCH_BYTES = 256 * 2**20  # a dump runs the model once per batch of tensors this large (a larger one alone)
CHUNK = 1 << 22  # elements checked or converted at a time when narrowing, so a copy is a few MiB
PROBE_ELEMENTS = 4096  # the first chunk narrowing checks: short, as a full-precision tensor fails it at once


def escape(name: str) -> str:
    """An HDF5-safe, reversible dataset name for any ONNX tensor name (`/` and `.` are special there)."""
    return quote(name, safe="").replace(".", "%2E")


def unescape(dataset: str) -> str:
    return unquote(dataset)


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


def expose_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs are exactly `names` (plus its own outputs)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {value.name for value in exposed.graph.output}
    for name in names:
        if name not in present:
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return exposed


def run_exposed(compiled: onnx.ModelProto, names: Iterable[str], feeds: dict[str, np.ndarray],
                backend: Backend, threads: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Runs `compiled` with `names` (and its own outputs) as outputs: {name: array}, and {name: element type}
    for every tensor read widened. ONNX Runtime's Python API returns no tensor of a type numpy lacks
    (bfloat16, float8, int4: "No corresponding Numpy type"); such a tensor is read through an added Cast to
    a type that holds each of its values exactly (float32, int8, uint8). ORT runs at most `threads`
    threads (None: its default)."""
    names = list(dict.fromkeys(names))
    produced = [name for name in names if name not in feeds]
    exposed = expose_outputs(compiled, produced)
    session = _session(exposed, backend, threads)
    narrow = {out.name: out.type for out in session.get_outputs() if out.type in WIDENED}
    aliases: dict[str, str] = {}
    if narrow:  # a second session: ORT types the exposed tensors only when it builds one
        exposed, aliases = widen_outputs(exposed, narrow)
        session = _session(exposed, backend, threads)
    own = {alias: name for name, alias in aliases.items()}
    tensors = {own.get(k, k): v for k, v in ort_compile.run_session(session, feeds).items()}
    tensors.update({k: v for k, v in feeds.items() if k in names})
    return tensors, {name: _element_type(held) for name, held in narrow.items()}


def exposed_types(compiled: onnx.ModelProto, names: Iterable[str], backend: Backend,
                  threads: int | None = None) -> dict[str, str]:
    """The element type of each named tensor as ONNX Runtime types it when it builds a session exposing
    them all (`bfloat16` and the like by name). Nothing runs: a run would hold every tensor at once."""
    session = _session(expose_outputs(compiled, list(dict.fromkeys(names))), backend, threads)
    return {out.name: _element_type(out.type) for out in session.get_outputs()}


# ONNX Runtime's names of the element types numpy lacks -> the type a Cast widens them to, exactly
WIDENED = {
    **{f"tensor({name})": onnx.TensorProto.FLOAT for name in (
        "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0", "float4e2m1")},
    "tensor(int4)": onnx.TensorProto.INT8, "tensor(uint4)": onnx.TensorProto.UINT8,
}


def widen_outputs(exposed: onnx.ModelProto, narrow: Mapping[str, str]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of `exposed` whose outputs named in `narrow` (name -> ONNX Runtime type) are replaced by
    widening Casts of them, and {name: the Cast's output}."""
    widened = onnx.ModelProto()
    widened.CopyFrom(exposed)
    graph = widened.graph
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    taken |= {value.name for value in (*graph.input, *graph.output)} | {init.name for init in graph.initializer}
    aliases: dict[str, str] = {}
    for name, held in narrow.items():
        alias = f"{name}/widened"
        while alias in taken:
            alias += "_"
        taken.add(alias)
        aliases[name] = alias
        graph.node.append(onnx.helper.make_node("Cast", [name], [alias], to=WIDENED[held], name=f"{alias}/cast"))
    outputs = [onnx.ValueInfoProto(name=aliases[value.name]) if value.name in aliases else value
               for value in graph.output]
    del graph.output[:]
    graph.output.extend(outputs)
    return widened, aliases


def _element_type(held: str) -> str:
    """ONNX Runtime's `tensor(bfloat16)` as the numpy name the rest of accubisect uses (`bfloat16`)."""
    enum = onnx.TensorProto.DataType.Value(held.removeprefix("tensor(").removesuffix(")").upper())
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(enum)))


def _session(model: onnx.ModelProto, backend: Backend, threads: int | None):
    return ort_compile.open_session(model.SerializeToString(), ort_compile.CompileOptions("off"), backend, threads)


def dump_sample(model: Path, compiled_model: Path, sample_inputs: Path, dump: Path, variant: str, sample: str,
                backend: str, dump_options: Mapping[str, Any] | None = None,
                compile_record: Path | None = None, threads: int | None = None,
                compared_with: Sequence[Path] | Path = ()) -> None:
    """Dump stage: runs one sample through one compiled variant and writes the chosen tensors; ORT uses at
    most `threads` threads (the job's). The model runs once per batch of at most BATCH_BYTES of tensors
    (sized by shape inference on the original model), each batch written and dropped before the next, so
    memory follows the batch, not the dump. A dump that is only ever a comparison's candidate gets the
    compiled models it is `compared_with` and keeps only the tensors they also have: the comparison reads no
    other (level all's NCHWc reorders: 175 of the 640x640 OCR detector's 848 MB)."""
    if compile_record is not None:
        check_same_cpu(Path(compile_record))
    options = DumpOptions.from_config(dump_options or {})
    original = load_model(model, load_weights=False)
    check_arrays(Path(sample_inputs), input_specs(original), "input")
    compiled = load_compiled(compiled_model)
    chosen = options.tensors(unemulated(compiled))  # the model's tensors, not the emulation's
    compared_with = [compared_with] if isinstance(compared_with, (str, Path)) else compared_with
    if compared_with:
        read = set().union(*(tensor_names(load_compiled(Path(path), load_weights=False)) for path in compared_with))
        chosen = {name: entry for name, entry in chosen.items() if name in read}
    model_outputs = [value.name for value in compiled.graph.output]
    shapes = {name: shape for name, (_, shape) in npz_signature(Path(sample_inputs)).items()}
    batches = tensor_batches(list(chosen), model_outputs, tensor_bytes(original, shapes))
    feeds = load_arrays(Path(sample_inputs))
    start = time.perf_counter()
    index: list[dict[str, Any]] = []
    widened: dict[str, str] = {}
    with atomic_path(dump) as temporary, h5py.File(temporary, "w") as h5:
        h5.attrs.update({"model_sha256": file_sha256(Path(model)),
                         "compiled_sha256": file_sha256(Path(compiled_model)), "variant": variant, "sample": sample,
                         "backend": backend, "onnxruntime": ort_compile.ort_version(),
                         "statistics_only": options.statistics_only})
        group, outputs = h5.create_group(GROUP), h5.create_group(OUTPUTS)
        write = write_statistics if options.statistics_only else write_tensor
        for number, batch in enumerate(batches):
            tensors, narrow = run_exposed(compiled, [*batch, *model_outputs], feeds, backend_named(backend), threads)
            widened.update(narrow)
            for name in batch:
                if name in tensors:
                    node, role = chosen[name]
                    array = tensors[name] if name in model_outputs else tensors.pop(name)
                    index.append({**tensor_attrs(name, array, node, role, narrow.get(name)),
                                  **write(group, name, array)})
                    del array
            if number == len(batches) - 1:
                for name in model_outputs:
                    if escape(name) in group and not options.statistics_only:
                        outputs[escape(name)] = group[escape(name)]  # a hard link: stored once
                    else:
                        outputs.create_dataset(escape(name), data=tensors[name])
            del tensors
        write_index(h5, index)
    log.info("%s %s: %d tensors in %.2f s (%d run(s) of the model)", variant, sample, len(index),
             time.perf_counter() - start, len(batches))
    if widened:
        log.info("%d tensor(s) of a type numpy lacks stored widened, exactly (model_dtype says which): %s",
                 len(widened), ", ".join(f"{name} ({dtype})" for name, dtype in widened.items()))


def tensor_names(model: onnx.ModelProto) -> set[str]:
    """Every tensor a dump of `model` could hold: its graph inputs and its nodes' outputs."""
    return {value.name for value in model.graph.input} | {out for node in model.graph.node for out in node.output}


def write_index(h5: h5py.File, entries: list[dict[str, Any]]) -> None:
    """The tensor table a reader loads at once, and the format version it checks."""
    h5.attrs["dump_format"] = DUMP_FORMAT
    h5.create_dataset(INDEX, data=np.frombuffer(json.dumps({"tensors": entries}).encode(), np.uint8))


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
    record = read_json(compile_record)
    if record["variant"]["level"] == "all" and record["cpu"] != cpu_signature():
        raise DumpError(f"{compile_record}: compiled on a CPU with {record['cpu']}, dumping on {cpu_signature()}; "
                        "level-all graphs are CPU-specific: run compile and dump on the same kind of node")


def tensor_attrs(name: str, array: np.ndarray, node: Node | None, role: str,
                 model_dtype: str | None = None) -> dict[str, Any]:
    """`dtype` is the array's; `model_dtype` the tensor's in the model, where that is a type numpy
    lacks and the array holds its values widened (bfloat16 -> float32)."""
    return {"name": name, "node": node.name if node else "", "op_type": node.op_type if node else "",
            "topo_index": node.index if node else -1, "role": role, "dtype": str(array.dtype),
            "model_dtype": model_dtype or str(array.dtype), "shape": list(array.shape)}


def write_tensor(group: h5py.Group, name: str, array: np.ndarray) -> dict[str, Any]:
    """Writes `array`, in 16 bits where that holds every value exactly; its index entry's `stored`."""
    stored, narrow = narrowed(array)
    group.create_dataset(escape(name), data=array if narrow is None else narrow.reshape(array.shape))
    return {"stored": stored}


def narrowed(array: np.ndarray) -> tuple[str, np.ndarray | None]:
    """(`float16`, its values as float16) or (`bfloat16`, the upper halves of its float32 bits as uint16)
    when a float32 array's every value (bits included: -0, NaN payloads) survives that 16-bit type, else
    (its own dtype, None). Checked and converted CHUNK elements at a time; a chunk that fails ends the check,
    so a full-precision tensor costs PROBE_ELEMENTS elements' work."""
    own = str(array.dtype)
    if array.dtype != np.float32 or array.size == 0:
        return own, None
    bits = np.ascontiguousarray(array).reshape(-1).view(np.uint32)
    half: np.ndarray | None = None
    upper: np.ndarray | None = None
    fp16 = bf16 = True
    starts = [0, *range(PROBE_ELEMENTS, bits.size, CHUNK)]  # a short first chunk: a float32 tensor fails it
    for start, end in zip(starts, [*starts[1:], bits.size], strict=True):
        part = bits[start:end]
        if bf16 and not (part & 0xFFFF).any():
            upper = np.empty(bits.size, np.uint16) if upper is None else upper
            np.right_shift(part, 16, out=upper[start:end], casting="unsafe")
        else:
            bf16, upper = False, None
        if fp16:
            half = np.empty(bits.size, np.float16) if half is None else half
            with np.errstate(over="ignore"):  # a value float16 cannot hold becomes inf and fails the check
                half[start:end] = part.view(np.float32)
            if not np.array_equal(half[start:end].astype(np.float32).view(np.uint32), part):
                fp16, half = False, None
        if not (fp16 or bf16):
            return own, None
    return ("float16", half) if fp16 else ("bfloat16", upper)


def write_statistics(group: h5py.Group, name: str, array: np.ndarray) -> dict[str, Any]:
    """Statistics (returned, for the index) and a fixed-size sample of the values, taken at positions that
    depend only on the tensor's size, so two runs' samples line up element for element."""
    entry = group.create_group(escape(name))
    positions = sample_positions(array.size)
    entry.create_dataset("positions", data=positions)
    entry.create_dataset("values", data=array.reshape(-1)[positions])
    return {"stored": "statistics", **statistics(array)}


def sample_positions(size: int) -> np.ndarray:
    if size <= SAMPLE_SIZE:
        return np.arange(size, dtype=np.int64)
    return np.sort(np.random.default_rng(size).choice(size, SAMPLE_SIZE, replace=False)).astype(np.int64)


def statistics(array: np.ndarray) -> dict[str, float]:
    values = np.asarray(array, np.float64).ravel()
    finite = values[np.isfinite(values)]
    summary = {"nan": int(np.isnan(values).sum()), "inf": int(np.isinf(values).sum())}
    for name, function in (("min", np.min), ("max", np.max), ("mean", np.mean), ("std", np.std)):
        summary[name] = float(function(finite)) if finite.size else math.nan
    for dtype in LOW_PRECISION:
        summary[f"overflow_{dtype}"], summary[f"underflow_{dtype}"] = range_fractions(values, dtype)
    return summary


class DumpReader:
    """Reads a dump one tensor at a time, so a comparison never holds a whole dump in memory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DumpError(f"{self.path}: dump file not found")
        try:
            self._file = h5py.File(self.path, "r")
            self._group = self._file[GROUP]
        except (OSError, KeyError) as error:
            message = f"{self.path}: not a readable dump ({error}); delete it and re-run the dump stage"
            raise DumpError(message) from None
        # the file's attributes and the index, read once: an HDF5 attribute costs as much as a small tensor
        self._attrs = dict(self._file.attrs)
        found = self._attrs.get("dump_format")
        if found != DUMP_FORMAT:
            self._file.close()
            written = f"dump format {found}" if found is not None else "no dump format"
            raise DumpError(f"{self.path}: {written}, this accubisect reads format {DUMP_FORMAT} (written by "
                            f"another version or tool); {rebuild_advice(self.path)}")
        try:
            entries = json.loads(bytes(self._file[INDEX][()]))["tensors"]
        except (KeyError, ValueError, TypeError) as error:
            self._file.close()
            raise DumpError(f"{self.path}: unreadable tensor index ({error}); {rebuild_advice(self.path)}") from None
        self._index: dict[str, dict[str, Any]] = {entry["name"]: entry for entry in entries}
        self.statistics_only = bool(self._attrs.get("statistics_only", False))

    def __enter__(self) -> DumpReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    @property
    def attrs(self) -> dict[str, object]:
        return dict(self._attrs)

    def names(self) -> Iterator[str]:
        """Every tensor's name, in the order of their escaped names (HDF5's order, as format 1 gave them)."""
        return iter(sorted(self._index, key=escape))

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def read(self, name: str) -> np.ndarray:
        """The tensor, as the model produced it (a 16-bit copy widened back, exactly); for a
        statistics-only dump, its sampled values (flat)."""
        entry = self._group[escape(name)]
        if self.statistics_only:
            return np.asarray(entry["values"][()])
        stored, dtype = self._index[name].get("stored"), self._index[name]["dtype"]
        if dtype == "float32" and stored in ("float16", "bfloat16"):  # narrowed (a model's own fp16 stays)
            narrow = entry[()].reshape(-1)
            wide = np.empty(narrow.size, np.float32)
            for start in range(0, narrow.size, CHUNK):
                part = narrow[start:start + CHUNK]
                if stored == "float16":
                    wide[start:start + CHUNK] = part
                else:
                    np.left_shift(part, 16, out=wide[start:start + CHUNK].view(np.uint32), dtype=np.uint32)
            return wide.reshape(entry.shape)
        return np.asarray(entry[()])  # 0-d: an array, too

    def output_names(self) -> list[str]:
        return [unescape(key) for key in self._file[OUTPUTS]] if OUTPUTS in self._file else []

    def read_output(self, name: str) -> np.ndarray:
        if name in self._index and not self.statistics_only:
            return self.read(name)  # /outputs links to the tensor's dataset, which may be stored narrow
        try:
            return np.asarray(self._file[OUTPUTS][escape(name)][()])
        except KeyError:
            message = f"{self.path}: holds no model output '{name}'; delete it and re-run the dump stage"
            raise DumpError(message) from None

    def layout(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        """The array's dtype (as `read` returns it) and shape, from the index. Only for a full dump (a
        statistics-only dump's `read` returns sampled values)."""
        entry = self._index[name]
        return np.dtype(entry["dtype"]), tuple(entry["shape"])

    def info(self, name: str) -> dict[str, object]:
        """The tensor's index entry: name, node, op_type, topo_index, role, dtype, model_dtype, shape, stored
        (and a statistics-only dump's statistics)."""
        return dict(self._index[name])
