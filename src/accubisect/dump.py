"""Per-op dumps: the output of every compiled node for one sample, in one HDF5 file.

The dump runs the optimized graph that the compile stage saved, with optimizations off and every node
output made a graph output. Adding outputs to the *original* model instead would stop ORT from fusing
across them and measure a different graph.

Layout: `/tensors/<escaped name>`, one dataset per tensor, with attributes `name` (the ONNX tensor name),
`node`, `op_type`, `topo_index`, `dtype` and `shape`; file attributes `model_sha256`, `compiled_sha256`,
`variant`, `sample`, `backend` and `onnxruntime`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import h5py
import numpy as np
import onnx

from accubisect import ort_compile
from accubisect.digest import file_sha256
from accubisect.errors import DumpError
from accubisect.files import atomic_path
from accubisect.model import input_specs, load_model
from accubisect.onnx_graph import graph_nodes
from accubisect.samples import check_arrays, load_arrays

log = logging.getLogger(__name__)
GROUP = "tensors"


def escape(name: str) -> str:
    """An HDF5-safe, reversible dataset name for any ONNX tensor name (`/` and `.` are special there)."""
    return quote(name, safe="").replace(".", "%2E")


def unescape(dataset: str) -> str:
    return unquote(dataset)


def expose_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {value.name for value in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in present:
                exposed.graph.output.append(onnx.ValueInfoProto(name=name))
                present.add(name)
    return exposed


def run_all_outputs(compiled: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    exposed = expose_all_outputs(compiled).SerializeToString()
    session = ort_compile.open_session(exposed, ort_compile.CompileOptions("off"))
    return ort_compile.run_session(session, feeds)


def dump_sample(model: Path, compiled_model: Path, sample_inputs: Path, dump: Path, variant: str, sample: str,
                backend: str) -> None:
    """Dump stage: runs one sample through one compiled variant and writes every node's output."""
    original = load_model(model, load_weights=False)
    check_arrays(Path(sample_inputs), input_specs(original), "input", check_shapes=True)
    compiled = load_model(compiled_model)
    start = time.perf_counter()
    tensors = run_all_outputs(compiled, load_arrays(Path(sample_inputs)))
    log.info("%s %s: %d tensors in %.2f s", variant, sample, len(tensors), time.perf_counter() - start)
    with atomic_path(dump) as temporary, h5py.File(temporary, "w") as h5:
        h5.attrs.update({"model_sha256": file_sha256(Path(model)), "compiled_sha256": file_sha256(Path(compiled_model)),
                         "variant": variant, "sample": sample, "backend": backend,
                         "onnxruntime": ort_compile.ort_version()})
        group = h5.create_group(GROUP)
        for node in graph_nodes(compiled.graph):
            for name in node.outputs:
                if name in tensors:
                    write_tensor(group, name, tensors[name], node.name, node.op_type, node.index)


def write_tensor(group: h5py.Group, name: str, array: np.ndarray, node: str, op_type: str, index: int) -> None:
    dataset = group.create_dataset(escape(name), data=array)
    dataset.attrs.update({"name": name, "node": node, "op_type": op_type, "topo_index": index,
                          "dtype": str(array.dtype), "shape": list(array.shape)})


class DumpReader:
    """Reads a dump one tensor at a time, so a comparison never holds a whole dump in memory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._file = h5py.File(self.path, "r")
            self._group = self._file[GROUP]
        except (OSError, KeyError) as error:
            message = f"{self.path}: not a readable dump ({error}); delete it and re-run the dump stage"
            raise DumpError(message) from None

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
        return self._group[escape(name)][()]

    def info(self, name: str) -> dict[str, object]:
        return dict(self._group[escape(name)].attrs)
