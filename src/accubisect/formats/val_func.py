"""Finding and importing a user's `val_func` ("module:function", config `accuracy.val_func`).

I/O on the user's code, so outside the pure core that judges with it (`core.accuracy`): the check names
the val_func, this module finds its file (whose digest keys the comparisons it judges) and imports it.
Modules are looked up beside the workflow (the working directory) first, then on sys.path.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from accubisect.core.accuracy import AccuracyCheck, ValFunc, describe_error
from accubisect.core.errors import ConfigError


def _look_beside_the_workflow() -> None:
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))


def val_func_source(spec: str | None) -> Path | None:
    """The file defining a `val_func`, found without importing it, so that editing it re-runs a comparison."""
    if spec is None:
        return None
    module = spec.partition(":")[0]
    _look_beside_the_workflow()
    try:
        found = importlib.util.find_spec(module)
    except ImportError:
        found = None
    except Exception as error:  # a parent package that fails as it is imported
        raise _import_error(spec, error) from None
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise ConfigError(f"accuracy.val_func: module '{module}' not found beside the workflow or on sys.path")
    source = Path(found.origin)
    try:  # a syntax error fails when the workflow is parsed, not after every dump has run
        compile(source.read_bytes(), str(source), "exec")
    except (SyntaxError, ValueError) as error:  # ValueError: a NUL byte in the source
        raise _import_error(spec, error) from None
    return source


def load_val_func(check: AccuracyCheck) -> ValFunc | None:
    """The check's val_func, imported; None when it has none."""
    spec = check.val_func
    if spec is None:
        return None
    module_name, _, function_name = spec.partition(":")
    _look_beside_the_workflow()
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a syntax error, a missing import or anything the module raises at import
        raise _import_error(spec, error) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"accuracy.val_func: module '{module_name}' has no function '{function_name}'")
    return ValFunc(spec, function)


def _import_error(spec: str, error: Exception) -> ConfigError:
    return ConfigError(f"accuracy.val_func {spec}: cannot import module '{spec.partition(':')[0]}' "
                       f"({describe_error(error)})")
