"""What a run was made from: the first line of every summary, and the header of every HTML page.

A summary read later, pasted into an issue or compared with another, names the model, the samples and the
compile settings in force, so that no setting (an example's session config, a forgotten switch file) acts
unseen. The workflow computes the values once from the validated config and passes them to every summary
job as the `context` param; `with_context(context, body)` puts the line above a summary. A page's header
says more: the model's digest, the config, the versions of the libraries that wrote it and when
(`PageHeader`, `report_html.header_html`).

A compare job is given only the config sections that decide its comparison (`compare_context`): a param
that changes reruns the job, and a setting such as `bisect.max_probes` must not redo a comparison.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LINE_FIELDS = ("model", "samples", "sample_count", "level", "session_config", "fusion_switch", "backend")
# The config sections that decide each comparison (its stage key, workflow/plan.py); the rest (workspace,
# results, bisect and the other comparison's section) is on the bisect pages.
COMPARISON_SECTIONS = {"fusion": ("model", "samples", "backend", "compile", "dump", "accuracy", "compare"),
                       "precision": ("model", "samples", "backend", "compile", "dump", "accuracy", "precision")}
LIBRARIES = ("accubisect", "onnxruntime", "onnx", "numpy")
PLAIN_UNSAFE = re.compile(r"""[:{}\[\],#&*!|>'"%@`]|^[-?~]""")  # a YAML plain scalar in flow style cannot hold these


def run_context(config: Mapping[str, Any], sample_count: int, model_sha256: str | None = None,
                invocation: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`context_line`'s keyword arguments from a validated config and the number of samples the run uses,
    and for the pages: the model's sha256, the config, and how the run was invoked (`invocation`: the
    `configfiles` and the `--config` overrides, from which a page writes the command that applies its answer)."""
    compile_options = config["compile"]
    return {"model": config["model"], "samples": config["samples"], "sample_count": sample_count,
            "level": compile_options["level"], "session_config": dict(compile_options["session_config"]),
            "fusion_switch": compile_options["fusion_switch"], "backend": config["backend"],
            "model_sha256": model_sha256, "config": dict(config), "invocation": invocation}


def compare_context(context: Mapping[str, Any], comparison: str) -> dict[str, Any]:
    """A compare job's context: the config sections that decide `comparison` (fusion | precision) only, no
    invocation, and which comparison it is (its page links the bisection's page)."""
    config = context.get("config") or {}
    sections = COMPARISON_SECTIONS[comparison]
    return {**context, "config": {key: config[key] for key in sections if key in config}, "invocation": None,
            "comparison": comparison}


def invocation(configfiles: Sequence[Path | str], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """How snakemake was called: its config files (relative to the working directory where they lie below
    it) and its `--config` overrides."""
    return {"configfiles": [_relative(path) for path in configfiles], "config": dict(overrides)}


def _relative(path: Path | str) -> str:
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def context_line(model: str, samples: str, sample_count: int, level: str, session_config: Mapping[str, Any],
                 fusion_switch: str | None, backend: str) -> str:
    """One line, no newline: model; sample count and folder; compile level; session config entries (or
    "none"); switch file (or "none"); backend."""
    entries = ", ".join(f"{key}={value}" for key, value in sorted(session_config.items())) or "none"
    return (f"model {model}; {sample_count} sample(s) from {samples}; compile level {level}; "
            f"session config {entries}; switch file {fusion_switch or 'none'}; backend {backend}")


def line_of(context: Mapping[str, Any]) -> str:
    """`context_line` of a context (`run_context`'s values; the pages' extra keys are not on the line)."""
    return context_line(**{key: context[key] for key in LINE_FIELDS})


def with_context(context: Mapping[str, Any], body: str) -> str:
    """A summary: the context line (`run_context`'s values), then `body`."""
    return f"{line_of(context)}\n{body}"


def library_versions() -> dict[str, str]:
    """The installed versions of the libraries that made a page's numbers, and Python's."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {**versions, "python": platform.python_version()}


@dataclass(frozen=True)
class PageHeader:
    """What a page's header states: the model and its digest, the config (the sections in force for this
    page), the tolerances, the library versions, when it was written, and links to the pages beside it."""

    model: str
    model_sha256: str | None
    config: Mapping[str, Any]
    tolerances: Mapping[str, Any]
    versions: Mapping[str, str]
    written: str  # UTC, to the second
    links: tuple[tuple[str, str], ...] = ()  # (text, relative address)
    config_scope: str = "config"  # what part of the config `config` is, as the page says it

    @classmethod
    def now(cls, context: Mapping[str, Any], tolerances: Mapping[str, Any],
            links: Sequence[tuple[str, str]] = ()) -> PageHeader:
        """The header of a page written now, from its job's context and the tolerances it was judged by."""
        written = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        scope = "config: the sections that decide this comparison" if context.get("comparison") else "config"
        return cls(str(context["model"]), context.get("model_sha256"), dict(context.get("config") or {}),
                   dict(tolerances), library_versions(), written, tuple(links), scope)


def config_yaml(config: Mapping[str, Any]) -> str:
    """The config as YAML, in the schema's order."""
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False).rstrip("\n")


def apply_command(target: str, context: Mapping[str, Any], setting: Mapping[str, Any]) -> str:
    """The snakemake command that reruns `target` as this run was invoked, with `setting` (a config section
    and its keys, e.g. {"compile": {"fusion_switch": "results/fusion_bisect/fusion_switch.cfg"}}) merged into
    the `--config` overrides, so it is what this run did plus the answer. Without a recorded invocation, the
    run's config is named as <your config>."""
    called = context.get("invocation") or {"configfiles": ["<your config>"], "config": {}}
    overrides = _merged(called["config"], setting)
    words = ["snakemake", target, "--cores", "2"]
    for path in called["configfiles"]:
        words += ["--configfile", path]
    words.append("--config")
    words += [f"{key}={_flow(value)}" for key, value in overrides.items()]
    return " ".join(_quoted(word) for word in words)


def _merged(base: Mapping[str, Any], setting: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `setting` merged in recursively, as Snakemake merges --config over --configfile."""
    merged = dict(base)
    for key, value in setting.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _flow(value: Any) -> str:
    """A --config value as Snakemake reads it back: YAML flow style, read with YAML's BaseLoader (every scalar
    a string, as Snakemake reads the values it was given), so a number needs no quotes."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_flow(key)}: {_flow(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(item) for item in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = str(value)
    if text and not PLAIN_UNSAFE.search(text) and text == text.strip():
        return text
    return "'" + text.replace("'", "''") + "'"


def _quoted(word: str) -> str:
    """A shell word; `key=value` keeps the key unquoted, as the docs write it."""
    key, equals, value = word.partition("=")
    if equals and key.isidentifier():
        return f"{key}={shlex.quote(value)}"
    return shlex.quote(word)
