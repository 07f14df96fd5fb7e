"""The validated config's sections as the jobs are handed them (a rule's params), typed: the schema
(`data/config.schema.yaml`) fills every default, so each key is present. The schema stays the one source
of the keys, their defaults and bounds; these say what a job may read.
"""

from __future__ import annotations

from typing import TypedDict


class AccuracySection(TypedDict):
    """`accuracy`: the check (`core.accuracy.AccuracyCheck.from_config` reads it)."""

    rtol: float
    atol: float
    ntol: float
    cosine: float | None
    min_pass_fraction: float
    val_func: str | None  # "module:function"


class BisectSection(TypedDict):
    """`bisect`: what a search may probe and how much it may spend."""

    rules: list[str] | None  # fusion_bisect's candidates narrowed to these
    parallel: int  # probes of a round run side by side
    max_probes: int | None
    max_minutes: float | None


class PrecisionSection(TypedDict):
    """`precision`: which compiled nodes run reduced, as the seeds set it."""

    mode: str  # force_fp16 | allow_mix_precision | ... (`core.precision`)
    graph: str  # compiled | original: the graph precision is assigned on
    dtype: str  # fp16 | bf16
    keep_dtype: list[str]
    modify_mixlist: str | None  # a JSON file
    no_fp32_ops: list[str]
