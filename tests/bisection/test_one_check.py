"""One accuracy check, one verdict: the same sample results get the same verdict from every place that asks
(issue 21, item 3), on real files and real ONNX Runtime sessions.

The model is x ─ Add(x, x) ─ y. Each sample's reference dump holds y = 2x + offset, written by the dump
stage itself running a "compiled" model that adds the offset, so a sample fails exactly where its offset is
beyond the tolerances. The candidate is the model as it is (y = 2x). Asked of the same samples:

- compare: `build_report` on the candidate's and the reference's dumps, the report's `passed`;
- `accubisect judge` on that report.json (its exit status);
- a bisection's probe: `SampleJudge` on a session of the model, judged against the reference dumps;
- reduce's probe: `CutProber.judge` of the whole model as a cut (fails as compiled or not);
- repro.py, run as `python repro.py` on the folder reduce would write, its check embedded in candidate.json.

With a val_func the offsets of passing samples are beyond the tolerances but within what the val_func
accepts, so a place that ignored the val_func would fail them. Reduce's probe and repro.py judge a cut's
tensors by the tolerances (a val_func is written for the model's outputs); reduce refuses a candidate whose
comparison passes (tests/e2e/test_bad_inputs.py, ONE_CHECK).
"""

from __future__ import annotations

import runpy
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.reduce import candidate_spec
from accubisect.bisection.reduce_probe import Candidate, Cut, CutProber, ReferenceValues
from accubisect.bisection.repro_script import REPRO
from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.subgraph import Graph
from accubisect.formats.compile_record import Variant
from accubisect.formats.dump_file import DumpReader
from accubisect.formats.val_func import load_val_func
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU
from accubisect.stages.compare import Compared, build_report, graph_from_dump
from accubisect.stages.dump import DumpStep, dump_sample
from accubisect.workflow.cli import main

TOLERANCES = {"rtol": 1e-3, "atol": 1e-4, "ntol": 0.0, "cosine": None}
VAL_FUNC = "one_check_within_half:judge"  # passes a sample whose outputs are all within 0.5
OFF = {"tolerances": (0.0, 1.0), "val_func": (0.1, 1.0)}  # offset of a passing, a failing sample

# (min_pass_fraction, val_func, which samples pass, the verdict every place must give)
TABLE = [
    (1.0, None, [True] * 4, True),
    (1.0, None, [True, True, True, False], False),
    (0.75, None, [True, True, True, False], True),
    (0.75, None, [True, False, True, False], False),
    (0.5, None, [False, True, False, True], True),
    (0.5, None, [False, False, False, True], False),
    (1.0, VAL_FUNC, [True] * 4, True),
    (1.0, VAL_FUNC, [True, False, True, True], False),
    (0.75, VAL_FUNC, [True, True, True, False], True),
]


def model(path: Path, offset: float | None = None) -> Path:
    """x ─ Add(x, x) ─ y; with `offset`, y = 2x + offset (a reference that differs where a sample should fail)."""
    nodes = [helper.make_node("Add", ["x", "x"], ["y" if offset is None else "twice"], name="double")]
    initializers = []
    if offset is not None:
        nodes.append(helper.make_node("Add", ["twice", "offset"], ["y"], name="shift"))
        initializers.append(numpy_helper.from_array(np.asarray(offset, np.float32), "offset"))
    graph = helper.make_graph(nodes, "double", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


@pytest.fixture(scope="module")
def beside(tmp_path_factory):
    """A working directory holding the val_func module, as a workflow's does."""
    folder = tmp_path_factory.mktemp("one_check")
    (folder / "one_check_within_half.py").write_text(
        "import numpy as np\n\n\ndef judge(reference, candidate):\n"
        "    return all(bool(np.abs(reference[n] - candidate[n]).max() < 0.5) for n in reference)\n")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def project(folder: Path, passing: list[bool], offsets: tuple[float, float]) -> dict:
    """The samples, their inputs and both runs' dumps (made by the dump stage), per `passing`."""
    folder.mkdir()
    original = model(folder / "model.onnx")
    files: dict = {"model": original, "inputs": [], "reference": [], "candidate": [], "expected": []}
    rng = np.random.default_rng(0)
    for index, ok in enumerate(passing):
        sample, offset = f"sample{index}", offsets[0] if ok else offsets[1]
        np.savez(folder / f"{sample}_inputs.npz", x=rng.normal(size=4).astype(np.float32))
        files["inputs"].append(folder / f"{sample}_inputs.npz")
        shifted = model(folder / f"shifted{index}.onnx", offset)
        for side, compiled in (("reference", shifted), ("candidate", original)):
            dump = folder / f"{side}{index}.h5"
            dump_sample(DumpStep(original, compiled, files["inputs"][-1], dump, side, sample, "ort-cpu", threads=1))
            files[side].append(dump)
        with DumpReader(files["reference"][-1]) as reference:
            files["expected"].append({"y": reference.read_output("y")})
    return files


def compare_verdict(files: dict, accuracy: dict, folder: Path) -> tuple[bool, int]:
    """compare's report, and `accubisect judge` run on it."""
    samples = tuple(f"sample{i}" for i in range(len(files["inputs"])))
    comparison = Compared(tuple(files["reference"]), tuple(files["candidate"]), ("",) * len(samples), samples,
                          ("y",), accuracy, "fp16", ("fusion_off", "fusion_on"))
    with DumpReader(files["candidate"][0]) as candidate:
        graph = graph_from_dump(candidate)
    report = build_report(comparison, graph, load_val_func(AccuracyCheck.from_config(accuracy)))
    report.write(folder / "report.json")
    return report.passed, main(["judge", str(folder / "report.json")])


def bisection_verdict(files: dict, accuracy: dict) -> bool:
    judge = SampleJudge.load(files["inputs"], files["reference"], ["y"], accuracy)
    runner = ort_compile.Runner(files["model"], ort_compile.CompileOptions("off"), CPU, threads=1).activate()
    return judge.judge(runner)["passed"]


def reduce_verdict(files: dict, accuracy: dict) -> bool:
    """Whether reduce's probe finds the whole model passing as the candidate compiles it."""
    original = onnx.load(files["model"])
    graph = Graph(original)
    reference = ReferenceValues(original, files["reference"], files["inputs"], CPU, 1)
    samples = [f"sample{i}" for i in range(len(files["inputs"]))]
    prober = CutProber(graph, reference, Candidate(Variant("fusion_on", "off"), CPU, 1),
                       AccuracyCheck.from_config(accuracy), samples)
    verdict = prober.judge(Cut((0,), ("y",)))
    return not any("answer" in sample for sample in verdict["samples"])  # judged with the answer: failed as compiled


def repro_exit(files: dict, accuracy: dict, folder: Path) -> int:
    """The folder reduce writes for that cut, and `python repro.py` run in it (in this process)."""
    folder.mkdir()
    (folder / "model.onnx").write_bytes(files["model"].read_bytes())
    samples = [f"sample{i}" for i in range(len(files["inputs"]))]
    for sample, inputs, expected in zip(samples, files["inputs"], files["expected"], strict=True):
        for side, arrays in (("inputs", dict(np.load(inputs))), ("expected", expected)):
            (folder / side).mkdir(exist_ok=True)
            np.savez(folder / side / f"{sample}.npz", **arrays)
    check = AccuracyCheck.from_config(accuracy).on_tensors()  # the CutProber's: reduce writes `prober.check`
    spec = candidate_spec(SimpleNamespace(bisection="fusion"), Candidate(Variant("fusion_on", "off"), CPU, 1), check,
                          onnx.load(files["model"]), samples)  # reduce's own candidate.json writer
    spec.write(folder / "candidate.json")
    (folder / "repro.py").write_text(REPRO)
    argv = sys.argv
    sys.argv = ["repro.py"]
    try:
        runpy.run_path(str(folder / "repro.py"), run_name="__main__")
    except SystemExit as exited:
        return exited.code
    finally:
        sys.argv = argv
    raise AssertionError("repro.py did not exit")


@pytest.mark.parametrize(("fraction", "val_func", "passing", "expected"), TABLE)
def test_every_place_gives_the_same_verdict(beside, tmp_path, monkeypatch, fraction, val_func, passing, expected):
    monkeypatch.chdir(beside)
    accuracy = {**TOLERANCES, "val_func": val_func, "min_pass_fraction": fraction}
    files = project(tmp_path / "project", passing, OFF["val_func" if val_func else "tolerances"])
    report_passed, judge_exit = compare_verdict(files, accuracy, tmp_path)
    assert report_passed is expected
    assert judge_exit == (0 if expected else 1)
    assert bisection_verdict(files, accuracy) is expected
    if val_func is None:  # a cut's tensors are judged by the tolerances: see the module's docstring
        assert reduce_verdict(files, accuracy) is expected
        assert repro_exit(files, accuracy, tmp_path / "repro") == (0 if expected else 1)


def test_the_check_is_built_once_from_the_config_section_and_given_back():
    accuracy = {**TOLERANCES, "cosine": 0.99, "val_func": VAL_FUNC, "min_pass_fraction": 0.75}
    check = AccuracyCheck.from_config(accuracy)
    assert check.to_config() == accuracy and AccuracyCheck.from_config(check.to_config()) == check
    assert check.describe() == ("rtol 0.001, atol 0.0001, ntol 0, cosine ≥ 0.99, val_func one_check_within_half:judge, "
                                "min pass fraction 0.75")
    assert replace(check, val_func=None) == check.on_tensors()
