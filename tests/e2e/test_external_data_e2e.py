"""A model whose weights live in a data file beside its graph, through compare, fusion_bisect, bundle and reduce.

The model is bench/large_model.py's transformer at its fast-tier size (~5 MB of weights in
`transformer.onnx.data`). The same model saved whole is run alongside: external data must change no answer.
With GELU approximation on and tight tolerances, fusion breaks accuracy, so the rule search and the instance
search have work to do; the compiled copies must carry their own data file and load from anywhere. reduce runs
in both modes (fusion, and precision after precision_bisect on the model's fp16 config): each repro holds only
the weights of its subgraph.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from conftest import copy_workflow, snakemake
from onnx import numpy_helper

from accubisect.formats.files import atomic_model
from accubisect.workflow.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from large_model import BLOCKS, DATA, LargeModel, large_model  # noqa: E402

SIZE_GB = 0.005
# GeluApproximation's FastGelu misses erf-GELU by ~5e-4: these tolerances make it the one culprit
BREAKING = ("compile={session_config: {optimization.enable_gelu_approximation: 1}}",
            "accuracy={rtol: 0.0001, atol: 0.00001}")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> LargeModel:
    return large_model(SIZE_GB, tmp_path_factory.mktemp("large_models"))


def whole_copy(model: LargeModel, folder: Path) -> Path:
    """The config of the same model saved in one file (weights inline), same samples."""
    onnx.save(onnx.load(model.model), folder / "whole.onnx")
    config = yaml.safe_load(model.config.read_text())
    (folder / "whole.yaml").write_text(yaml.safe_dump({**config, "model": str(folder / "whole.onnx")}))
    return folder / "whole.yaml"


@pytest.fixture(scope="module")
def runs(small: LargeModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The project run on the external-data model (`external`, bundled too) and on its whole copy (`whole`),
    each with its results folder; both in one workflow folder."""
    folder = copy_workflow(tmp_path_factory.mktemp("external_data"))
    whole = whole_copy(small, folder)
    for results, configfile, bundle in (("external", small.config, ("bundle",)), ("whole", whole, ())):
        snakemake(folder, "compare", "fusion_bisect", *bundle, "--configfile", str(configfile), "--config", *BREAKING,
                  f"results={results}")
    return {"folder": folder, "external": folder / "external", "whole": folder / "whole"}


def answers(results: Path) -> dict[str, object]:
    """What a run concluded, less the line naming the model file."""
    report = json.loads((results / "compare" / "report.json").read_text())
    bisect = json.loads((results / "fusion_bisect" / "result.json").read_text())
    instances = json.loads((results / "fusion_bisect" / "instances.json").read_text())
    return {"passed": report["passed"], "tensors": report["tensors"], "verdicts": report["verdicts"],
            "culprits": bisect["culprits"], "rules": instances["rules"],
            "instances": instances["search"]["culprits"], "hybrid": instances["hybrid"],
            "summary": (results / "fusion_bisect" / "summary.txt").read_text().split("\n", 1)[1]}


@pytest.mark.e2e
def test_compare_and_fusion_bisect_answer_as_for_the_model_saved_whole(runs: dict[str, Path]) -> None:
    external, whole = answers(runs["external"]), answers(runs["whole"])
    assert external == whole
    assert not external["passed"] and external["culprits"] == ["GeluApproximation"]
    assert external["hybrid"]["passed"] and external["hybrid"]["reverted"]


@pytest.mark.e2e
def test_compiled_copies_carry_their_own_data_and_load_from_anywhere(runs: dict[str, Path], small: LargeModel,
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = [path for path in (runs["folder"] / "workspace" / "compile").glob("*/model.onnx")
                if (path.parent / "model.onnx.data").is_file()]
    assert len(compiled) == 2  # fusion off and on of the external-data model; the whole copy's have no data file
    monkeypatch.chdir(tmp_path)
    for path in compiled:
        loaded = onnx.load(str(path))  # resolves the data beside the graph, whatever the working directory
        names = {t.name for t in loaded.graph.initializer}
        assert "b4/w2" in names and all(t.data_location != onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
        locations = {entry.value for t in onnx.load(str(path), load_external_data=False).graph.initializer
                     for entry in t.external_data if entry.key == "location"}
        assert locations == {"model.onnx.data"}
    assert small.data.is_file()  # the user's data file is read, never moved


def checked_hybrid(results: Path, small: LargeModel, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> onnx.ModelProto:
    """The published hybrid.onnx (read without its weights), checked as a user would use it: copied elsewhere
    with hybrid.onnx.data, its one data file, and run from another working directory with graph optimization
    off, it passes the run's tolerances against the fp32 model on every sample."""
    moved = Path(shutil.copytree(results / "fusion_bisect", tmp_path / "moved"))
    graph = onnx.load(str(moved / "hybrid.onnx"), load_external_data=False)
    locations = {entry.value for tensor in graph.graph.initializer for entry in tensor.external_data
                 if entry.key == "location"}
    assert locations == {"hybrid.onnx.data"} and len(graph.SerializeToString()) < 100_000
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    hybrid = ort.InferenceSession(str(moved / "hybrid.onnx"), options, providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(small.model), options, providers=["CPUExecutionProvider"])
    for path in sorted(small.samples.glob("sample*_inputs.npz")):
        feeds = dict(np.load(path))
        np.testing.assert_allclose(hybrid.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
    return graph


@pytest.mark.e2e
def test_the_hybrid_carries_its_own_data_file_and_passes_from_anywhere(runs: dict[str, Path], small: LargeModel,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    hybrid = checked_hybrid(runs["external"], small, tmp_path, monkeypatch)
    assert [node.op_type for node in hybrid.graph.node].count("FastGelu") < BLOCKS


@pytest.mark.e2e
def test_the_rule_level_fallback_carries_its_own_data_file_and_passes(runs: dict[str, Path], small: LargeModel,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With one probe the instance search stops before a hybrid passes: hybrid.onnx is the fusion-on graph
    compiled again with the culprit rule off, its weights copied from ORT's data file into its own."""
    snakemake(runs["folder"], "fusion_bisect", "--configfile", str(small.config), "--config", *BREAKING,
              "bisect={max_probes: 1}", "results=budget", "workspace=budget_workspace")  # no verdict on disk
    record = json.loads((runs["folder"] / "budget" / "fusion_bisect" / "instances.json").read_text())["hybrid"]
    assert record["fallback"] and record["rules_off"] == ["GeluApproximation"] and record["passed"]
    hybrid = checked_hybrid(runs["folder"] / "budget", small, tmp_path, monkeypatch)
    assert not any(node.op_type == "FastGelu" for node in hybrid.graph.node)


@pytest.mark.e2e
def test_the_bundle_names_the_model_by_its_graph_and_data_digests(runs: dict[str, Path], small: LargeModel) -> None:
    """The bundle holds no model: its manifest names it by the sha256 of the graph file and of the data file."""
    with tarfile.open(runs["external"] / "bundle" / "compare_bundle.tar.gz") as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
        assert not [name for name in archive.getnames() if name.endswith((".onnx", ".data"))]
    assert manifest["model_sha256"] == hashlib.sha256(small.model.read_bytes()).hexdigest()
    assert manifest["model_data_sha256"] == [hashlib.sha256(small.data.read_bytes()).hexdigest()]


def checked_repro(results: Path, small: LargeModel, answer: tuple[str, str], tmp_path: Path) -> dict:
    """The repro folder `results/reduce`, copied elsewhere: its model.onnx holds exactly the user's weights its
    nodes read, inline, no data file beside it; it fails as written and passes with the answer (`answer`: the
    flag and the bisection's file under `results`). Returns reduce.json."""
    folder = shutil.copytree(results / "reduce", tmp_path / "repro")
    model = onnx.load(str(folder / "model.onnx"))
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(small.model)).graph.initializer}
    read = {name for node in model.graph.node for name in node.input}
    assert {t.name for t in model.graph.initializer} == read & original.keys()  # its nodes' weights, no others
    assert all(t.data_location != onnx.TensorProto.EXTERNAL and np.array_equal(numpy_helper.to_array(t),
                                                                               original[t.name])
               for t in model.graph.initializer)
    assert not [path.name for path in folder.rglob("*.data")]
    flag, file = answer
    shutil.copy(results / file, tmp_path / Path(file).name)
    for arguments, code in (((), 1), ((flag, str(tmp_path / Path(file).name)), 0)):
        run = subprocess.run([sys.executable, "repro.py", *arguments], cwd=folder, capture_output=True, text=True,
                             check=False)
        assert run.returncode == code and "Traceback" not in run.stderr, run.stdout + run.stderr
    return json.loads((folder / "reduce.json").read_text())


@pytest.mark.e2e
def test_reduce_cuts_a_fusion_repro_that_carries_only_its_subgraphs_weights(runs: dict[str, Path],
                                                                           small: LargeModel, tmp_path: Path) -> None:
    """`snakemake reduce` (fusion) after the fixture's fusion_bisect: the GELU that FastGelu replaces."""
    snakemake(runs["folder"], "reduce", "--configfile", str(small.config), "--config", *BREAKING, "results=external")
    record = checked_repro(runs["external"], small, ("--fusion-switch", "fusion_bisect/fusion_switch.cfg"), tmp_path)
    assert record["repro_nodes"] < record["model_nodes"] and all("/gelu/" in name for name in record["nodes"])


@pytest.mark.e2e
def test_reduce_cuts_a_precision_repro_that_carries_only_its_subgraphs_weights(runs: dict[str, Path],
                                                                              small: LargeModel,
                                                                              tmp_path: Path) -> None:
    """`snakemake precision_bisect reduce` with `reduce.bisection: precision` (the model's own fp16 config):
    the repro is a piece of the planted block's FFN tail, fixed by keep_dtype.txt."""
    snakemake(runs["folder"], "precision_bisect", "reduce", "--configfile", str(small.config), "--config",
              "reduce={bisection: precision}", "results=precision", "workspace=precision_workspace")
    record = checked_repro(runs["folder"] / "precision", small, ("--keep-dtype", "precision_bisect/keep_dtype.txt"),
                           tmp_path)
    assert record["nodes"] and all(name.startswith(f"b{small.planted_block}/ffn2/") for name in record["nodes"])


# a child's peak RSS, MiB: the command in argv, run to its end by a fresh process whose only child it is
CHILD_PEAK = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")


@pytest.mark.e2e
def test_planning_a_model_saved_whole_reads_none_of_its_weights(tmp_path: Path) -> None:
    """`snakemake --dry-run compare` plans (keys, sizes, the samples checked against the model's inputs) a
    0.2 GB model saved whole within one model size of the peak RSS of the same model with its weights in a
    data file: the graph is read without its weights (`formats.graph_only`, which maps the file and touches
    each tensor's header); parsed whole, it cost twice the model (2.1 GB and 1.1 s on the 1.07 GB
    transformer, in Snakemake's process and in every job's)."""
    model = large_model(0.2, tmp_path / "models")
    folder = copy_workflow(tmp_path / "workflow")
    whole = whole_copy(model, folder)
    peaks = {}
    for name, config in (("external", model.config), ("whole", whole)):
        run = subprocess.run([sys.executable, "-c", CHILD_PEAK, sys.executable, "-m", "snakemake", "--dry-run",
                              "compare", "--configfile", str(config), "--cores", "2"],
                             cwd=folder, capture_output=True, text=True, check=True, timeout=300)
        peaks[name] = float(run.stdout)
    assert peaks["whole"] < peaks["external"] + model.data.stat().st_size / 2**20, peaks


def test_the_data_file_bytes_key_every_compile(small: LargeModel, tmp_path: Path) -> None:
    """Another seed's weights under the same graph: same graph bytes, new compile keys."""
    shutil.copytree(small.folder, tmp_path / "model")
    config = {**yaml.safe_load(small.config.read_text()), "model": str(tmp_path / "model" / "transformer.onnx"),
              "samples": str(tmp_path / "model" / "samples"), "workspace": str(tmp_path / "workspace"),
              "results": str(tmp_path / "results")}
    before = Plan.from_config(config).compile_keys
    data = tmp_path / "model" / DATA
    weights = bytearray(data.read_bytes())
    weights[-1] ^= 0xFF  # the last byte of the planted block's scale
    data.write_bytes(bytes(weights))
    after = Plan.from_config(config).compile_keys
    assert before.keys() == after.keys() and all(before[name] != after[name] for name in before)
    graph = hashlib.sha256((tmp_path / "model" / "transformer.onnx").read_bytes()).hexdigest()
    assert graph == hashlib.sha256(small.model.read_bytes()).hexdigest()


def test_a_model_and_its_data_file_appear_together_or_not_at_all(small: LargeModel, tmp_path: Path) -> None:
    """Written as the compile stage writes its copy: ORT saves the graph and its data under their final names
    in a temporary folder; both are renamed into place when the block succeeds, nothing is left when it fails."""
    target = tmp_path / "compile" / "model.onnx"
    with atomic_model(target) as saved:
        onnx.save(onnx.load(small.model), saved, save_as_external_data=True, location=f"{saved.name}.data")
        assert saved.name == target.name and not target.exists()
    assert sorted(path.name for path in target.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert onnx.load(str(target)).graph.initializer[2].name == "b0/w1"

    failed = tmp_path / "failed" / "model.onnx"
    with pytest.raises(OSError), atomic_model(failed) as saved:
        (saved.parent / f"{saved.name}.data").write_bytes(b"half written")
        raise OSError("disk full")
    assert list(failed.parent.iterdir()) == []


def file_states(folder: Path) -> dict[str, str]:
    """Every file the runs wrote (workspaces and results folders), by its sha256."""
    roots = ("workspace", "external", "whole", "budget", "budget_workspace")
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for root in roots for path in (folder / root).rglob("*") if path.is_file()}


@pytest.mark.e2e
def test_a_missing_data_file_is_one_line_at_parse_time(runs: dict[str, Path], small: LargeModel,
                                                       tmp_path: Path) -> None:
    """As a catalogue case: a finished project, the data file lost, the real command; exit 1, no traceback, one
    error line naming the data file, and no file under results/ or workspace/ changed."""
    folder = runs["folder"]
    model = shutil.copytree(small.folder, tmp_path / "lost")
    (model / DATA).unlink()
    config = yaml.safe_load(small.config.read_text())
    (folder / "lost.yaml").write_text(yaml.safe_dump({**config, "model": str(model / "transformer.onnx"),
                                                      "samples": str(model / "samples")}))
    before = file_states(folder)
    result = snakemake(folder, "compare", "--configfile", "lost.yaml", "--config", *BREAKING, "results=external",
                       check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output
    errors = sorted({line for line in output.splitlines() if line.startswith(("accubisect:", "ERROR accubisect:"))})
    assert errors == [f"accubisect: {model / 'transformer.onnx'}: the external data file {model / DATA} of tensor "
                      "'b0/ln_g' is missing; put the data file saved with the model beside it, or set `model` to a "
                      "model saved whole"], output
    assert file_states(folder) == before
