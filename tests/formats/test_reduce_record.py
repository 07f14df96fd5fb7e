"""reduce.json as a record: written and read back whole, and refused in one line when another version
wrote it."""

import json

import pytest

from accubisect.bisection.reduce import render_summary
from accubisect.core.errors import WorkspaceError
from accubisect.formats.reduce_record import ReduceProbe, ReduceRecord, ReproRun

RECORD = ReduceRecord(
    "fusion", "examples/model.onnx", 40, ("gelu/pow", "gelu/mul", "gelu/tanh"), ("gelu/out",), ("gelu/in",),
    ("gelu/half",), (), ("gelu/in", "gelu/out"), "gelu/out",
    (ReduceProbe("outputs", "a" * 16, 40, ("y",), False, {"y": {"rel_euclidean": 0.2}}, 0.5, False),
     ReduceProbe("inputs", "b" * 16, 3, ("gelu/out",), True, {}, 0.1, True)),
    ReproRun("python repro.py", 1, "FAILS: the bug is there"),
    ReproRun("python repro.py --fusion-switch /w/fusion_switch.cfg", 0, "passes"), 12.345)


def test_a_reduce_record_reads_back_whole_with_the_keys_it_always_had(tmp_path):
    path = tmp_path / "reduce.json"
    RECORD.write(path)
    data = json.loads(path.read_text())
    assert list(data) == ["format", "bisection", "model", "model_nodes", "repro_nodes", "nodes", "outputs", "inputs",
                          "constants", "computed", "from_dump", "first_divergence", "steps", "verification",
                          "seconds"]
    assert data["repro_nodes"] == 3 and data["steps"][1]["key"] == "b" * 16
    assert data["verification"]["as_written"] == {"command": "python repro.py", "exit": 1,
                                                  "last_line": "FAILS: the bug is there"}
    assert ReduceRecord.read(path) == RECORD
    assert render_summary(ReduceRecord.read(path)) == (
        "repro: 3 of 40 nodes of the original model fail the check on their own (fusion candidate), 1 output(s), "
        "1 input(s) from the reference; 2 search steps (1 probed, 1 from disk), 12 s\n"
        "`python repro.py` exits 1; with --fusion-switch (the answer) it exits 0\n")


@pytest.mark.parametrize(("edit", "found"), [
    (lambda data: {**data, "format": 2}, "format 2"),
    (lambda data: {key: value for key, value in data.items() if key != "format"}, "no format"),
    (lambda data: {key: value for key, value in data.items() if key != "steps"}, "no field 'steps'"),
])
def test_a_reduce_record_of_another_version_is_refused_in_one_line(tmp_path, edit, found):
    path = tmp_path / "reduce" / "0123456789abcdef" / "reduce.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(edit(RECORD.to_json())))
    with pytest.raises(WorkspaceError, match=f"not a reduce record of this accubisect version \\({found}") as error:
        ReduceRecord.read(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)
