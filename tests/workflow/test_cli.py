"""The `accubisect` command on dumps the library writes: exit codes and what it prints."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import GELU_APPROXIMATION
from onnx import numpy_helper

from accubisect.formats.dump_file import DumpReader
from accubisect.formats.graph_record import GraphRecord
from accubisect.stages.compare import Compared, build_report, graph_from_dump
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.dump import DumpStep, dump_sample
from accubisect.stages.graph import GraphStep, write_graph
from accubisect.workflow.cli import main


@pytest.fixture
def dumps(ffn_model, tmp_path):
    x = np.random.default_rng(0).normal(0, 2, (1, 4, 8)).astype(np.float32)
    np.savez(tmp_path / "sample0_inputs.npz", x=x)
    paths = {}
    for variant, level, session_config in (("fusion_off", "off", {}), ("fusion_on", "all", GELU_APPROXIMATION)):
        base = tmp_path / variant
        spec = {"name": variant, "level": level, "session_config": session_config, "rules_off": []}
        compile_variant(CompileStep(ffn_model, spec, "ort-cpu", base / "model.onnx", base / "compile.json"))
        write_graph(GraphStep(ffn_model, base / "model.onnx", base / "compile.json", base / "graph.json"))
        dump_sample(DumpStep(ffn_model, base / "model.onnx", tmp_path / "sample0_inputs.npz", base / "dump.h5",
                             variant, "sample0", "ort-cpu"))
        paths[variant] = base
    return paths


def test_compare_exit_code_follows_the_verdict(dumps, capsys):
    off, on = str(dumps["fusion_off"] / "dump.h5"), str(dumps["fusion_on"] / "dump.h5")
    graph = str(dumps["fusion_on"] / "graph.json")
    assert main(["compare", off, on, "--graph", graph, "--rtol", "0", "--atol", "0"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "rule GeluApproximation" in out
    assert main(["compare", off, on, "--rtol", "0.1", "--atol", "0.1"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["compare", off, off]) == 0


def _dumped(model, tmp_path, name, sample="sample0", seed=0):
    """`model` compiled fusion-on, its graph.json and a dump of one sample (inputs drawn with `seed`)."""
    base = tmp_path / name
    base.mkdir()
    np.savez(base / "inputs.npz", x=np.random.default_rng(seed).normal(0, 2, (1, 4, 8)).astype(np.float32))
    spec = {"name": "fusion_on", "level": "all", "session_config": GELU_APPROXIMATION, "rules_off": []}
    compile_variant(CompileStep(model, spec, "ort-cpu", base / "model.onnx", base / "compile.json"))
    write_graph(GraphStep(model, base / "model.onnx", base / "compile.json", base / "graph.json"))
    dump_sample(DumpStep(model, base / "model.onnx", base / "inputs.npz", base / "dump.h5", "fusion_on", sample,
                         "ort-cpu"))
    return base


@pytest.fixture
def other_model(ffn_model, tmp_path):
    """The same graph as ffn_model with one weight changed: another model, whose nodes have the same names."""
    model = onnx.load(ffn_model)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((8, 8), np.float32), "w"))
    onnx.save(model, tmp_path / "other.onnx")
    return tmp_path / "other.onnx"


def test_compare_refuses_dumps_of_another_model_or_sample_in_one_line(dumps, other_model, ffn_model, tmp_path, capsys):
    off = str(dumps["fusion_off"] / "dump.h5")
    other = _dumped(other_model, tmp_path, "other") / "dump.h5"
    assert f"{off} and {other} are dumps of different models" in one_line(["compare", off, str(other)], capsys)
    later = _dumped(ffn_model, tmp_path, "sample1", "sample1", seed=1) / "dump.h5"
    assert (f"{off} and {later} are dumps of different samples (sample0 and sample1)"
            in one_line(["compare", off, str(later)], capsys))


def test_compare_refuses_the_graph_of_another_model_in_one_line(dumps, other_model, tmp_path, capsys):
    off, on = str(dumps["fusion_off"] / "dump.h5"), str(dumps["fusion_on"] / "dump.h5")
    graph = _dumped(other_model, tmp_path, "other") / "graph.json"
    said = one_line(["compare", off, on, "--graph", str(graph)], capsys)
    assert f"{graph}: a graph of another model" in said and on in said


def test_explorer_data_refuses_another_model_in_one_line(dumps, other_model, tmp_path, capsys):
    off, on = dumps["fusion_off"] / "dump.h5", dumps["fusion_on"] / "dump.h5"
    accuracy = {"rtol": 0.0, "atol": 0.0, "ntol": 0.0, "cosine": None, "val_func": None}
    comparison = Compared((off,), (on,), ("",), ("sample0",), ("y",), accuracy, "fp16", ("fusion_off", "fusion_on"))
    build_report(comparison, GraphRecord.read(dumps["fusion_on"] / "graph.json"), None).write(tmp_path / "report.json")
    said = one_line(["explorer-data", str(tmp_path / "report.json"), "--model", str(other_model), "-o",
                     str(tmp_path / "node_data.json")], capsys)
    assert f"{other_model}: not the model {tmp_path / 'report.json'} compares" in said
    assert not (tmp_path / "node_data.json").exists()


def test_compare_without_graph_names_nodes_from_the_dump(dumps, capsys):
    main(["compare", str(dumps["fusion_off"] / "dump.h5"), str(dumps["fusion_on"] / "dump.h5"), "--ntol", "1",
          "--cos-sim", "0.9999999999"])
    assert "made by node 'FastGelu' (FastGelu), rule none" in capsys.readouterr().out


def test_judge_applies_new_thresholds_to_a_saved_report(dumps, tmp_path, capsys):
    off, on = dumps["fusion_off"] / "dump.h5", dumps["fusion_on"] / "dump.h5"
    with DumpReader(on) as dump:
        graph = graph_from_dump(dump)
    accuracy = {"rtol": 0.0, "atol": 0.0, "ntol": 0.0, "cosine": None, "val_func": None}
    comparison = Compared((off,), (on,), ("",), ("sample0",), ("y",), accuracy, "fp16", ("fusion_off", "fusion_on"))
    build_report(comparison, graph, None).write(tmp_path / "report.json")
    assert main(["judge", str(tmp_path / "report.json")]) == 1
    assert "FAIL" in capsys.readouterr().out.splitlines()[0]
    assert main(["judge", str(tmp_path / "report.json"), "--ntol", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("PASS")


def test_show_lists_tensors_with_statistics(dumps, capsys):
    assert main(["show", str(dumps["fusion_on"] / "dump.h5")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "variant=fusion_on" in lines[0]
    assert any(line.split()[1:3] == ["y", "Relu"] for line in lines[2:])


def test_rules_names_what_fires(ffn_model, capsys):
    assert main(["rules", str(ffn_model), "--session-config", "optimization.enable_gelu_approximation=1"]) == 0
    fired = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert fired == ["MatMulAddFusion", "GeluFusion", "GeluApproximation"]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "accubisect.workflow.cli", "show", str(tmp_path / "none.h5")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0
    assert "none.h5: dump file not found" in run.stderr


def one_line(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("accubisect: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("content", "message"), [
    (None, "model.onnx: model file not found"),
    (b"\x08\xff\xff\xff\xff garbage", "model.onnx: not a readable ONNX model"),
    (b"", "model.onnx: "),
])
def test_rules_on_a_missing_or_broken_model_is_one_line(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "model.onnx").write_bytes(content)
    assert message in one_line(["rules", str(tmp_path / "model.onnx")], capsys)


def test_a_session_config_entry_without_a_value_is_one_line(ffn_model, capsys):
    err = one_line(["rules", str(ffn_model), "--session-config", "optimization.enable_gelu_approximation"], capsys)
    assert "--session-config 'optimization.enable_gelu_approximation': give KEY=VALUE" in err


SCHEMA_FIELDS = ('"model_sha256": "", "reference": "a", "candidate": "b", "low_precision": "fp16", "samples": [], '
                 '"verdicts": [], "tensors": [], "accuracy": {"rtol": 0, "atol": 0, "ntol": 0, "cosine": null}, '
                 '"statistics_only": false')  # all a report needs to pass the schema check


@pytest.mark.parametrize(("text", "message"), [
    ("{}", "not a compare report (top level: 'format' is a required property)"),
    ("[]", "not a compare report (top level: [] is not of type 'object')"),
    ('{"format": 2, "model_sha256": "", "reference": "a", "candidate": "b", "low_precision": "fp16", "samples": [], '
     '"verdicts": [], "tensors": []}', "not a compare report (top level: 'accuracy' is a required property)"),
    (f'{{"format": 1, {SCHEMA_FIELDS}}}', "not a compare report (format: 2 was expected)"),
    (f'{{"format": 2, {SCHEMA_FIELDS}}}',
     "not a compare report of this accubisect version (no field 'first_divergence')"),
    ("{broken", "cannot read the compare report"),
])
def test_judge_on_a_file_that_is_no_report_is_one_line(tmp_path, capsys, text, message):
    (tmp_path / "report.json").write_text(text)
    assert f"report.json: {message}" in one_line(["judge", str(tmp_path / "report.json")], capsys)


@pytest.mark.parametrize(("text", "message"), [
    ("{}", "not a graph JSON (top level: 'format' is a required property)"),
    ('{"format": 2, "model_sha256": "", "variant": "v", "fired_rules": [], "eliminated_nodes": [], "nested": [], '
     '"nodes": [{"index": 0}]}',
     "not a graph JSON (nodes.0: 'name' is a required property)"),
    ("{broken", "cannot read the graph JSON"),
])
def test_compare_with_a_graph_that_is_no_graph_is_one_line(dumps, tmp_path, capsys, text, message):
    (tmp_path / "graph.json").write_text(text)
    off, on = str(dumps["fusion_off"] / "dump.h5"), str(dumps["fusion_on"] / "dump.h5")
    assert f"graph.json: {message}" in one_line(["compare", off, on, "--graph", str(tmp_path / "graph.json")], capsys)


@pytest.mark.parametrize("command", ["show", "compare"])
def test_show_and_compare_on_a_missing_or_non_hdf5_file_is_one_line(dumps, tmp_path, capsys, command):
    (tmp_path / "text.h5").write_text("not hdf5")
    other = [str(dumps["fusion_on"] / "dump.h5")] if command == "compare" else []
    assert "none.h5: dump file not found" in one_line([command, str(tmp_path / "none.h5"), *other], capsys)
    assert "text.h5: not a readable dump" in one_line([command, str(tmp_path / "text.h5"), *other], capsys)


@pytest.mark.parametrize("argv", [["--rtol", "nan"], ["--atol", "-1"], ["--ntol", "2"], ["--cos-sim", "inf"],
                                  ["--rtol", "tight"]])
def test_a_tolerance_that_is_no_number_in_range_is_one_line(dumps, capsys, argv):
    off, on = str(dumps["fusion_off"] / "dump.h5"), str(dumps["fusion_on"] / "dump.h5")
    assert f"argument {argv[0]}: '{argv[1]}' is not a number" in one_line(["compare", off, on, *argv], capsys)


def test_show_into_a_closed_pipe_prints_no_traceback(dumps):
    """`accubisect show DUMP | head -1`: the reader leaves after one line."""
    run = subprocess.run(f"{sys.executable} -m accubisect.workflow.cli show {dumps['fusion_on'] / 'dump.h5'} | head -1",
                         shell=True, capture_output=True, text=True)
    assert run.stdout.startswith("backend=") and run.stdout.count("\n") == 1
    assert run.stderr == ""


def test_an_unknown_command_or_option_is_one_line(capsys):
    assert "invalid choice: 'bogus'" in one_line(["bogus"], capsys)
    assert "unrecognized arguments: --dry-run" in one_line(["reproduce", "b.tar.gz", "--dry-run"], capsys)
