"""finalize.json is a versioned record: written and read back whole, refused in one line when of another
format, and carried inside deployed.json with its own format checked."""

from __future__ import annotations

import json

import pytest

from accubisect.core.errors import WorkspaceError
from accubisect.formats.bisect_result import ResultVerdict
from accubisect.formats.deployed import DeployedRecord
from accubisect.formats.finalize_record import FINALIZE_FORMAT, FinalizeRecord

RUN = FinalizeRecord("model.onnx", "fp16", "compiled", 3, 7, "loaded and run by ONNX Runtime", True, {"cosine": 0.99})
CHECKED = FinalizeRecord("model.onnx", "bf16", "original", 3, 7, "onnx.checker only", None, None)


@pytest.mark.parametrize("record", [RUN, CHECKED])
def test_finalize_json_reads_back_what_was_written(tmp_path, record):
    record.write(tmp_path / "finalize.json")
    assert FinalizeRecord.read(tmp_path / "finalize.json") == record


def test_a_model_only_checked_has_no_verdict_fields(tmp_path):
    CHECKED.write(tmp_path / "finalize.json")
    data = json.loads((tmp_path / "finalize.json").read_text())
    assert data["format"] == FINALIZE_FORMAT and "passed" not in data and "worst" not in data


def test_finalize_json_of_another_format_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "workspace" / "precision_bisect" / "abc"
    folder.mkdir(parents=True)
    (folder / "finalize.json").write_text(json.dumps({**RUN.to_json(), "format": FINALIZE_FORMAT + 1}))
    with pytest.raises(WorkspaceError) as error:
        FinalizeRecord.read(folder / "finalize.json")
    message = str(error.value)
    assert "\n" not in message and "finalize.json" in message and f"format {FINALIZE_FORMAT + 1}" in message


def test_deployed_json_refuses_a_model_entry_of_another_format(tmp_path):
    verdict = ResultVerdict(True, {}, (), (True,))
    deployed = DeployedRecord(("a",), (), verdict, "verified", (), verdict, (), True, None, (), RUN)
    deployed.write(tmp_path / "deployed.json")
    assert DeployedRecord.read(tmp_path / "deployed.json") == deployed
    data = deployed.to_json()
    data["model"].pop("format")
    (tmp_path / "deployed.json").write_text(json.dumps(data))
    with pytest.raises(WorkspaceError, match="deployed.json: not a record of the mixed-precision model"):
        DeployedRecord.read(tmp_path / "deployed.json")
