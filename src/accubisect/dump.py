"""Per-op dumps: the output of every compiled node for one sample, in one HDF5 file.

The dump runs the optimized graph that the compile stage saved, with optimizations off and every node
output made a graph output. Adding outputs to the *original* model instead would stop ORT from fusing
across them and measure a different graph. A reduced model emulated on the CPU is dumped as the model it
emulates: its own tensors, as the device would store them, named and ordered as in the compiled graph,
and none of the emulation's Casts (`emulate.unemulated`). A tensor of a type numpy lacks (a finalized
model's bfloat16) is stored widened to float32, which holds its values exactly.

Layout: `/tensors/<escaped name>`, one dataset per tensor, with attributes `name` (the ONNX tensor name),
`node`, `op_type`, `topo_index` (of the producing node; "" and -1 for a graph input), `role` (output or
input), `dtype` (the stored array's), `model_dtype` (the tensor's in the model: `bfloat16` where it was
widened, else `dtype`) and `shape`; file attributes `model_sha256`, `compiled_sha256`, `variant`, `sample`,
`backend`, `onnxruntime` and `statistics_only`; `/outputs/<escaped name>` holds the model outputs whole.
A statistics-only dump holds a group per tensor under `/tensors` instead, with the same attributes plus
min, max, mean, std, NaN/Inf counts and fp16/bf16 overflow/underflow fractions, and datasets `values`
and `positions`: SAMPLE_SIZE values at flat positions chosen by the tensor's size alone.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping
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
from accubisect.emulate import unemulated
from accubisect.errors import DumpError
from accubisect.files import atomic_path, read_json
from accubisect.host import cpu_signature
from accubisect.model import input_specs, load_compiled, load_model
from accubisect.metrics import LOW_PRECISION, range_fractions
from accubisect.onnx_graph import Node, graph_nodes
from accubisect.samples import check_arrays, load_arrays

log = logging.getLogger(__name__)
GROUP = "tensors"
OUTPUTS = "outputs"  # the model outputs, always whole: the accuracy verdict needs them
SAMPLE_SIZE = 4096  # values kept per tensor by a statistics-only dump


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
                compile_record: Path | None = None, threads: int | None = None) -> None:
    """Dump stage: runs one sample through one compiled variant and writes the chosen tensors; ORT uses at
    most `threads` threads (the job's)."""
    if compile_record is not None:
        check_same_cpu(Path(compile_record))
    options = DumpOptions.from_config(dump_options or {})
    original = load_model(model, load_weights=False)
    check_arrays(Path(sample_inputs), input_specs(original), "input")
    compiled = load_compiled(compiled_model)
    chosen = options.tensors(unemulated(compiled))  # the model's tensors, not the emulation's
    start = time.perf_counter()
    tensors, widened = run_exposed(compiled, [*chosen, *(v.name for v in compiled.graph.output)],
                                   load_arrays(Path(sample_inputs)), backend_named(backend), threads)
    log.info("%s %s: %d tensors in %.2f s", variant, sample, len(chosen), time.perf_counter() - start)
    if widened:
        log.info("%d tensor(s) of a type numpy lacks stored widened, exactly (model_dtype says which): %s",
                 len(widened), ", ".join(f"{name} ({dtype})" for name, dtype in widened.items()))
    with atomic_path(dump) as temporary, h5py.File(temporary, "w") as h5:
        h5.attrs.update({"model_sha256": file_sha256(Path(model)), "compiled_sha256": file_sha256(Path(compiled_model)),
                         "variant": variant, "sample": sample, "backend": backend,
                         "onnxruntime": ort_compile.ort_version(), "statistics_only": options.statistics_only})
        group, outputs = h5.create_group(GROUP), h5.create_group(OUTPUTS)
        write = write_statistics if options.statistics_only else write_tensor
        for name, (node, role) in chosen.items():
            if name in tensors:
                write(group, name, tensors[name], tensor_attrs(name, tensors[name], node, role, widened.get(name)))
        for value in compiled.graph.output:
            outputs.create_dataset(escape(value.name), data=tensors[value.name])


def check_same_cpu(compile_record: Path) -> None:
    """A level-`all` graph runs only on the kind of CPU it was compiled on."""
    record = read_json(compile_record)
    if record["variant"]["level"] == "all" and record["cpu"] != cpu_signature():
        raise DumpError(f"{compile_record}: compiled on a CPU with {record['cpu']}, dumping on {cpu_signature()}; "
                        "level-all graphs are CPU-specific: run compile and dump on the same kind of node")


def tensor_attrs(name: str, array: np.ndarray, node: Node | None, role: str,
                 model_dtype: str | None = None) -> dict[str, Any]:
    """`dtype` is the stored array's; `model_dtype` the tensor's in the model, where that is a type numpy
    lacks and the array holds its values widened (bfloat16 -> float32)."""
    return {"name": name, "node": node.name if node else "", "op_type": node.op_type if node else "",
            "topo_index": node.index if node else -1, "role": role, "dtype": str(array.dtype),
            "model_dtype": model_dtype or str(array.dtype), "shape": list(array.shape)}


def write_tensor(group: h5py.Group, name: str, array: np.ndarray, attrs: Mapping[str, Any]) -> None:
    group.create_dataset(escape(name), data=array).attrs.update(attrs)


def write_statistics(group: h5py.Group, name: str, array: np.ndarray, attrs: Mapping[str, Any]) -> None:
    """Statistics and a fixed-size sample of the values, taken at positions that depend only on the
    tensor's size, so two runs' samples line up element for element."""
    entry = group.create_group(escape(name))
    positions = sample_positions(array.size)
    entry.create_dataset("positions", data=positions)
    entry.create_dataset("values", data=array.reshape(-1)[positions])
    entry.attrs.update({**attrs, **statistics(array)})


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


READ_ATTRS = ("node", "op_type", "topo_index", "role", "dtype", "shape")  # of tensor_attrs, what readers use


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
        # read once: an HDF5 attribute read costs as much as reading a small tensor
        self.statistics_only = bool(self._file.attrs.get("statistics_only", False))

    def __enter__(self) -> DumpReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    @property
    def attrs(self) -> dict[str, object]:
        return dict(self._file.attrs)

    def names(self) -> Iterator[str]:
        return (unescape(key) for key in self._group)

    def __contains__(self, name: str) -> bool:
        return escape(name) in self._group

    def read(self, name: str) -> np.ndarray:
        """The tensor; for a statistics-only dump, its sampled values (flat)."""
        entry = self._group[escape(name)]
        return np.asarray(entry["values"][()] if self.statistics_only else entry[()])  # 0-d: an array, too

    def output_names(self) -> list[str]:
        return [unescape(key) for key in self._file[OUTPUTS]] if OUTPUTS in self._file else []

    def read_output(self, name: str) -> np.ndarray:
        try:
            return np.asarray(self._file[OUTPUTS][escape(name)][()])
        except KeyError:
            message = f"{self.path}: holds no model output '{name}'; delete it and re-run the dump stage"
            raise DumpError(message) from None

    def layout(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        """The stored array's dtype and shape, from the dataset's own header: cheaper than its attributes.
        Only for a full dump (a statistics-only dump stores groups)."""
        dataset = self._group[escape(name)]
        return dataset.dtype, dataset.shape

    def info(self, name: str) -> dict[str, object]:
        """The tensor's attributes; an HDF5 file of another tool's making lacks them, and is named."""
        attrs = dict(self._group[escape(name)].attrs)
        missing = [key for key in READ_ATTRS if key not in attrs]
        if missing:
            raise DumpError(f"{self.path}: tensor '{name}' has no {', '.join(missing)}; not a dump accubisect "
                            "wrote (re-run the dump stage)")
        return attrs
