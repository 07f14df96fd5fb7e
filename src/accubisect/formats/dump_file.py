"""The per-op dump file: one sample's tensors of one compiled variant, in HDF5, and its reader.

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

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import h5py
import numpy as np

from accubisect.core.errors import DumpError
from accubisect.core.metrics import LOW_PRECISION, range_fractions
from accubisect.core.onnx_graph import Node
from accubisect.formats.paths import KEY_PATTERN

GROUP = "tensors"
OUTPUTS = "outputs"  # the model outputs, always whole: the accuracy verdict needs them
INDEX = "index"  # one JSON table of every tensor's metadata
SAMPLE_SIZE = 4096  # values kept per tensor by a statistics-only dump
DUMP_FORMAT = 2  # the layout's version; a reader refuses any other (1: attributes per dataset, no index)
CHUNK = 1 << 22  # elements checked or converted at a time when narrowing, so a copy is a few MiB
PROBE_ELEMENTS = 4096  # the first chunk narrowing checks: short, as a full-precision tensor fails it at once


def escape(name: str) -> str:
    """An HDF5-safe, reversible dataset name for any ONNX tensor name (`/` and `.` are special there)."""
    return quote(name, safe="").replace(".", "%2E")


def unescape(dataset: str) -> str:
    return unquote(dataset)


def write_index(h5: h5py.File, entries: list[dict[str, Any]]) -> None:
    """The tensor table a reader loads at once, and the format version it checks."""
    h5.attrs["dump_format"] = DUMP_FORMAT
    h5.create_dataset(INDEX, data=np.frombuffer(json.dumps({"tensors": entries}).encode(), np.uint8))


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


def redump_advice(path: Path) -> str:
    """What to do about a dump this version cannot read. In a workspace, its stage folder, named as the user
    can find it (also when the file was given from inside it), is rebuilt by the dump stage; a copy
    elsewhere is made again."""
    folder = path.resolve().parent
    if folder.parent.name == "dump" and re.fullmatch(KEY_PATTERN, folder.name):
        shown = path.parent if path.parent != Path() else folder
        return f"delete {shown} and rerun the dump stage (snakemake dump, with the run's config) to rebuild it"
    return ("dump the model again with this version (snakemake dump, with the run's config, writes "
            "workspace/dump/<key>/dump.h5)")


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
                            f"another version or tool); {redump_advice(self.path)}")
        try:
            entries = json.loads(bytes(self._file[INDEX][()]))["tensors"]
        except (KeyError, ValueError, TypeError) as error:
            self._file.close()
            raise DumpError(f"{self.path}: unreadable tensor index ({error}); {redump_advice(self.path)}") from None
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

    @property
    def model_sha256(self) -> str:
        """The sha256 of the user's model the dumped variant was compiled from (the same for every variant)."""
        return str(self._attrs.get("model_sha256", ""))

    @property
    def sample(self) -> str:
        return str(self._attrs.get("sample", ""))

    def info(self, name: str) -> dict[str, object]:
        """The tensor's index entry: name, node, op_type, topo_index, role, dtype, model_dtype, shape, stored
        (and a statistics-only dump's statistics)."""
        return dict(self._index[name])


def check_same_model(one: DumpReader, other: DumpReader) -> None:
    """Dumps compared or judged together must come from one model: the original's sha256, which every
    variant's dump carries (a fusion-off reference and a compiled candidate share it)."""
    if one.model_sha256 != other.model_sha256:
        raise DumpError(f"{one.path} and {other.path} are dumps of different models (sha256 {one.model_sha256[:12]} "
                        f"and {other.model_sha256[:12]}); compare dumps of one model")


def check_comparable(reference: DumpReader, candidate: DumpReader) -> None:
    """Two dumps compared tensor by tensor: one model and one sample, or the comparison would give a plain
    verdict on unrelated tensors."""
    check_same_model(reference, candidate)
    if reference.sample != candidate.sample:
        raise DumpError(f"{reference.path} and {candidate.path} are dumps of different samples ({reference.sample} "
                        f"and {candidate.sample}); compare dumps of the same sample")
