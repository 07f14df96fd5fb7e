"""The package's folders are its architecture: a layer imports only itself and the layers below it, only
the runtime imports ONNX Runtime, the core does no I/O, and no two modules import each other, however
roundabout. Checked over every import statement, lazy ones inside functions included, so a shortcut taken
in a hurry fails here rather than in a review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "accubisect"
# lowest first; docs/architecture.md draws the same stack
LAYERS = ("core", "formats", "runtime", "reports", "stages", "bisection", "workflow")
# third-party packages a layer may not import (checked in that layer and every layer below the one named)
ONLY_IN = {"onnxruntime": "runtime"}
# the core computes on what it is given: no files, processes, sys.path or user code (formats/ and runtime/ do that)
NOT_IN_CORE = ("h5py", "onnxruntime", "io", "os", "sys", "pathlib", "shutil", "tempfile", "glob", "subprocess",
               "importlib", "pickle", "socket", "urllib", "mmap", "onnx.external_data_helper")
IO_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "tofile"}
IO_FUNCTIONS = {("onnx", "load"), ("onnx", "load_model"), ("onnx", "save"), ("onnx", "save_model"), ("np", "load"),
                ("np", "save"), ("np", "savez"), ("np", "savez_compressed"), ("np", "fromfile"), ("np", "memmap"),
                ("json", "load"), ("json", "dump")}
RUNS_CODE = {"open", "__import__", "exec", "eval"}  # builtins: a file, or code the core was not handed as a function


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE)


def imported(path: Path, run_time_only: bool = False) -> set[str]:
    """Every module name an import statement in `path` names (`from a.b import c` gives a.b and a.b.c); with
    `run_time_only`, not those under `if TYPE_CHECKING:`, which never run."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for statement in node.body for inner in ast.walk(statement)} if run_time_only else set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def io_calls(path: Path) -> list[str]:
    """The calls in `path` that touch files or run code: open(), Path.open/read_*/write_*, the libraries'
    load/save, __import__/exec/eval."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in RUNS_CODE:
            found.append(f"line {node.lineno}: {func.id}()")
        elif isinstance(func, ast.Attribute) and (func.attr in IO_METHODS or isinstance(func.value, ast.Name)
                                                  and (func.value.id, func.attr) in IO_FUNCTIONS):
            found.append(f"line {node.lineno}: .{func.attr}()")
    return found


def module_name(path: Path) -> str:
    return ".".join(("accubisect", *path.relative_to(PACKAGE).with_suffix("").parts))


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports when it runs, lazily or not (a `from package import module`
    names the module)."""
    names = {module_name(path): path for path in modules()}
    return {name: {other for other in imported(path, run_time_only=True) if other in names and other != name}
            for name, path in names.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other, directly or round a loop (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in sorted(graph.get(name, ())):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while not component or component[-1] != name:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def test_every_module_sits_in_a_layer():
    assert {path.name for path in PACKAGE.glob("*.py")} == {"__init__.py"}
    assert {layer_of(path) for path in modules()} == set(LAYERS)


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_imports_no_layer_above_its_own(path):
    own = LAYERS.index(layer_of(path))
    above = {name for name in imported(path) if name.startswith("accubisect.")
             and name.split(".")[1] in LAYERS and LAYERS.index(name.split(".")[1]) > own}
    assert not above, f"{layer_of(path)} module imports a higher layer: {sorted(above)}"


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_third_party_runtimes_stay_in_their_layer(path):
    roots = {name.split(".")[0] for name in imported(path)}
    for package, layer in ONLY_IN.items():
        assert package not in roots or layer_of(path) == layer, f"{package} imported outside {layer}"
    if layer_of(path) == "core":
        assert not banned_in_core(path), f"the pure core imports {banned_in_core(path)}"


def banned_in_core(path: Path) -> list[str]:
    """The modules of NOT_IN_CORE (and their submodules) `path` imports."""
    below = tuple(f"{module}." for module in NOT_IN_CORE)
    return sorted(name for name in imported(path) if name in NOT_IN_CORE or name.startswith(below))


def test_the_checker_sees_lazy_imports(tmp_path):
    sample = tmp_path / "lazy.py"
    sample.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import h5py\n"
                      "def f():\n    from accubisect.workflow.plan import Plan\n    import onnxruntime\n")
    assert {"accubisect.workflow.plan", "accubisect.workflow.plan.Plan", "onnxruntime", "h5py"} <= imported(sample)
    assert "h5py" not in imported(sample, run_time_only=True) and "onnxruntime" in imported(sample, run_time_only=True)


@pytest.mark.parametrize("path", [path for path in modules() if layer_of(path) == "core"],
                         ids=lambda path: str(path.relative_to(PACKAGE)))
def test_the_core_does_no_io(path):
    assert not io_calls(path), f"the pure core touches files: {io_calls(path)}; move it to formats/ or runtime/"


def test_no_modules_import_each_other():
    found = circles(import_graph())
    assert not found, f"modules import each other: {found}; move what both need into a module below them"


def test_the_checkers_see_io_and_circles(tmp_path):
    sample = tmp_path / "io.py"
    sample.write_text("import json\ndef f(p, q):\n    open(p)\n    q.write_text('')\n    json.dumps({})\n"
                      "    q.open()\n    np.fromfile(p)\n    __import__(p)\n    exec(q)\n    return json.load(p)\n")
    assert io_calls(sample) == ["line 3: open()", "line 4: .write_text()", "line 6: .open()", "line 7: .fromfile()",
                                "line 8: __import__()", "line 9: exec()", "line 10: .load()"]
    sample.write_text("import mmap\nimport numpy.linalg\nfrom onnx.external_data_helper import f\n"
                      "from os import path\n")
    assert banned_in_core(sample) == ["mmap", "onnx.external_data_helper", "onnx.external_data_helper.f", "os",
                                      "os.path"]
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
