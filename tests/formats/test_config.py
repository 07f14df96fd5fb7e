import pytest

from accubisect.core.errors import ConfigError
from accubisect.formats.config import validate_config

MINIMAL = {"model": "m.onnx", "samples": "s"}


def test_defaults_come_from_the_schema():
    config = validate_config(MINIMAL)
    assert config["workspace"] == "workspace" and config["results"] == "results"
    assert config["compile"] == {"level": "all", "session_config": {}, "fusion_switch": None}
    assert config["accuracy"]["rtol"] == 1e-3 and config["accuracy"]["val_func"] is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"compile": {"level": "high"}}, "compile.level: 'high' is not one of ['basic', 'extended', 'all']"),
        ({"acuracy": {}}, "config: Additional properties are not allowed ('acuracy' was unexpected)"),
        ({"accuracy": {"ntol": 2}}, "accuracy.ntol: 2 is greater than the maximum of 1"),
        ({"accuracy": {"val_func": "no_colon"}}, "accuracy.val_func: 'no_colon' does not match"),
        ({"backend": "tensorrt"}, "backend: 'tensorrt' is not one of ['ort-cpu', 'ort-cuda', 'openvino-cpu']"),
    ],
)
def test_each_error_is_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as caught:
        validate_config({**MINIMAL, **override})
    text = str(caught.value)
    assert text.startswith(message)
    assert "\n" not in text and "$schema" not in text


def test_every_error_is_reported():
    with pytest.raises(ConfigError) as caught:
        validate_config({"accuracy": {"rtol": -1}})
    lines = str(caught.value).splitlines()
    assert "config: 'model' is a required property" in lines
    assert "accuracy.rtol: -1 is less than the minimum of 0" in lines


def test_numbers_given_as_text_on_the_command_line_are_read():
    config = validate_config({**MINIMAL, "accuracy": {"rtol": "0.01", "cosine": "null"},
                              "bisect": {"parallel": "3", "rules": "[GeluApproximation, MatMulAddFusion]"}})
    assert config["accuracy"]["rtol"] == 0.01 and config["accuracy"]["cosine"] is None
    assert config["bisect"] == {"parallel": 3, "rules": ["GeluApproximation", "MatMulAddFusion"], "max_probes": None,
                                "max_minutes": None}


def test_booleans_and_nulls_given_as_text_on_the_command_line_are_read():
    """`--config dump='{statistics_only: true}' compile='{fusion_switch: null}'` as docs/configuration.md shows."""
    config = validate_config({**MINIMAL, "dump": {"statistics_only": "true"}, "compile": {"fusion_switch": "null"}})
    assert config["dump"]["statistics_only"] is True and config["compile"]["fusion_switch"] is None
