"""Declared output shapes are hints (issue 21, item 8): a real model whose declaration is wrong, given golden
outputs it made itself, runs a real target. ddddocr's recognizer (tests/corpus.py, DECLARED_SHAPE_WRONG)
declares '387' as [1, seqlen] and produces [22, 1, 8210]; the run warns once at parse time and judges the
golden outputs against what the model really produces."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from conftest import copy_workflow, snakemake
from corpus import DECLARED_SHAPE_WRONG

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.fixture(scope="module")
def ocr_run(tmp_path_factory):
    model = DECLARED_SHAPE_WRONG
    folder = copy_workflow(tmp_path_factory.mktemp(model.name))
    samples = model.write_samples(folder / "samples")
    session = ort.InferenceSession(str(model.model_path()), providers=["CPUExecutionProvider"])
    with np.load(samples / "sample0_inputs.npz") as inputs:
        produced = session.run(None, dict(inputs))
    np.savez(samples / "sample0_outputs.npz", **dict(zip([o.name for o in session.get_outputs()], produced,
                                                         strict=True)))
    (folder / "ocr.yaml").write_text(yaml.safe_dump({"model": str(model.model_path()), "samples": "samples"}))
    return folder, produced, snakemake(folder, "compare", "--configfile", "ocr.yaml")


def test_the_model_really_produces_another_shape_than_it_declares(ocr_run):
    _, produced, _ = ocr_run
    declared = ort.InferenceSession(str(DECLARED_SHAPE_WRONG.model_path()), providers=["CPUExecutionProvider"])
    assert declared.get_outputs()[0].shape == [1, "seqlen"] and produced[0].shape == (22, 1, 8210)


def test_golden_outputs_made_by_the_model_are_judged_after_one_warning_line(ocr_run):
    folder, _, run = ocr_run
    ours = [line for line in (run.stdout + run.stderr).splitlines() if "accubisect: " in line]
    assert ours == ["WARNING accubisect: samples/sample0_outputs.npz: output '387' has rank 3, the model expects "
                    "rank 2 (shape [22, 1, 8210], the model's [1, ?]); declared output shapes are only hints: the "
                    "golden outputs are checked against the outputs the model really produces when they are compared"]
    report = json.loads((folder / "results/compare/report.json").read_text())
    verdict = report["verdicts"][0]
    assert verdict["against"] == "golden" and verdict["reference"]["passed"], verdict
    assert "Traceback" not in run.stdout + run.stderr
