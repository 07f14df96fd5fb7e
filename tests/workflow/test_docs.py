"""The documentation stays true to the code: every config key of the schema, with its default, is in
docs/configuration.md; every target rule is in docs/targets.md and the README; every file a rule writes is in
docs/file-formats.md; every command of `accubisect` is on a page; every relative link of README.md and
docs/*.md reaches a file and, with #anchor, one of its headings; the README stays something a newcomer
finishes. A key, target, file or command added without its line in the docs fails here, naming it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml
from conftest import schema_keys

from accubisect.formats.paths import PUBLISHED, STAGES
from accubisect.workflow import cli

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
SCHEMA = REPO / "src" / "accubisect" / "data" / "config.schema.yaml"
README_LINES = 250


def _outside_code(text: str) -> str:
    """The text with fenced and indented code blocks blanked: a `# comment` in a shell block is no heading,
    and a link in an example is no link of the page."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            kept.append("")
            continue
        kept.append("" if fenced or line.startswith("    ") and not line.lstrip().startswith(("-", "|")) else line)
    return "\n".join(kept)


def _table_first_cells(text: str) -> list[str]:
    """The first column of every Markdown table row, the header and separator rows left out."""
    cells = []
    for line in _outside_code(text).splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| :]+\|$", line):
            cells.append(re.split(r"(?<!\\)\|", line)[1])
    return cells


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _documented_keys() -> dict[str, str]:
    """Key -> the default column of its row in docs/configuration.md's key table."""
    rows = {}
    for line in _outside_code((DOCS / "configuration.md").read_text()).splitlines():
        cells = re.split(r"(?<!\\)\|", line)
        if line.startswith("| `") and len(cells) > 3:
            for key in _code_spans(cells[1]):
                rows[key] = cells[2].strip()
    return rows


def _value(cell: str) -> object:
    """A default as the table writes it (`1e-3`, `null`, `[]`), read as YAML would read the schema's."""
    text = cell.strip("` ")
    try:
        return float(text)
    except ValueError:
        return yaml.safe_load(text)


def test_every_config_key_is_documented_with_the_schemas_default():
    schema = yaml.safe_load(SCHEMA.read_text())
    keys, documented = schema_keys(schema["properties"]), _documented_keys()
    assert sorted(set(keys) - set(documented)) == [], "config keys missing from docs/configuration.md"
    assert sorted(set(documented) - set(keys)) == [], "docs/configuration.md documents keys the schema lacks"
    for key, spec in keys.items():
        if key in schema["required"]:
            assert documented[key] == "(required)", key
        else:
            assert _value(documented[key]) == spec.get("default"), f"{key}: docs say {documented[key]}"


def _rule_bodies() -> list[tuple[str, str]]:
    """(name, body) of every `rule NAME:` in the Snakefile and rules/*.smk; a name defined in two files (one
    per backend) is there twice."""
    bodies = []
    for path in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]:
        text = path.read_text()
        starts = list(re.finditer(r"^rule (\w+):\n", text, re.MULTILINE))
        for start, end in zip(starts, [*starts[1:], None]):
            bodies.append((start.group(1), text[start.end():end.start() if end else len(text)]))
    return bodies


def _targets() -> set[str]:
    """A target is a rule that only names other rules' files: no output, no script."""
    return {name for name, body in _rule_bodies()
            if not re.search(r"^    (output|script):", body, re.MULTILINE)}


def test_the_targets_are_found():
    assert {"all", "compare", "fusion_bisect", "precision_bisect", "reduce"} <= _targets()
    assert "compile_variant" not in _targets()


@pytest.mark.parametrize("page", ["docs/targets.md", "README.md"])
def test_every_target_is_in_the_target_tables(page):
    listed = {span.split()[0] for cell in _table_first_cells((REPO / page).read_text()) for span in _code_spans(cell)}
    assert sorted(_targets() - listed) == [], f"targets missing from {page}'s table"


def _written_files() -> set[str]:
    """What the rules' `output:` entries name below their folder: `dump.h5`, `inputs/sample{N}.npz`, and the
    publishing rules' `published.json`."""
    files = set()
    for _, body in _rule_bodies():
        block = re.search(r"^    output:\n((?:        .*\n)+)", body, re.MULTILINE)
        for entry in block.group(1).splitlines() if block else []:
            parts = re.findall(r'/ f?"([^"]+)"', entry)
            if parts:
                files.add("/".join(parts).replace("{s}", "sample{N}"))
            elif entry.rstrip(",)").endswith("PUBLISHED"):
                files.add(PUBLISHED)
    return files


def test_every_file_the_workflow_writes_is_in_file_formats():
    cells = " ".join(_table_first_cells((DOCS / "file-formats.md").read_text()))
    spans = _code_spans(cells)
    written = _written_files()
    assert {"dump.h5", "graph.json", "fusion_switch.cfg", "inputs/sample{N}.npz", PUBLISHED} <= written
    assert sorted(f for f in written if not any(f in span for span in spans)) == []
    assert sorted(s for s in STAGES if not any(f"workspace/{s}/" in span for span in spans)) == [], \
        "stage folders missing from docs/file-formats.md"


def _commands(parser: argparse.ArgumentParser, prefix: str) -> set[str]:
    """`accubisect compare`, `accubisect workspace prune`, ...: every command line the parser accepts."""
    commands = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                commands |= _commands(sub, f"{prefix} {name}") or {f"{prefix} {name}"}
    return commands


def test_every_command_of_accubisect_is_documented():
    text = " ".join(path.read_text() for path in PAGES)
    commands = _commands(cli._Parser(prog="accubisect").with_commands(), "accubisect")
    assert {"accubisect compare", "accubisect workspace prune"} <= commands
    assert sorted(c for c in commands if f"`{c}" not in text and f"\n{c} " not in text) == []


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", _outside_code(path.read_text()), re.MULTILINE):
        base = _anchor(heading)
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return anchors


def _links(path: Path) -> list[str]:
    text = _outside_code(path.read_text())
    text = re.sub(r"`[^`]*`", "", text)
    return [link for link in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^[a-z]+:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for link in _links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(REPO)}")
    assert broken == []


def test_every_docs_page_can_be_reached_from_the_readme():
    """Following links from the README, directly or through other pages: a new page linked from the page of
    its topic is found without an edit of the README."""
    reached, todo = set(), [(REPO / "README.md").resolve()]
    while todo:
        page = todo.pop()
        if page in reached or page.suffix != ".md" or not page.exists():
            continue
        reached.add(page)
        todo += [(page.parent / link.partition("#")[0]).resolve() for link in _links(page) if link.partition("#")[0]]
    assert sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in reached) == []


def test_the_readme_is_one_a_newcomer_finishes():
    assert len((REPO / "README.md").read_text().splitlines()) < README_LINES
