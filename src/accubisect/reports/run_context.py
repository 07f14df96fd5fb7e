"""The first line of every summary: what the run was made from.

A summary read later, pasted into an issue or compared with another, names the model, the samples and the
compile settings in force, so that no setting (an example's session config, a forgotten switch file) acts
unseen. The workflow computes the values once from the validated config and passes them to every summary
job as the `context` param; `with_context(context, body)` puts the line above a summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def run_context(config: Mapping[str, Any], sample_count: int) -> dict[str, Any]:
    """`context_line`'s keyword arguments, from a validated config and the number of samples the run uses."""
    compile_options = config["compile"]
    return {"model": config["model"], "samples": config["samples"], "sample_count": sample_count,
            "level": compile_options["level"], "session_config": dict(compile_options["session_config"]),
            "fusion_switch": compile_options["fusion_switch"], "backend": config["backend"]}


def context_line(model: str, samples: str, sample_count: int, level: str, session_config: Mapping[str, Any],
                 fusion_switch: str | None, backend: str) -> str:
    """One line, no newline: model; sample count and folder; compile level; session config entries (or
    "none"); switch file (or "none"); backend."""
    entries = ", ".join(f"{key}={value}" for key, value in sorted(session_config.items())) or "none"
    return (f"model {model}; {sample_count} sample(s) from {samples}; compile level {level}; "
            f"session config {entries}; switch file {fusion_switch or 'none'}; backend {backend}")


def with_context(context: Mapping[str, Any], body: str) -> str:
    """A summary: the context line (`run_context`'s values), then `body`."""
    return f"{context_line(**context)}\n{body}"
