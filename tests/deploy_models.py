"""Models whose compiled graph passes in fp16 while the user's own graph does not, and the project folder
that runs one (tests/e2e/test_deployable_e2e.py, tests/bisection/test_deployable.py, the catalogue)."""

import numpy as np
import yaml
from conftest import save_model
from onnx import TensorProto, helper, numpy_helper


def conv_batchnorm(path):
    """x ─ Conv(w ~ 300) ─ BatchNormalization(variance 1e8) ─ y. ConvBNFusion folds the BatchNorm into the
    Conv's weights, so the compiled graph never holds the variance; in the model's own graph it becomes inf
    in fp16 and wipes out the output."""
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], name="bn")]
    inits = [const("w", rng.normal(0, 300, (4, 3, 3, 3))), const("scale", np.full(4, 10.0)),
             const("bias", rng.normal(0, 0.1, 4)), const("mean", np.zeros(4)), const("var", np.full(4, 1e8))]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits, path)


def shifted_sum(path):
    """x ─ MatMul(w) ─ Add(b ≈ 1e5) ─ Sub(1e5) ─ y. MatMulAddFusion makes MatMul and Add one Gemm, which must stay
    fp32 with the Sub (the bias and the sum overflow fp16): three of the model's nodes. In the model's own
    graph the MatMul's small output fits fp16, so the answer there is Add and Sub."""
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["shifted"], name="add"),
             helper.make_node("Sub", ["shifted", "c"], ["y"], name="sub")]
    inits = [const("w", rng.normal(0, 1, (8, 8))), const("b", 1e5 + rng.normal(0, 1, 8)), const("c", np.full(8, 1e5))]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits, path)


def project(folder, build, name, shape):
    """`name`.onnx made by `build`, two seeded samples in `name`_samples, and `name`.yaml naming them, judged
    at tolerances fp16 can meet, publishing to results/`name`."""
    build(folder / f"{name}.onnx")
    (folder / f"{name}_samples").mkdir()
    for index in range(2):
        np.savez(folder / f"{name}_samples" / f"sample{index}_inputs.npz",
                 x=np.random.default_rng(index).normal(0, 1, shape).astype(np.float32))
    config = {"model": f"{name}.onnx", "samples": f"{name}_samples", "results": f"results/{name}",
              "accuracy": {"rtol": 1e-2, "atol": 5e-2}}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config))
