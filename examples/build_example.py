"""Builds the bundled example: a small transformer block and its samples.

The model is written from primitive ONNX ops (LayerNorm as ReduceMean/Sub/Pow/Sqrt/Div, Gelu through Erf,
MatMul followed by Add, Conv followed by BatchNormalization and Relu) so that ONNX Runtime's fusions
really fire on it. Golden outputs come from ONNX's reference evaluator, which shares no kernel with ORT.

    x ─ Transpose ─ Conv ─ BatchNorm ─ Relu ─ Conv ─ Add(bias) ─ Transpose ─┐
    └────────────────────────────────────────────────────────────── Add ──┘
        ─ LayerNorm ─ MatMul ─ Add ─ Gelu(erf) ─ MatMul ─ Add ─┐
        └─────────────────────────────────────────────── Add ──┘ ─ LayerNorm ─ y

Run it from the repository root: `python examples/build_example.py`. Seeds are fixed, so the files it
writes are the same on every run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

HERE = Path(__file__).resolve().parent
SEQ, HIDDEN, FFN = 16, 32, 64
N_SAMPLES = 4


class GraphBuilder:
    """Collects nodes and initializers; names every node so the graph JSON reads well."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def random(self, name: str, shape: tuple[int, ...], scale: float, mean: float = 0.0) -> str:
        return self.const(name, self.rng.normal(mean, scale, shape))

    def op(self, op_type: str, name: str, inputs: list[str], output: str = "", **attrs: object) -> str:
        """Adds a node whose output tensor is named after the node unless `output` names it."""
        output = output or name
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        return output

    def layer_norm(self, prefix: str, x: str, output: str = "") -> str:
        mean = self.op("ReduceMean", f"{prefix}/mean", [x], axes=[-1])
        centered = self.op("Sub", f"{prefix}/sub", [x, mean])
        square = self.op("Pow", f"{prefix}/pow", [centered, self.const(f"{prefix}/two", 2.0)])
        var = self.op("ReduceMean", f"{prefix}/var", [square], axes=[-1])
        var_eps = self.op("Add", f"{prefix}/add_eps", [var, self.const(f"{prefix}/eps", 1e-5)])
        std = self.op("Sqrt", f"{prefix}/sqrt", [var_eps])
        normed = self.op("Div", f"{prefix}/div", [centered, std])
        scaled = self.op("Mul", f"{prefix}/scale", [normed, self.random(f"{prefix}/gamma", (HIDDEN,), 0.1, 1.0)])
        beta = self.random(f"{prefix}/beta", (HIDDEN,), 0.1)
        return self.op("Add", f"{prefix}/shift", [scaled, beta], output=output)

    def gelu(self, prefix: str, x: str) -> str:
        scaled = self.op("Div", f"{prefix}/div", [x, self.const(f"{prefix}/sqrt2", np.sqrt(2.0))])
        erf = self.op("Erf", f"{prefix}/erf", [scaled])
        shifted = self.op("Add", f"{prefix}/add", [erf, self.const(f"{prefix}/one", 1.0)])
        gated = self.op("Mul", f"{prefix}/mul", [x, shifted])
        return self.op("Mul", f"{prefix}/half", [gated, self.const(f"{prefix}/half_c", 0.5)])

    def linear(self, prefix: str, x: str, n_in: int, n_out: int, scale: float) -> str:
        product = self.op("MatMul", f"{prefix}/matmul", [x, self.random(f"{prefix}/weight", (n_in, n_out), scale)])
        return self.op("Add", f"{prefix}/bias", [product, self.random(f"{prefix}/bias_value", (n_out,), 0.1)])

    def conv_block(self, x: str) -> str:
        channels_first = self.op("Transpose", "conv/to_ncl", [x], perm=[0, 2, 1])
        conv = self.op("Conv", "conv/conv1", [channels_first, self.random("conv/w1", (HIDDEN, HIDDEN, 3), 0.1)],
                       pads=[1, 1])
        bn_params = [self.random("conv/bn_scale", (HIDDEN,), 0.1, 1.0), self.random("conv/bn_bias", (HIDDEN,), 0.1),
                     self.random("conv/bn_mean", (HIDDEN,), 0.1),
                     self.const("conv/bn_var", self.rng.uniform(0.5, 1.5, HIDDEN))]
        normed = self.op("BatchNormalization", "conv/bn", [conv, *bn_params])
        relu = self.op("Relu", "conv/relu", [normed])
        conv2 = self.op("Conv", "conv/conv2", [relu, self.random("conv/w2", (HIDDEN, HIDDEN, 1), 0.1)])
        biased = self.op("Add", "conv/bias", [conv2, self.random("conv/bias_value", (HIDDEN, 1), 0.1)])
        return self.op("Transpose", "conv/to_nlc", [biased], perm=[0, 2, 1])


def build_model(rng: np.random.Generator) -> onnx.ModelProto:
    g = GraphBuilder(rng)
    conv_out = g.conv_block("x")
    residual = g.op("Add", "residual1", ["x", conv_out])
    normed = g.layer_norm("ln1", residual)
    hidden = g.gelu("gelu", g.linear("ffn1", normed, HIDDEN, FFN, 0.35))
    ffn_out = g.linear("ffn2", hidden, FFN, HIDDEN, 0.15)
    g.layer_norm("ln2", g.op("Add", "residual2", [normed, ffn_out]), output="y")
    graph = helper.make_graph(
        g.nodes, "accubisect_example",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="accubisect")
    model.ir_version = 9  # ORT 1.31 rejects the newer default IR version of onnx 1.23
    onnx.checker.check_model(model, full_check=True)
    return model


def write_samples(model: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    reference = ReferenceEvaluator(model)
    for index in range(N_SAMPLES):
        x = rng.normal(0.0, 1.0, (1, SEQ, HIDDEN)).astype(np.float32)
        (y,) = reference.run(None, {"x": x})
        np.savez(folder / f"sample{index}_inputs.npz", x=x)
        np.savez(folder / f"sample{index}_outputs.npz", y=y.astype(np.float32))


def main() -> None:
    rng = np.random.default_rng(0)
    model = build_model(rng)
    onnx.save(model, HERE / "transformer.onnx")
    write_samples(model, rng, HERE / "samples")
    print(f"wrote {HERE / 'transformer.onnx'} ({len(model.graph.node)} nodes) and {N_SAMPLES} samples")


if __name__ == "__main__":
    main()
