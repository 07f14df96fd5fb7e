"""A model on which one rule fires at several sites and only some of them break accuracy.

Five feed-forward sites read the same input, each through its own weight (a rotation scaled by the site's
constant, so the Gelu's input has that magnitude), then an erf-Gelu and a residual Add:

    x ─┬─ MatMul(0.05·Q) ─ Div ─ Erf ─ Add ─ Mul ─ Mul (Gelu) ─ Add(x) ─ y0
       ├─ MatMul(3.0·Q)  ─ Gelu ─ Add(x) ─ y1   <- Gelu inputs up to about ±15: tanh form off by up to 4.7e-4
       ├─ MatMul(0.1·Q)  ─ Gelu ─ Add(x) ─ y2
       ├─ MatMul(2.0·Q)  ─ Gelu ─ Add(x) ─ y3   <- the same
       └─ MatMul(0.02·Q) ─ Gelu ─ Add(x) ─ y4

With `optimization.enable_gelu_approximation`, GeluFusion makes five Gelu nodes and GeluApproximation turns
each into a FastGelu (tanh form). On inputs of magnitude 0.3 or less the two forms agree to 1e-5, far inside
rtol 1e-3 / atol 1e-4; on inputs of magnitude 1 to 10 they differ by up to 4.7e-4 where the output is near
zero, and the check fails. So GeluApproximation is the culprit rule, and exactly 2 of its 5 instances (the
sites scaled by 3 and 2) break accuracy. Golden outputs come from ONNX's reference evaluator.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

SCALES = (0.05, 3.0, 0.1, 2.0, 0.02)
BREAKING = ("site1", "site3")  # the sites whose input range makes the approximation fail
SAMPLES = 3


def gelu_sites_model(path: Path, scales: tuple[float, ...] = SCALES) -> Path:
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes, outputs = [], []
    inits = [const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5)]
    rotation = np.linalg.qr(np.random.default_rng(0).normal(size=(16, 16)))[0]  # keeps the input's magnitude
    for site, scale in enumerate(scales):
        s = f"site{site}"
        inits.append(const(f"{s}/w", scale * rotation))
        nodes += [helper.make_node("MatMul", ["x", f"{s}/w"], [f"{s}/h"], name=f"{s}/matmul"),
                  helper.make_node("Div", [f"{s}/h", "sqrt2"], [f"{s}/g0"], name=f"{s}/gelu/div"),
                  helper.make_node("Erf", [f"{s}/g0"], [f"{s}/g1"], name=f"{s}/gelu/erf"),
                  helper.make_node("Add", [f"{s}/g1", "one"], [f"{s}/g2"], name=f"{s}/gelu/add"),
                  helper.make_node("Mul", [f"{s}/h", f"{s}/g2"], [f"{s}/g3"], name=f"{s}/gelu/mul"),
                  helper.make_node("Mul", [f"{s}/g3", "half"], [f"{s}/g"], name=f"{s}/gelu/half"),
                  helper.make_node("Add", [f"{s}/g", "x"], [f"y{site}"], name=f"{s}/residual")]
        outputs.append(helper.make_tensor_value_info(f"y{site}", TensorProto.FLOAT, [1, 8, 16]))
    graph = helper.make_graph(nodes, "gelu_sites", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


def build_gelu_sites(folder: Path) -> Path:
    """The model, its samples with golden outputs and a config (`gelu_sites.yaml`) in `folder`; returns the
    config's name, relative to `folder`."""
    model = gelu_sites_model(folder / "gelu_sites.onnx")
    samples = folder / "gelu_samples"
    samples.mkdir(parents=True, exist_ok=True)
    reference, rng = ReferenceEvaluator(str(model)), np.random.default_rng(3)
    names = [output.name for output in onnx.load(model).graph.output]
    for index in range(SAMPLES):
        x = rng.normal(0, 1.5, (1, 8, 16)).astype(np.float32)
        np.savez(samples / f"sample{index}_inputs.npz", x=x)
        np.savez(samples / f"sample{index}_outputs.npz", **dict(zip(names, reference.run(None, {"x": x}), strict=True)))
    config = {"model": "gelu_sites.onnx", "samples": "gelu_samples", "results": "gelu_results",
              "compile": {"session_config": {"optimization.enable_gelu_approximation": "1"}}}
    (folder / "gelu_sites.yaml").write_text(yaml.safe_dump(config))
    return "gelu_sites.yaml"
