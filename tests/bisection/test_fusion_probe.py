"""fusion_bisect's probes read the weights from one mapping of the model's files only where the fusion-on
graph keeps most of them (`FusionProbe.shares_weights`, the rule probes' `rewrites_weights`): a MatMul model's
fusions keep them, so side by side they hold them once; a CNN's ConvBNFusion and NCHWc reorder rewrite them, so
ORT holds the weights it makes on top of the mapping, and each probe reads the files itself (the 170 MB CNN's
search job, two probes side by side: 952-976 MiB shared, 715-797 MiB not). Real ORT compiles and sessions,
models with external data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import save_float_model
from onnx import helper

from accubisect.bisection.fusion_bisect import FusionProbe
from accubisect.bisection.judging import SampleJudge
from accubisect.formats.compile_record import Variant
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import backend_named
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.stages.compile_stage import CompileStep, compile_variant

WIDTH = 64
ACCURACY = {"rtol": 1e-3, "atol": 1e-4, "ntol": 0.0, "cosine": None, "min_pass_fraction": 1.0, "val_func": None}


def cnn(path: Path) -> tuple[Path, list[int]]:
    """x ─ Conv ─ BatchNormalization ─ Relu ─ Conv ─ BatchNormalization ─ y: ConvBNFusion folds both."""
    rng = np.random.default_rng(0)
    weights = {}
    nodes = []
    for i, source in enumerate(("x", "r0")):
        weights |= {f"w{i}": rng.normal(0, 0.05, (WIDTH, WIDTH, 3, 3)), f"gamma{i}": rng.uniform(0.5, 1.5, WIDTH),
                    f"beta{i}": rng.normal(0, 0.1, WIDTH), f"mean{i}": rng.normal(0, 0.1, WIDTH),
                    f"var{i}": rng.uniform(0.5, 1.5, WIDTH)}
        nodes += [helper.make_node("Conv", [source, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
                  helper.make_node("BatchNormalization", [f"c{i}", f"gamma{i}", f"beta{i}", f"mean{i}", f"var{i}"],
                                   ["y" if i else "n0"], name=f"bn{i}")]
    nodes.insert(2, helper.make_node("Relu", ["n0"], ["r0"], name="relu"))
    return save_float_model(nodes, weights, [1, WIDTH, 8, 8], path), [1, WIDTH, 8, 8]


def mlp(path: Path) -> tuple[Path, list[int]]:
    """x ─ MatMul ─ Add ─ Relu ─ MatMul ─ y: MatMulAddFusion makes a Gemm of the same weights."""
    rng = np.random.default_rng(0)
    weights = {"w0": rng.normal(0, 0.1, (WIDTH * 4, WIDTH * 4)), "b0": rng.normal(0, 0.1, WIDTH * 4),
               "w1": rng.normal(0, 0.1, (WIDTH * 4, WIDTH * 4))}
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m"], name="mm0"),
             helper.make_node("Add", ["m", "b0"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w1"], ["y"], name="mm1")]
    return save_float_model(nodes, weights, [4, WIDTH * 4], path), [4, WIDTH * 4]


def fusion_probe(build, folder: Path) -> FusionProbe:
    """The probe the search job builds: `build`'s model saved with its weights in a data file, its fusion-on
    variant compiled as the compile job does, and one sample judged against the model's own fp32 run."""
    model, shape = build(folder / "m.onnx")
    onnx.save(onnx.load(model), model, save_as_external_data=True, location="m.onnx.data")
    fusion_on = Variant("fusion_on", "all")
    compile_variant(CompileStep(model, fusion_on.to_json(), "ort-cpu", folder / "on" / "model.onnx",
                                folder / "on" / "compile.json"))
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    np.savez(folder / "sample0_inputs.npz", x=x)
    np.savez(folder / "sample0_outputs.npz", y=reference.run(None, {"x": x})[0])
    judge = SampleJudge.load([folder / "sample0_inputs.npz"], [folder / "sample0_outputs.npz"], ["y"], ACCURACY)
    return FusionProbe(model, fusion_on, judge, backend_named("ort-cpu"), installed_catalogue(),
                       folder / "on" / "model.onnx")


@pytest.mark.parametrize(("build", "shared"), [(mlp, True), (cnn, False)])
def test_probes_share_one_mapping_of_the_weights_only_where_the_fusions_keep_them(build, shared, tmp_path,
                                                                                  monkeypatch):
    probe = fusion_probe(build, tmp_path)
    asked = []
    share = ort_compile.shared_weights
    monkeypatch.setattr(ort_compile, "shared_weights", lambda options: asked.append(options) or share(options))
    verdicts = [probe(frozenset(), 1, stop_early=False), probe(frozenset({"ConvBNFusion", "MatMulAddFusion"}), 1,
                                                              stop_early=False)]
    assert probe.shares_weights is shared
    assert len(asked) == (2 if shared else 0)
    assert [verdict["passed"] for verdict in verdicts] == [True, True]


def test_a_cnn_probe_judges_alike_through_the_mapping_or_not(tmp_path):
    """Answers unchanged: the probe that reads the files itself gives the verdict the shared mapping gave."""
    probe = fusion_probe(cnn, tmp_path)
    own = probe(frozenset({"ConvActivationFusion"}), 1, stop_early=False)
    off = compile_options(Variant("probe", "all", {}, frozenset({"ConvActivationFusion"})), probe.catalogue)
    options = ort_compile.shared_weights(ort_compile.with_weights(off, tmp_path))
    shared = probe.judge.judge(ort_compile.Runner(probe.graph, options, probe.runtime, 1).activate(), False)
    assert not probe.shares_weights and own == shared
