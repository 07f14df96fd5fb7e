"""The `accubisect` command on dumps the library writes: exit codes and what it prints."""

import subprocess
import sys

import numpy as np
import pytest

from accubisect.cli import main
from accubisect.compare import build_report, graph_from_dump
from accubisect.compile_stage import compile_variant
from accubisect.dump import DumpReader, dump_sample
from accubisect.files import write_json
from accubisect.graph import write_graph
from conftest import GELU_APPROXIMATION


@pytest.fixture
def dumps(ffn_model, tmp_path):
    x = np.random.default_rng(0).normal(0, 2, (1, 4, 8)).astype(np.float32)
    np.savez(tmp_path / "sample0_inputs.npz", x=x)
    paths = {}
    for variant, level, session_config in (("fusion_off", "off", {}), ("fusion_on", "all", GELU_APPROXIMATION)):
        base = tmp_path / variant
        spec = {"name": variant, "level": level, "session_config": session_config, "rules_off": []}
        compile_variant(ffn_model, spec, "ort-cpu", base / "model.onnx", base / "compile.json")
        write_graph(ffn_model, base / "model.onnx", base / "compile.json", base / "graph.json")
        dump_sample(ffn_model, base / "model.onnx", tmp_path / "sample0_inputs.npz", base / "dump.h5", variant,
                    "sample0", "ort-cpu")
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


def test_compare_without_graph_names_nodes_from_the_dump(dumps, capsys):
    main(["compare", str(dumps["fusion_off"] / "dump.h5"), str(dumps["fusion_on"] / "dump.h5"), "--ntol", "1",
          "--cos-sim", "0.9999999999"])
    assert "made by node 'FastGelu' (FastGelu), rule none" in capsys.readouterr().out


def test_judge_applies_new_thresholds_to_a_saved_report(dumps, tmp_path, capsys):
    off, on = str(dumps["fusion_off"] / "dump.h5"), str(dumps["fusion_on"] / "dump.h5")
    with DumpReader(on) as dump:
        graph = graph_from_dump(dump)
    accuracy = {"rtol": 0.0, "atol": 0.0, "ntol": 0.0, "cosine": None, "val_func": None}
    report = build_report([off], [on], graph, ["fusion_off", "fusion_on"], [""], ["sample0"], ["y"], accuracy, "fp16")
    write_json(tmp_path / "report.json", report)
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
    run = subprocess.run([sys.executable, "-m", "accubisect.cli", "show", str(tmp_path / "none.h5")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0
    assert "none.h5: dump file not found" in run.stderr
