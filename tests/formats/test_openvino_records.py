"""The OpenVINO jobs' answer files (fusion_bisect's deploy.json and result.json, precision_bisect's
result.json) read back as they were written, with their format first."""

from __future__ import annotations

import json

import pytest

from accubisect.formats.openvino_fusion_result import OpenVinoDeploy, OpenVinoFusionResult
from accubisect.formats.openvino_precision_result import OpenVinoPrecisionResult

DEPLOY = OpenVinoDeploy({"SNIPPETS_MODE": "DISABLE"}, ("scores",))
VERDICT = {"passed": True, "worst": {"cosine": 1.0}, "seconds": 0.1}
RECORDS = {
    "deploy.json": DEPLOY,
    "fixed result.json": OpenVinoFusionResult("fixed", ("snippets",), {"Subgraph_1": "scores"},
                                              ({"name": "Subgraph_1", "type": "Subgraph", "layers": ["a"],
                                                "barrier": "scores"},), DEPLOY,
                                              {"switches": True, "barriers": True},
                                              ({"level": "rule", "off": [], **VERDICT},), 1.5),
    "nothing to fix result.json": OpenVinoFusionResult("nothing to fix", (), {}, None, None, None,
                                                       ({"level": "rule", "off": [], **VERDICT},), 0.5),
    "precision result.json": OpenVinoPrecisionResult(
        "fixed", "bf16", 2, ({"name": "conv", "added_error": 0.5, "original_nodes": ["conv"]},), (), ("conv",),
        ("conv",), ({"keep": ["conv"], **VERDICT},), 2.0, {**VERDICT, "dropped": []}),
}


@pytest.mark.parametrize("name", RECORDS)
def test_an_openvino_answer_file_reads_back_as_it_was_written(tmp_path, name):
    path = tmp_path / "answer.json"
    RECORDS[name].write(path)
    assert type(RECORDS[name]).read(path) == RECORDS[name]
    assert next(iter(json.loads(path.read_text()))) == "format"


def test_nothing_to_fix_writes_no_instance_search():
    data = RECORDS["nothing to fix result.json"].to_json()
    assert not {"instances", "deploy", "verified"} & set(data) and data["backend"] == "openvino-cpu"
