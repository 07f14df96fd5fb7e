"""A real third-party model: silero-vad's 16 kHz voice-activity detector, shipped in its PyPI wheel.

The wheel is downloaded once into .cache/wheels (ignored by git) and the model unzipped from it.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, copy_workflow, snakemake

pytestmark = [pytest.mark.integration, pytest.mark.e2e]  # runs the real snakemake command
WHEELS = REPO / ".cache" / "wheels"
MEMBER = "silero_vad/data/silero_vad_16k_op15.onnx"


@pytest.fixture(scope="module")
def silero_model(tmp_path_factory) -> Path:
    wheels = sorted(WHEELS.glob("silero_vad-*.whl"))
    if not wheels:
        download = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                   "-d", str(WHEELS), "silero-vad>=5,<7"], capture_output=True, text=True)
        wheels = sorted(WHEELS.glob("silero_vad-*.whl"))
        if not wheels:
            pytest.skip(f"cannot download the silero-vad wheel from PyPI: {download.stderr.strip()[-300:]}")
    target = tmp_path_factory.mktemp("silero")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extract(MEMBER, target)
    return target / MEMBER


def test_silero_vad_compiles_dumps_maps_and_compares(silero_model, tmp_path):
    folder = copy_workflow(tmp_path)
    samples = folder / "audio"
    samples.mkdir()
    rng = np.random.default_rng(0)
    for index in range(2):
        np.savez(samples / f"sample{index}_inputs.npz", input=rng.normal(0, 0.1, (1, 512)).astype(np.float32),
                 state=np.zeros((2, 1, 128), np.float32), sr=np.array(16000, np.int64))
    snakemake(folder, "compare", "--config", f"model={silero_model}", "samples=audio")
    report = json.loads((folder / "results" / "compare" / "report.json").read_text())
    assert report["samples"] == ["sample0", "sample1"]
    assert {"output", "stateN"} <= {row["tensor"] for row in report["tensors"]}
    assert all(v["against"] == "reference" for v in report["verdicts"])
    graphs = [json.loads(p.read_text()) for p in (folder / "workspace" / "graph").glob("*/graph.json")]
    (fused,) = [g for g in graphs if g["variant"] == "fusion_on"]
    assert fused["fired_rules"], "ORT optimizes silero-vad at level all"
    assert all(node["original_nodes"] or node["op_type"] in ("Reshape", "Transpose") for node in fused["nodes"])


def test_silero_vad_runs_the_whole_precision_path(silero_model, tmp_path):
    folder = copy_workflow(tmp_path)
    (folder / "audio").mkdir()
    np.savez(folder / "audio" / "sample0_inputs.npz",
             input=np.random.default_rng(0).normal(0, 0.1, (1, 512)).astype(np.float32),
             state=np.zeros((2, 1, 128), np.float32), sr=np.array(16000, np.int64))
    snakemake(folder, "precision_bisect", "--config", f"model={silero_model}", "samples=audio",
              "precision={mode: allow_mix_precision}", "accuracy={rtol: 0.01, atol: 0.001}")
    assignment = json.loads((folder / "results" / "precision" / "assignment.json").read_text())
    assert assignment["reduced"] and assignment["control_flow_fp32"]  # its If nodes stay fp32
    result = json.loads((folder / "results" / "precision_bisect" / "result.json").read_text())
    assert result["final_verdict"]["passed"]
    assert json.loads((folder / "results" / "precision_bisect" / "finalize.json").read_text())["passed"]
