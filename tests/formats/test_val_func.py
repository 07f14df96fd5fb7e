"""A user's val_func, written to a real module beside the workflow: whatever goes wrong in it is one line."""

from dataclasses import replace

import numpy as np
import pytest

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import ConfigError
from accubisect.formats.val_func import load_val_func, val_func_source

TOL = AccuracyCheck(rtol=1e-3, atol=1e-4, ntol=0.0)
REF, GOT = {"y": np.array([1.0, 2.0])}, {"y": np.array([1.0, 3.0])}


@pytest.fixture
def beside_the_workflow(tmp_path, monkeypatch, request):
    """Writes a module, named after the test (imports are cached by name), into the working directory, where
    val_func modules are looked up first."""
    monkeypatch.chdir(tmp_path)
    module = "val_" + "".join(c if c.isalnum() else "_" for c in request.node.name)

    def write(source: str) -> str:
        (tmp_path / f"{module}.py").write_text(source)
        return module

    return write


def judge(spec: str) -> dict:
    """REF and GOT judged by the check whose val_func is `spec`, loaded as a job loads it."""
    check = replace(TOL, val_func=spec)
    return check.judge_outputs(REF, GOT, load_val_func(check))


def one_line_error(spec: str) -> str:
    with pytest.raises(ConfigError) as error:
        judge(spec)
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize(
    ("returned", "shown"),
    [("'False'", "'False' (str)"), ("None", "None (NoneType)"), ("np.array([True])", "array([ True]) (ndarray)"),
     ("1", "1 (int)"), ("np.zeros((40, 40)) == 0", "array([[ True, True,")],
)
def test_a_result_that_is_not_a_bool_is_refused(beside_the_workflow, returned, shown):
    module = beside_the_workflow(f"import numpy as np\n\ndef judge(reference, candidate):\n    return {returned}\n")
    message = one_line_error(f"{module}:judge")
    assert message.startswith(f"accuracy.val_func {module}:judge returned {shown}")
    assert message.endswith("it must return True or False")


@pytest.mark.parametrize("returned", ["False", "np.bool_(False)", "reference['y'][1] == candidate['y'][1]"])
def test_python_and_numpy_bools_are_the_verdict(beside_the_workflow, returned):
    module = beside_the_workflow(f"import numpy as np\n\ndef judge(reference, candidate):\n    return {returned}\n")
    verdict = judge(f"{module}:judge")
    assert verdict["passed"] is False and verdict["reasons"] == ["val_func returned False"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [("def judge(reference, candidate):\n    raise ValueError('no output named logits')\n",
      "raised ValueError: no output named logits; it is called as function(reference, candidate)"),
     ("def judge(outputs):\n    return True\n",
      "raised TypeError: judge() takes 1 positional argument but 2 were given;"),
     ("def judge(reference, candidate):\n    return reference['logits'] is not None\n",
      "raised KeyError: 'logits';")],
)
def test_a_val_func_that_fails_is_one_line_naming_it(beside_the_workflow, source, expected):
    module = beside_the_workflow(source)
    assert one_line_error(f"{module}:judge").startswith(f"accuracy.val_func {module}:judge {expected}")


def test_a_syntax_error_fails_when_the_workflow_is_parsed(beside_the_workflow):
    module = beside_the_workflow("def judge(reference, candidate)\n    return True\n")
    for load in (val_func_source, judge):
        with pytest.raises(ConfigError) as error:
            load(f"{module}:judge")
        assert str(error.value).startswith(
            f"accuracy.val_func {module}:judge: cannot import module '{module}' (SyntaxError: ")
        assert "\n" not in str(error.value)


def test_a_module_that_raises_as_it_is_imported_is_one_line(beside_the_workflow):
    module = beside_the_workflow("import numpy\nTHRESHOLD = 1 / 0\n")
    with pytest.raises(ConfigError, match=rf"^accuracy.val_func {module}:judge: cannot import module '{module}' "
                                          r"\(ZeroDivisionError: division by zero\)$"):
        judge(f"{module}:judge")
