"""docs/glossary.md gives one word per concept and the code's name for it: every dotted name it gives
(`core.strategy.Configuration`) exists in the package, and no other module defines a class or a type alias of
the same name, so a word of the glossary means one thing in the code as well (issue 23, item 4)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "accubisect"
GLOSSARY = ROOT / "docs" / "glossary.md"
CODE_NAME = re.compile(r"`((?:core|formats|runtime|reports|stages|bisection|workflow)(?:\.\w+)+)`")
TYPE_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")  # CapWords: a class or a type alias


def code_names() -> list[str]:
    return sorted(set(CODE_NAME.findall(GLOSSARY.read_text())))


def found(dotted: str) -> object:
    """The module or the object `dotted` names under accubisect."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(["accubisect", *parts[:split]]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


def defined_types(path: Path) -> set[str]:
    """The classes and module-level type aliases (`Configuration = frozenset[str]`) `path` defines."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names.add(node.targets[0].id)
    return {name for name in names if TYPE_NAME.match(name)}


def test_the_glossary_names_code() -> None:
    assert len(code_names()) >= 10  # the pattern still finds the glossary's code names


@pytest.mark.parametrize("dotted", code_names())
def test_every_code_name_in_the_glossary_exists(dotted: str) -> None:
    found(dotted)


@pytest.mark.parametrize("dotted", [name for name in code_names() if TYPE_NAME.match(name.rsplit(".", 1)[1])])
def test_a_glossary_type_is_defined_by_one_module_only(dotted: str) -> None:
    name = dotted.rsplit(".", 1)[1]
    modules = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if name in defined_types(path))
    assert modules == [dotted.rsplit(".", 1)[0].replace(".", "/") + ".py"], f"{name} is defined in {modules}"
