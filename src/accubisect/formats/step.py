"""What a job is given: its rule's named input and output files and params, as one frozen record.

A stage function takes one `Step` subclass, a frozen dataclass whose fields are the names the rule gives
its inputs, outputs and params; `workflow.step.run_step` builds it from Snakemake's job with `from_named`.
A field's type says what a value becomes: `Path` (a file), `tuple[Path, ...]` (a list of files; one file
given alone becomes a tuple of one), `str`, `tuple[str, ...]`, `X | None`; anything else (a number, a
config mapping) is kept as given. A field with a default may be left out by the rule.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from accubisect.core.errors import StepError


class Step:
    """Base of every step record (a frozen dataclass): built by name from a job's files and params."""

    @classmethod
    def from_named(cls, named: Mapping[str, Any]) -> Self:
        fields = {field.name: field for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(named) - set(fields))
        missing = sorted(name for name, field in fields.items() if name not in named
                         and field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING)
        if unknown or missing:
            raise StepError(f"{cls.__name__}: the rule gives {unknown or 'no name'} it has no field for and lacks "
                            f"{missing or 'no field'}; its fields: {sorted(fields)}")
        hints = typing.get_type_hints(cls)
        return cls(**{name: typed(hints[name], value) for name, value in named.items()})


def typed(hint: Any, value: Any) -> Any:
    """`value` as a field of type `hint` holds it (see the module's docstring)."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return typed(next(argument for argument in arguments if argument is not type(None)), value)
    if hint is Path:
        return Path(value)
    if hint is str:
        return str(value)
    if origin is tuple and len(arguments) == 2 and arguments[1] is Ellipsis:
        items = [value] if isinstance(value, str | Path) else value
        return tuple(typed(arguments[0], item) for item in items)
    return value
