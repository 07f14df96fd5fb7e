"""Finding a user's val_func, the error paths tests/formats/test_val_func.py leaves out: a module that is not there, a
name that is no function, a parent package that fails as it is imported, a NUL byte in the source. Each is
one line naming the val_func, both when the workflow is parsed (`val_func_source`, which also gives the file
whose edits re-run a comparison) and when a job loads it (`load_val_func`)."""

import sys

import pytest

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import ConfigError
from accubisect.formats.val_func import load_val_func as load_checks_val_func
from accubisect.formats.val_func import val_func_source


@pytest.fixture
def workflow_dir(tmp_path, monkeypatch, request):
    """The working directory, where val_func modules are looked up first, with a module name unique to the
    test (imports are cached by name); sys.path is restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path, "lookup_" + "".join(c if c.isalnum() else "_" for c in request.node.name)


def load_val_func(spec: str | None):
    """The val_func of a check that names `spec`, loaded as a job loads it."""
    return load_checks_val_func(AccuracyCheck(1e-3, 1e-4, 0.0, val_func=spec))


def one_line(load, spec: str) -> str:
    with pytest.raises(ConfigError) as error:
        load(spec)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_the_source_is_the_module_file_beside_the_workflow(workflow_dir):
    folder, module = workflow_dir
    (folder / f"{module}.py").write_text("def judge(reference, candidate):\n    return True\n")
    assert val_func_source(f"{module}:judge") == folder / f"{module}.py"
    assert load_val_func(f"{module}:judge")({}, {}) is True
    assert val_func_source(None) is None and load_val_func(None) is None


def test_a_missing_module_is_one_line(workflow_dir):
    _, module = workflow_dir
    assert one_line(val_func_source, f"{module}:judge") == (
        f"accuracy.val_func: module '{module}' not found beside the workflow or on sys.path")
    assert one_line(load_val_func, f"{module}:judge") == (
        f"accuracy.val_func {module}:judge: cannot import module '{module}' "
        f"(ModuleNotFoundError: No module named '{module}')")


@pytest.mark.parametrize("source", ["def other(reference, candidate):\n    return True\n", "judge = 0.5\n"])
def test_a_name_that_is_no_function_of_the_module_is_one_line(workflow_dir, source):
    folder, module = workflow_dir
    (folder / f"{module}.py").write_text(source)
    assert one_line(load_val_func, f"{module}:judge") == (
        f"accuracy.val_func: module '{module}' has no function 'judge'")


def test_a_parent_package_that_fails_as_it_is_imported_is_one_line(workflow_dir):
    folder, package = workflow_dir
    (folder / package).mkdir()
    (folder / package / "__init__.py").write_text("raise RuntimeError('configure me first\\nsecond line')\n")
    (folder / package / "judges.py").write_text("def judge(reference, candidate):\n    return True\n")
    expected = (f"accuracy.val_func {package}.judges:judge: cannot import module '{package}.judges' "
                "(RuntimeError: configure me first)")
    assert one_line(val_func_source, f"{package}.judges:judge") == expected
    assert one_line(load_val_func, f"{package}.judges:judge") == expected


def test_a_package_without_a_module_file_is_not_found(workflow_dir):
    """A folder without __init__.py imports as a namespace package, which has no source to track."""
    folder, package = workflow_dir
    (folder / package).mkdir()
    assert one_line(val_func_source, f"{package}:judge") == (
        f"accuracy.val_func: module '{package}' not found beside the workflow or on sys.path")


def test_a_nul_byte_in_the_source_fails_when_the_workflow_is_parsed(workflow_dir):
    folder, module = workflow_dir
    (folder / f"{module}.py").write_bytes(b"def judge(reference, candidate):\n    return True  \x00\n")
    assert one_line(val_func_source, f"{module}:judge").startswith(
        f"accuracy.val_func {module}:judge: cannot import module '{module}' (")
