"""`accubisect init`'s config.yaml: every key of the schema at its default, each under a comment saying what it
does and what it takes, so a new project starts from a file that documents itself and that the schema's next
default does not silently disagree with (it is written from the schema, not from a copy)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml

from accubisect.core.errors import UsageError

WIDTH = 110
HEADER = """\
# accubisect configuration, written by `accubisect init` from the schema's defaults: set model and samples,
# change what you need, and run a target here with `accubisect run fusion_bisect` (it reads this file), or with
# snakemake from your own Snakefile (docs/your-project.md). Every key: docs/configuration.md.
"""


def starter_config(schema: dict[str, Any]) -> str:
    """The config file's text: the header, then each key of `schema` (sections indented under their name)."""
    required = set(schema.get("required", ()))
    return HEADER + "".join(_key(name, spec, name in required, 0) for name, spec in schema["properties"].items())


def write_starter_config(path: Path, schema: dict[str, Any]) -> None:
    """Writes the file, never over one that exists: it may hold the user's settings."""
    try:
        with path.open("x") as file:
            file.write(starter_config(schema))
    except FileExistsError:
        raise UsageError(f"{path} exists; accubisect init leaves it as it is: edit it, or move it away and run "
                         "init again") from None


def _key(name: str, spec: dict[str, Any], required: bool, depth: int) -> str:
    indent = "  " * depth
    comment = textwrap.wrap(_comment(spec, required), WIDTH - len(indent) - 2, break_on_hyphens=False)
    lines = "".join(f"{indent}# {line}\n" for line in comment)
    if "properties" in spec:
        return "\n" + lines + f"{indent}{name}:\n" + "".join(_key(key, sub, False, depth + 1)
                                                      for key, sub in spec["properties"].items())
    value = spec["examples"][0] if required else spec["default"]
    return lines + textwrap.indent(yaml.safe_dump({name: value}, default_flow_style=False, width=1000), indent)


def _comment(spec: dict[str, Any], required: bool) -> str:
    """The key's description, then what it takes: its choices or bounds; required keys say so."""
    text = " ".join(spec.get("description", "").split())
    if "enum" in spec:
        text += f" (one of: {', '.join(str(choice) for choice in spec['enum'])})"
    bounds = [f"{word} {spec[key]}" for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                       ("maximum", "<=")) if key in spec]
    if bounds:
        text += f" ({', '.join(bounds)})"
    return f"REQUIRED: {text}" if required else text
