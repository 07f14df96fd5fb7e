"""The first line of every summary: the run's context, from plain values."""

from accubisect.formats.config import validate_config
from accubisect.reports.run_context import context_line, run_context


def test_context_line_names_every_setting_in_force():
    line = context_line(model="m.onnx", samples="data", sample_count=3, level="extended",
                        session_config={"b.key": 2, "a.key": "1"}, fusion_switch="off.cfg", backend="ort-cuda")
    assert line == ("model m.onnx; 3 sample(s) from data; compile level extended; session config a.key=1, b.key=2; "
                    "switch file off.cfg; backend ort-cuda")
    assert "\n" not in line


def test_a_config_with_model_and_samples_only_runs_on_the_schema_defaults():
    context = run_context(validate_config({"model": "m.onnx", "samples": "data"}), 4)
    assert context_line(**context) == ("model m.onnx; 4 sample(s) from data; compile level all; session config none; "
                                       "switch file none; backend ort-cpu")
