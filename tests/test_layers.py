"""The package's folders are its architecture: a layer imports only itself and the layers below it, and
only the runtime imports ONNX Runtime. Checked over every import statement, lazy ones inside functions
included, so a shortcut taken in a hurry fails here rather than in a review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "accubisect"
# lowest first; README "Architecture" draws the same stack
LAYERS = ("core", "formats", "runtime", "reports", "stages", "bisection", "workflow")
# third-party packages a layer may not import (checked in that layer and every layer below the one named)
ONLY_IN = {"onnxruntime": "runtime"}
NOT_IN_CORE = ("h5py", "onnxruntime")


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE)


def imported(path: Path) -> set[str]:
    """Every module name an import statement in `path` names (`from a.b import c` gives a.b and a.b.c)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


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
        assert not roots & set(NOT_IN_CORE), f"the pure core imports {sorted(roots & set(NOT_IN_CORE))}"


def test_the_checker_sees_lazy_imports(tmp_path):
    sample = tmp_path / "lazy.py"
    sample.write_text("def f():\n    from accubisect.workflow.plan import Plan\n    import onnxruntime\n")
    assert {"accubisect.workflow.plan", "accubisect.workflow.plan.Plan", "onnxruntime"} <= imported(sample)
