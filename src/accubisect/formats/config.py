"""Validates the workflow configuration against its JSON schema and fills in the schema's defaults.

Snakemake's own `validate` reports only the first error and prints the whole schema for an unknown key;
a user needs one line per problem that names the key, so the validation is done here.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import jsonschema
import yaml

from accubisect.core.errors import ConfigError


def load_schema() -> dict[str, Any]:
    text = resources.files("accubisect").joinpath("data/config.schema.yaml").read_text()
    return yaml.safe_load(text)


NOT_CONFIGURED = ("no model configured: pass --configfile FILE or --config model=PATH samples=FOLDER "
                  "(accubisect init writes a commented one; in a checkout, the bundled example: "
                  "--configfile examples/config.yaml)")


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Returns a copy of `config` with defaults filled in; raises ConfigError naming every bad key. The
    Snakefile names no config file (so no example setting leaks into a user's run): given none at all, the
    one line says what to pass rather than which keys the schema requires."""
    if not config:
        raise ConfigError(NOT_CONFIGURED)
    schema = load_schema()
    filled = _with_defaults(copy.deepcopy(dict(config)), schema)
    validator = jsonschema.Draft202012Validator(schema)
    problems = sorted(validator.iter_errors(filled), key=lambda e: list(e.absolute_path))
    lines = [_one_line(error) for error in problems] + _exclusive_filters(filled.get("dump", {}))
    if lines:
        raise ConfigError("\n".join(lines))
    return filled


def _exclusive_filters(dump: dict[str, Any]) -> list[str]:
    """The seeds' dump filters and bypasses exclude one another."""
    names = ("op_type_filter", "op_type_bypass", "op_name_filter", "op_name_bypass")
    chosen = [name for name in names if isinstance(dump, dict) and dump.get(name) is not None]
    if len(chosen) > 1:
        return [f"dump: {' and '.join(chosen)} are mutually exclusive; set at most one of {', '.join(names)}"]
    return []


def _with_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Fills defaults, and reads numbers, booleans and nulls given as text (`snakemake --config` passes
    nested values as strings)."""
    if isinstance(value, str):
        return _from_text(value, schema)
    if not isinstance(value, dict):
        return value
    for key, sub in schema.get("properties", {}).items():
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if key in value:
            value[key] = _with_defaults(value[key], sub)
    return value


def _from_text(text: str, schema: dict[str, Any]) -> Any:
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if "null" in types and text in ("null", "None", "~"):
        return None
    if "string" in types:
        return text
    if "array" in types:  # `--config` lists arrive as "[a, b]" or "a,b"
        return [item.strip() for item in text.strip("[]").split(",") if item.strip()]
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind, parse in (("integer", int), ("number", float)):
        if kind in types:
            try:
                return parse(text)
            except ValueError:
                pass
    return text


def _one_line(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(part) for part in error.absolute_path) or "config"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return f"{where}: {error.message}; allowed keys: {', '.join(allowed)}"
    return f"{where}: {error.message}"
