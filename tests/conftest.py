"""Shared fixtures: the bundled example, tiny models built with onnx.helper, and a workflow runner."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_MODEL = REPO / "examples" / "transformer.onnx"
EXAMPLE_SAMPLES = REPO / "examples" / "samples"
GELU_APPROXIMATION = {"optimization.enable_gelu_approximation": "1"}
EXAMPLE = ("--configfile", "examples/config.yaml")  # the bundled example's settings (the Snakefile names none)
EXAMPLE_CONTEXT = ("model examples/transformer.onnx; 4 sample(s) from examples/samples; compile level all; "
                   "session config optimization.enable_gelu_approximation=1; switch file none; backend ort-cpu")


def save_model(nodes, inputs, outputs, initializers, path: Path, opset: int = 17) -> Path:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


def without_lengths(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (read without its weights) with its external tensors' `length` entries left out, as some exporters
    write them (ORT then reads as many bytes as the shape holds); changed in place."""
    for tensor in model.graph.initializer:
        kept = [(entry.key, entry.value) for entry in tensor.external_data if entry.key != "length"]
        del tensor.external_data[:]
        for key, value in kept:
            tensor.external_data.add(key=key, value=value)
    return model


def save_float_model(nodes, weights: dict[str, np.ndarray], shape: list[int], path: Path) -> Path:
    """`nodes` from one float input "x" to one float output "y" of the same `shape`, `weights` as f32."""
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                      [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()],
                      path)


def openvino_precision_step(model: Path, inputs: list[Path], folder: Path, ntol: float = 0.0, dtype: str = "bf16",
                            key: dict | None = None):
    """precision_bisect's step on openvino-cpu as the rule builds it, one thread, the check rtol 1e-2, atol 1e-3
    and `ntol`: each sample judged against OpenVINO's f32 outputs (written beside it, as `_outputs.npz`), the
    answer and the verdict store in `folder`."""
    import openvino as ov

    from accubisect.bisection.openvino_precision import OpenVinoPrecisionStep

    compiled = ov.Core().compile_model(str(model), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    references = [Path(str(path).replace("_inputs", "_outputs")) for path in inputs]
    for path, reference in zip(inputs, references, strict=True):
        outputs = compiled(dict(np.load(path)))
        np.savez(reference, **{port.get_any_name(): outputs[port] for port in compiled.outputs})
    accuracy = {"rtol": 1e-2, "atol": 1e-3, "ntol": ntol, "cosine": None, "min_pass_fraction": 1.0, "val_func": None}
    return OpenVinoPrecisionStep(model, tuple(inputs), tuple(references),
                                 tuple(port.get_any_name() for port in compiled.outputs), accuracy, dtype, 1,
                                 *(folder / name for name in ("result.json", "keep_dtype.txt", "model.xml",
                                                              "model.bin", "summary.txt")),
                                 {"root": str(folder / "verdicts"), "key": key or {}}, openvino_context(model, inputs))


def openvino_context(model: Path, inputs: list[Path]) -> dict:
    """An OpenVINO job's context (its summary's first line) for `model` on the samples `inputs`."""
    return {"model": str(model), "samples": str(inputs[0].parent), "sample_count": len(inputs), "level": "all",
            "session_config": {}, "fusion_switch": None, "backend": "openvino-cpu"}


@pytest.fixture
def ffn_model(tmp_path: Path) -> Path:
    """A MatMul+Add feeding an erf-Gelu, on which MatMulAddFusion, GeluFusion and GeluApproximation fire.

        x ─ MatMul(w) ─ Add(b) ─ Div ─ Erf ─ Add(1) ─ Mul(h) ─ Mul(0.5) ─ Relu ─ y
    """
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "b"], ["h"], name="bias"),
        helper.make_node("Div", ["h", "sqrt2"], ["g0"], name="gelu/div"),
        helper.make_node("Erf", ["g0"], ["g1"], name="gelu/erf"),
        helper.make_node("Add", ["g1", "one"], ["g2"], name="gelu/add"),
        helper.make_node("Mul", ["h", "g2"], ["g3"], name="gelu/mul"),
        helper.make_node("Mul", ["g3", "half"], ["g"], name="gelu/half"),
        helper.make_node("Relu", ["g"], ["y"], name="relu"),
    ]
    inits = [const("w", rng.normal(0, 0.5, (8, 8))), const("b", rng.normal(0, 0.1, 8)), const("sqrt2", np.sqrt(2)),
             const("one", 1.0), const("half", 0.5)]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], inits,
                      tmp_path / "ffn.onnx")


def copy_workflow(folder: Path) -> Path:
    """A runnable copy of the workflow and the bundled example (configured by `EXAMPLE`) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "Snakefile", folder / "Snakefile")
    for name in ("rules", "scripts", "examples", "profiles"):
        shutil.copytree(REPO / name, folder / name)
    return folder


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests run only when a `-m` names them (`-m slow`, the second job of `./run test`): any other
    `-m`, the fast tier's `-m "not e2e"` too, would otherwise replace the default and run them."""
    if "slow" in config.option.markexpr:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    config.hook.pytest_deselected(items=slow)
    items[:] = [item for item in items if not item.get_closest_marker("slow")]


_running = {"e2e": True}  # whether the test being set up carries the e2e marker


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Noted before any fixture of the test is set up, module-scoped ones too, for `snakemake` to check."""
    _running["e2e"] = item.get_closest_marker("e2e") is not None


def snakemake(folder: Path, *arguments: str, check: bool = True) -> subprocess.CompletedProcess:
    """The real `snakemake` command in `folder`; only a test marked `e2e` may run it (the fast tier,
    `-m "not e2e"`, runs none)."""
    if not _running["e2e"]:
        raise AssertionError("this test runs the real snakemake command: mark it @pytest.mark.e2e")
    command = [sys.executable, "-m", "snakemake", *arguments, "--cores", "2"]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(arguments)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def run_expecting_error(folder: Path, *config: str) -> str:
    """The one `accubisect:` line a `snakemake compare` of the example with `--config` `config` fails with."""
    result = snakemake(folder, "compare", *EXAMPLE, "--config", *config, check=False)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("accubisect:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def snakemake_log(result: subprocess.CompletedProcess) -> str:
    """The log file a snakemake run wrote, which it names on its console's "Complete log(s):" line; the
    console leaves Snakemake's per-job lines out (docs/reports.md, "Console"). Empty for a run with nothing to do."""
    for line in (result.stdout + result.stderr).splitlines():
        if line.startswith("Complete log(s): "):
            return Path(line.removeprefix("Complete log(s): ")).read_text()
    return ""


def jobs_run(result: subprocess.CompletedProcess) -> list[str]:
    """Names of the rules whose jobs a snakemake run executed."""
    starts = ("rule ", "localrule ", "checkpoint ", "localcheckpoint ")
    lines = snakemake_log(result).splitlines()
    return sorted(line.split()[-1].rstrip(":") for line in lines if line.startswith(starts))


def layer_norm_model(path: Path) -> Path:
    """x ─ ReduceMean ─ Sub ─ Pow(2) ─ ReduceMean ─ Add(eps) ─ Sqrt ─ Div ─ y: the sum of squares of
    inputs near ±1000 reaches 1e6, far beyond fp16's 65504, though x and y are both small enough."""
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], name="ln/mean"),
             helper.make_node("Sub", ["x", "mean"], ["centered"], name="ln/sub"),
             helper.make_node("Pow", ["centered", "two"], ["square"], name="ln/pow"),
             helper.make_node("ReduceMean", ["square"], ["var"], axes=[-1], name="ln/var"),
             helper.make_node("Add", ["var", "eps"], ["var_eps"], name="ln/add_eps"),
             helper.make_node("Sqrt", ["var_eps"], ["std"], name="ln/sqrt"),
             helper.make_node("Div", ["centered", "std"], ["y"], name="ln/div")]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                      [const("two", 2.0), const("eps", 1e-5)], path)


def compare_report(verdicts=(), tensors=(), passed: bool = False):
    """A compare report (report.json's record) holding only what a test gives: sample verdicts, tensor rows."""
    from accubisect.formats.compare_report import CompareReport

    accuracy = {"rtol": 1e-3, "atol": 1e-4, "ntol": 0.0, "cosine": None, "val_func": None, "min_pass_fraction": 1.0}
    return CompareReport("fusion_off", "fusion_on", accuracy, "fp16", tuple(v.sample for v in verdicts), False,
                         tuple(verdicts), tuple(tensors), passed)


def sample_verdict(index: int, candidate_passed: bool, reference_passed: bool | None = None):
    """One sample's outputs judged: the candidate's, and the reference's where golden outputs judged it too."""
    from accubisect.formats.compare_report import SampleVerdict

    reference = None if reference_passed is None else {"passed": reference_passed, "outputs": {}}
    return SampleVerdict(f"sample{index}", "reference" if reference is None else "golden",
                         {"passed": candidate_passed, "outputs": {}}, reference)


def tensor_row(index: int, node: str, rule: str | None = None, passed: bool = True, worst=None, local=None):
    """One tensor row, with the fields a ranking reads: where it is, whether it passed, its worst metrics."""
    from accubisect.formats.compare_report import TensorRow

    return TensorRow(f"{node}:0", index, 0, node, "Op", rule, (rule,) if rule else (), (), (), {}, passed,
                     worst or {}, {}, {}, local)


def schema_keys(properties: dict, prefix: str = "") -> dict[str, dict]:
    """Every key the schema accepts, dotted (`compile.level`), leaves only: a section is documented by its
    keys."""
    keys = {}
    for name, spec in properties.items():
        if "properties" in spec:
            keys |= schema_keys(spec["properties"], f"{prefix}{name}.")
        else:
            keys[f"{prefix}{name}"] = spec
    return keys
