"""Peak memory and time of the streaming compare, against loading whole dumps, measured in one run.

    .venv/bin/python bench/compare_memory.py [--tensors 16] [--elements 2000000]

Writes two synthetic dumps (the candidate a perturbed copy of the reference), then measures with
tracemalloc (numpy and h5py allocations are traced):
- streaming: `compare.measure_tensors`, which holds one tensor pair at a time;
- baseline: every tensor of both dumps read into memory first, then the same metrics.
Target: the streaming peak is a small multiple of the largest tensor pair and does not grow with the
number of tensors; the baseline grows with the whole dump.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from pathlib import Path

import h5py
import numpy as np

from accubisect.core.accuracy import AccuracyCheck
from accubisect.formats.dump_file import GROUP, OUTPUTS, DumpReader, escape, write_index, write_tensor
from accubisect.formats.graph_record import GraphNode, GraphRecord
from accubisect.stages.compare import Compared, measure_pair, measure_tensors

TOLERANCE = AccuracyCheck(rtol=1e-3, atol=1e-4, ntol=0.0)


def write_dump(path: Path, tensors: int, elements: int, noise: float) -> None:
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as h5:
        group = h5.create_group(GROUP)
        h5.create_group(OUTPUTS)
        entries = []
        for index in range(tensors):
            values = np.random.default_rng(index).normal(size=elements).astype(np.float32)
            values += noise * rng.normal(size=elements).astype(np.float32)
            entries.append({"name": f"t{index}", "node": f"n{index}", "op_type": "Op", "topo_index": index,
                            "role": "output", "dtype": "float32", "model_dtype": "float32", "shape": [elements],
                            **write_tensor(group, f"t{index}", values)})
        h5[OUTPUTS].create_dataset(escape("y"), data=np.zeros(1, np.float32))
        write_index(h5, entries)


def graph(tensors: int) -> GraphRecord:
    return GraphRecord("candidate", (), tuple(GraphNode(i, f"n{i}", "Op", "ai.onnx", (), (f"t{i}",), (), None, ())
                                              for i in range(tensors)))


def measured(function) -> tuple[float, float]:
    tracemalloc.start()
    start = time.perf_counter()
    function()
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20, seconds


def streaming(reference: Path, candidate: Path, tensors: int) -> None:
    comparison = Compared((reference,), (candidate,), ("",), ("sample0",), (), {}, "fp16", ("reference", "candidate"))
    measure_tensors(comparison, graph(tensors), TOLERANCE)


def load_everything(reference: Path, candidate: Path) -> None:
    with DumpReader(reference) as ref, DumpReader(candidate) as cand:
        loaded = {name: (ref.read(name), cand.read(name)) for name in cand.names()}
    for pair in loaded.values():
        measure_pair(*pair, TOLERANCE, "fp16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--elements", type=int, default=2_000_000)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        reference, candidate = Path(folder) / "reference.h5", Path(folder) / "candidate.h5"
        write_dump(reference, arguments.tensors, arguments.elements, 0.0)
        write_dump(candidate, arguments.tensors, arguments.elements, 1e-3)
        pair = 2 * arguments.elements * 4 / 2**20
        dump = arguments.tensors * pair
        stream_peak, stream_seconds = measured(lambda: streaming(reference, candidate, arguments.tensors))
        base_peak, base_seconds = measured(lambda: load_everything(reference, candidate))
    print(f"{arguments.tensors} tensors of {arguments.elements} float32: largest pair {pair:.1f} MiB, "
          f"both dumps {dump:.1f} MiB")
    print(f"streaming compare: peak {stream_peak:.1f} MiB = {stream_peak / pair:.2f} x largest pair, "
          f"{stream_seconds:.2f} s")
    print(f"baseline (load all): peak {base_peak:.1f} MiB = {base_peak / pair:.2f} x largest pair, "
          f"{base_seconds:.2f} s")
    print(f"ratio streaming / baseline: memory {stream_peak / base_peak:.3f}, time {stream_seconds / base_seconds:.2f}")


if __name__ == "__main__":
    main()
