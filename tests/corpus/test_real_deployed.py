"""Issue 21, items 1 and 2, on the corpus's PP-OCRv4 models: the precision answer is judged, and 1-minimal, in
the deployable model — the user's own graph in mixed precision — not only in the compiled graph it was
searched on. Single `snakemake precision_bisect` runs, few samples."""

import json

import numpy as np
import pytest
import yaml
from conftest import copy_workflow, snakemake
from corpus import CORPUS, FP16_REACHABLE, scaled, synthetic_page

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def run(folder, model, feeds, samples, **settings):
    """precision_bisect of `model` on `samples` inputs made by `feeds`; result.json and the console."""
    (folder / "samples").mkdir()
    for index in range(samples):
        np.savez(folder / "samples" / f"sample{index}_inputs.npz", **feeds(index, model.unpacked()))
    config = {"model": str(model.model_path()), "samples": "samples", **settings}
    (folder / "mine.yaml").write_text(yaml.safe_dump(config))
    console = snakemake(folder, "precision_bisect", "--configfile", "mine.yaml")
    base = folder / "results/precision_bisect"
    return json.loads((base / "result.json").read_text()), console.stdout + console.stderr


def test_detector_fixed_where_deployed_never_said_to_pass(tmp_path):
    """On three synthetic pages the compiled graph passes in fp16 (ConvBNFusion folded the BatchNorm whose
    variance, 9.8e7, is inf in fp16), the detector converted as published does not (cosine 0): the run keeps
    that BatchNorm in fp32, and model.onnx, finalize.json, result.json and the summary agree."""
    folder = copy_workflow(tmp_path)
    result, console = run(folder, CORPUS["ppocr_det"], synthetic_page, 3,
                          accuracy={"rtol": 1e-2, "atol": 1e-3, "ntol": 0.01})
    assert result["assigned"]["culprits"] == [] and result["deployed"]["how"] == "searched again"
    carried = result["deployed"]["carried_verdict"]
    assert not carried["passed"] and carried["worst"]["cosine"] < 0.5
    assert result["culprits"] == ["p2o.BatchNormalization.1"] and result["final_verdict"]["passed"]
    assert len(result["deployed"]["probes"]) <= 3
    assert json.loads((folder / "results/precision_bisect/finalize.json").read_text())["passed"]
    summary = (folder / "results/precision_bisect/summary.txt").read_text()
    assert "nothing to fix" not in console and "passes the accuracy check" not in summary
    assert "FAILS the check (cosine 0" in summary and summary.rstrip().endswith("passes the check")


def test_recognizer_answer_is_1_minimal_in_the_deployable_model(tmp_path):
    """At ×100 input scale the recognizer needs dozens of nodes in fp32. The search's answer on the compiled
    graph, where LayerNormFusion makes each LayerNorm one node, leaves the user's decomposed LayerNorms in fp16:
    model.onnx would store their sums of squares (Pow, up to 1.5e9) in fp16, inf on a device that stores them,
    which ORT's CPU kernels hide. So it fails by range in the user's graph, and is searched again there. The
    published keep set is 1-minimal in the user's graph: each kept node was probed back in fp16 and fails."""
    folder = copy_workflow(tmp_path)
    model = CORPUS["ppocr_rec"]
    result, _ = run(folder, model, scaled(model.feeds, 100), 2, accuracy=FP16_REACHABLE, bisect={"parallel": 1})
    kept = set(result["keep_dtype"])
    assert result["minimal"] and result["final_verdict"]["passed"] and kept
    assert sorted(kept) == sorted((folder / "results/precision_bisect/keep_dtype.txt").read_text().split())
    probes = result["deployed"]["probes"]
    for node in kept:
        assert any(set(p["off"]) == kept - {node} and not p["passed"] for p in probes), node
    deployed = result["deployed"]
    assert deployed["how"] == "searched again" and not deployed["carried_verdict"]["passed"]
    assert "beyond fp16's max 65504" in deployed["carried_verdict"]["reasons"][0]
