"""A gigabyte transformer with external data and a planted fp16 overflow, for issue 22's measurements.

    .venv/bin/python bench/large_model.py [--size-gb 1.07] [--out .cache/large_models] [--seed 0]

Writes (once, then reused) `<out>/<params-hash>/`: `transformer.onnx` (the graph only), `transformer.onnx.data`
(every weight, one tensor after another), `samples/sample{0,1}_inputs.npz` (x: [1, 64, d]) and `config.yaml`
(the workflow's keys for this model, absolute paths), and prints the folder. `--size-gb 0.005` is the
few-megabyte variant the fast tier uses.

Each of the `BLOCKS` blocks is a pre-norm FFN, as in a transformer's MLP half:

    h ─ LayerNorm ─ MatMul(w1) ─ Add(b1) ─ erf-GELU ─ MatMul(w2) ─ Add(b2) ─┬─ Add(h) ─ next block
                                                        (planted block only) └ Mul(2^-16)

d is the smallest multiple of 16 whose fp32 weights (64 d² + 56 d floats for 8 blocks, hidden 4 d) reach
the requested size: d = 2048 for 1.07 GB (268 M parameters), 144 for 0.005 GB. In the planted block w2 and
b2 are scaled by 2^16 and its Mul scales the FFN output back, the T5 pattern: with powers of two the fp32
model computes exactly what an unscaled one would, while the FFN output (rms ~0.65 before scaling) exceeds
fp16's 65504 on every sample, so fp16 storage of that block's second MatMul, its Add or its Mul fails.

Weights come from `np.random.default_rng([seed, block])`, one tensor at a time, written straight to the data
file, so the generator holds one tensor, never the model. The folder is written under a temporary name and
renamed into place when complete, so a folder under its hash is always whole.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "large_models"
FORMAT = 2  # bump when the graph, the weights or the files change: the hash then names a new folder
BLOCKS, TOKENS, SAMPLES = 8, 64, 2
OVERFLOW_EXPONENT = 16  # the planted block's FFN runs 2^16 times too large: rms ~0.65 becomes ~4e4
ALIGNMENT = 4096  # each tensor starts on a page, so ONNX Runtime can map it
MODEL, DATA = "transformer.onnx", "transformer.onnx.data"
# fp16 storage with the planted chain kept in fp32 misses fp32 by at most 0.0135 absolute (|y| up to 11) on
# both sizes' samples (numpy emulation): atol 0.05 passes that with margin; the overflow gives NaN and fails.
ACCURACY = {"rtol": 1e-2, "atol": 5e-2}


@dataclass(frozen=True)
class LargeModel:
    """Where a generated model's files are, and what was planted in it."""

    folder: Path
    d: int
    planted_block: int

    @property
    def model(self) -> Path:
        return self.folder / MODEL

    @property
    def data(self) -> Path:
        return self.folder / DATA

    @property
    def samples(self) -> Path:
        return self.folder / "samples"

    @property
    def config(self) -> Path:
        return self.folder / "config.yaml"

    @property
    def ffn_output(self) -> str:
        """The planted block's FFN output before the Mul: the tensor that exceeds fp16's range."""
        return f"b{self.planted_block}/ffn2_out"

    def complete(self) -> bool:
        """Whether every file is there and the data file has the size the graph says."""
        files = [self.model, self.data, self.config] + [self.samples / f"sample{n}_inputs.npz" for n in range(SAMPLES)]
        return all(path.is_file() for path in files) and self.data.stat().st_size == data_bytes(self.d)


def weight_floats(d: int) -> int:
    """fp32 weights of the model: per block LayerNorm scale and bias, w1 (d x 4d), b1, w2 (4d x d), b2."""
    return BLOCKS * (8 * d * d + 7 * d) + 1


def choose_d(size_gb: float) -> int:
    """The smallest multiple of 16 whose weights reach `size_gb` (10^9 bytes)."""
    d = 16 * max(1, math.ceil(math.sqrt(size_gb * 1e9 / 4 / (8 * BLOCKS)) / 16))
    while weight_floats(d) * 4 < size_gb * 1e9:
        d += 16
    return d


def tensor_shapes(d: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every initializer in data-file order: per block, then the planted block's scale."""
    shapes = []
    for block in range(BLOCKS):
        shapes += [(f"b{block}/ln_g", (d,)), (f"b{block}/ln_b", (d,)), (f"b{block}/w1", (d, 4 * d)),
                   (f"b{block}/b1", (4 * d,)), (f"b{block}/w2", (4 * d, d)), (f"b{block}/b2", (d,))]
    return shapes + [("overflow_scale", ())]


def data_bytes(d: int) -> int:
    """The data file's size: each tensor aligned to `ALIGNMENT`, the last one unpadded."""
    offset = 0
    for _, shape in tensor_shapes(d):
        offset = _aligned(offset) + 4 * math.prod(shape)
    return offset


def _aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def params_hash(d: int, seed: int) -> str:
    """The folder name: everything that determines the files."""
    params = {"format": FORMAT, "blocks": BLOCKS, "d": d, "seed": seed, "tokens": TOKENS, "samples": SAMPLES,
              "overflow_exponent": OVERFLOW_EXPONENT, "alignment": ALIGNMENT}
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def block_weights(d: int, seed: int, block: int, planted: bool):
    """Yields (name, array) for one block's tensors, drawn one at a time from the block's own generator."""
    rng = np.random.default_rng([seed, block])
    scale = 2.0**OVERFLOW_EXPONENT if planted else 1.0

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= np.float32(std)  # in place: one copy of the tensor
        return values

    yield f"b{block}/ln_g", 1 + normal((d,), 0.1)
    yield f"b{block}/ln_b", normal((d,), 0.1)
    yield f"b{block}/w1", normal((d, 4 * d), 1 / math.sqrt(d))
    yield f"b{block}/b1", normal((4 * d,), 0.1)
    yield f"b{block}/w2", normal((4 * d, d), scale / math.sqrt(4 * d))
    yield f"b{block}/b2", normal((d,), 0.1 * scale)


def write_weights(handle: BinaryIO, d: int, seed: int, planted_block: int) -> list[TensorProto]:
    """Writes every weight into `handle` and returns initializers that reference it."""
    blocks = (block_weights(d, seed, block, block == planted_block) for block in range(BLOCKS))
    scale = [("overflow_scale", np.asarray(2.0**-OVERFLOW_EXPONENT, np.float32))]
    initializers = []
    for name, array in itertools.chain(*blocks, scale):  # lazily: one array alive at a time
        handle.write(b"\0" * (_aligned(handle.tell()) - handle.tell()))
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape,
                             data_location=TensorProto.EXTERNAL)
        for key, value in (("location", DATA), ("offset", handle.tell()), ("length", array.nbytes)):
            tensor.external_data.add(key=key, value=str(value))
        handle.write(np.ascontiguousarray(array).data)
        initializers.append(tensor)
    return initializers


def block_nodes(block: int, planted: bool) -> list[onnx.NodeProto]:
    """One pre-norm FFN block: `x` or the previous block's `h{block}` in, `h{block + 1}` or `y` out."""
    p, node = f"b{block}/", helper.make_node
    ffn, h_in = p + "ffn2_out", f"h{block}" if block else "x"
    nodes = [
        node("LayerNormalization", [h_in, p + "ln_g", p + "ln_b"], [p + "ln_out"], name=p + "ln", axis=-1),
        node("MatMul", [p + "ln_out", p + "w1"], [p + "ffn1_mm"], name=p + "ffn1/matmul"),
        node("Add", [p + "ffn1_mm", p + "b1"], [p + "ffn1_out"], name=p + "ffn1/bias"),
        node("Div", [p + "ffn1_out", "sqrt2"], [p + "gelu_div"], name=p + "gelu/div"),
        node("Erf", [p + "gelu_div"], [p + "gelu_erf"], name=p + "gelu/erf"),
        node("Add", [p + "gelu_erf", "one"], [p + "gelu_add"], name=p + "gelu/add"),
        node("Mul", [p + "ffn1_out", p + "gelu_add"], [p + "gelu_mul"], name=p + "gelu/mul"),
        node("Mul", [p + "gelu_mul", "half"], [p + "gelu_out"], name=p + "gelu/half"),
        node("MatMul", [p + "gelu_out", p + "w2"], [p + "ffn2_mm"], name=p + "ffn2/matmul"),
        node("Add", [p + "ffn2_mm", p + "b2"], [ffn], name=p + "ffn2/bias"),
    ]
    if planted:
        nodes.append(node("Mul", [ffn, "overflow_scale"], [p + "ffn_scaled"], name=p + "ffn2/scale"))
        ffn = p + "ffn_scaled"
    return nodes + [node("Add", [h_in, ffn], [f"h{block + 1}" if block < BLOCKS - 1 else "y"],
                         name=p + "residual")]


def build_graph(d: int, initializers: list[TensorProto], planted_block: int) -> onnx.ModelProto:
    """The model proto around external initializers (ir_version 9, opset 17, as ORT 1.31 loads)."""
    constants = [numpy_helper.from_array(np.asarray(value, np.float32), name)
                 for name, value in (("sqrt2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))]
    nodes = [node for block in range(BLOCKS) for node in block_nodes(block, block == planted_block)]
    graph = helper.make_graph(nodes, "accubisect_large_transformer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, d])],
                              initializers + constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="accubisect-bench")
    model.ir_version = 9
    return model


def write_folder(folder: Path, final: Path, d: int, seed: int, planted_block: int) -> None:
    """Every file of the model into `folder`; the config names them where they will be, under `final`."""
    (folder / "samples").mkdir(parents=True)
    with open(folder / DATA, "wb") as handle:
        initializers = write_weights(handle, d, seed, planted_block)
    onnx.save(build_graph(d, initializers, planted_block), folder / MODEL)
    onnx.checker.check_model(str(folder / MODEL), full_check=True)
    rng = np.random.default_rng([seed, BLOCKS])
    for index in range(SAMPLES):
        np.savez(folder / "samples" / f"sample{index}_inputs.npz",
                 x=rng.standard_normal((1, TOKENS, d), dtype=np.float32))
    config = {"model": str(final / MODEL), "samples": str(final / "samples"), "compile": {"level": "all"},
              "precision": {"mode": "force_fp16", "dtype": "fp16"}, "accuracy": ACCURACY}
    (folder / "config.yaml").write_text(
        f"# bench/large_model.py: d={d}, {BLOCKS} blocks, planted fp16 overflow in block {planted_block}\n"
        + yaml.safe_dump(config, sort_keys=False))


def large_model(size_gb: float = 1.07, root: Path = CACHE, seed: int = 0) -> LargeModel:
    """The model of about `size_gb` under `root`, generated unless a complete copy is already there."""
    d = choose_d(size_gb)
    root = root.resolve()
    found = LargeModel(root / params_hash(d, seed), d, planted_block=BLOCKS // 2)
    if found.complete():
        return found
    shutil.rmtree(found.folder, ignore_errors=True)  # an incomplete copy, e.g. its data file truncated
    staging = root / f".{found.folder.name}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write_folder(staging, found.folder, d, seed, found.planted_block)
        os.rename(staging, found.folder)
    except OSError:
        if not found.complete():  # another process renamed its complete copy in first: use that one
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.07, help="fp32 weights to reach, in 10^9 bytes")
    parser.add_argument("--out", type=Path, default=CACHE, help="cache folder; the model goes in <out>/<params-hash>/")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    start = time.perf_counter()
    made = large_model(arguments.size_gb, arguments.out, arguments.seed)
    print(f"{made.folder}  d={made.d}, {BLOCKS} blocks, data {made.data.stat().st_size / 1e9:.3f} GB, graph "
          f"{made.model.stat().st_size / 1e3:.1f} kB, planted overflow at {made.ffn_output} "
          f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
