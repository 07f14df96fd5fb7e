"""Builds the precision example: a small audio-style feature extractor with two genuine fp16 problems.

    x ─ Conv ─ Relu ─ BatchNorm ─ Mul(gain) ─ Mul(itself) ─ ReduceSum ─ Sqrt ─ Div ─ Add(1) ─ Log ─ MatMul ─ Add ─ y

- the BatchNorm's running variance (up to 1e6) is beyond fp16's 65504: rounded to inf, it wipes the
  normalised signal out (the Relu between Conv and BatchNorm keeps ORT from folding it into the Conv);
- the energy (squares up to ~1e6 and their channel sum) overflows fp16 though input and output are small.
Golden outputs come from ONNX's reference evaluator. Run from the repository root:
`python examples/build_precision_example.py`; seeds are fixed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

HERE = Path(__file__).resolve().parent / "precision"
CHANNELS, FRAMES, FEATURES = 16, 32, 8


def build_model(rng: np.random.Generator) -> onnx.ModelProto:
    def const(name: str, value) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    variance = rng.uniform(1e5, 1e6, CHANNELS)
    initializers = [
        const("conv/w", rng.normal(0, 0.3, (CHANNELS, 4, 3))), const("conv/b", rng.normal(0, 0.1, CHANNELS)),
        const("bn/scale", np.sqrt(variance) * rng.uniform(0.5, 1.5, CHANNELS)), const("bn/bias", np.zeros(CHANNELS)),
        const("bn/mean", rng.normal(0, 0.1, CHANNELS)), const("bn/var", variance),
        const("gain", 200.0), const("scale", 1e-3), const("one", 1.0),
        const("proj/w", rng.normal(0, 0.3, (1, FEATURES))), const("proj/b", rng.normal(0, 0.1, FEATURES)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv/w", "conv/b"], ["c"], name="conv", pads=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("BatchNormalization", ["r", "bn/scale", "bn/bias", "bn/mean", "bn/var"], ["n"], name="bn"),
        helper.make_node("Mul", ["n", "gain"], ["g"], name="gain"),
        helper.make_node("Mul", ["g", "g"], ["sq"], name="energy/square"),
        helper.make_node("ReduceSum", ["sq", "axes"], ["sum"], name="energy/sum", keepdims=1),
        helper.make_node("Sqrt", ["sum"], ["mag"], name="energy/sqrt"),
        helper.make_node("Mul", ["mag", "scale"], ["scaled"], name="compress/scale"),
        helper.make_node("Add", ["scaled", "one"], ["shifted"], name="compress/shift"),
        helper.make_node("Log", ["shifted"], ["logmag"], name="compress/log"),
        helper.make_node("Transpose", ["logmag"], ["frames"], name="to_frames", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["frames", "proj/w"], ["p"], name="proj/matmul"),
        helper.make_node("Add", ["p", "proj/b"], ["y"], name="proj/bias"),
    ]
    initializers.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
    graph = helper.make_graph(nodes, "accubisect_precision_example",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, FRAMES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, FRAMES, FEATURES])],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="accubisect")
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    rng = np.random.default_rng(0)
    model = build_model(rng)
    samples = HERE / "samples"
    samples.mkdir(parents=True, exist_ok=True)
    onnx.save(model, HERE / "extractor.onnx")
    reference = ReferenceEvaluator(model)
    for index in range(3):
        x = rng.normal(0, 1, (1, 4, FRAMES)).astype(np.float32)
        np.savez(samples / f"sample{index}_inputs.npz", x=x)
        np.savez(samples / f"sample{index}_outputs.npz", y=reference.run(None, {"x": x})[0].astype(np.float32))
    print(f"wrote {HERE / 'extractor.onnx'} ({len(model.graph.node)} nodes) and 3 samples")


if __name__ == "__main__":
    main()
