"""What the reduced type can reach at all, measured before a precision search.

A check tighter than the reduced type's own rounding fails every useful configuration, and the search
then keeps almost every node in fp32 after hundreds of probes (a paddle2onnx recognizer with 400 reduced
nodes: 732 probes in 26 minutes at ntol 0, a handful of softmax elements failing every configuration).
So each op type is first run alone in the reduced type, every other node in fp32, the op type with the
smallest local error first. The first that passes shows the check can be met, and the floor stops there:
one probe on a healthy model. When none passes, one warning line says the check is below the floor and
suggests tolerances under which half of the op types pass alone.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from accubisect.strategy import Config

log = logging.getLogger("accubisect")

CHOOSING = "README, 'Choosing a check for fp16'"


def op_type_order(ranking: Sequence[Mapping[str, Any]], op_types: Mapping[str, str]) -> dict[str, list[str]]:
    """Candidate nodes grouped by op type, the group whose worst local error is smallest first."""
    groups: dict[str, list[str]] = {}
    worst: dict[str, float] = {}
    for entry in ranking:
        op_type = op_types[entry["name"]]
        groups.setdefault(op_type, []).append(entry["name"])
        worst[op_type] = max(worst.get(op_type, 0.0), entry["local_error"] or 0.0)
    return {op_type: groups[op_type] for op_type in sorted(groups, key=lambda t: (worst[t], -len(groups[t])))}


Probe = Callable[[Config], Mapping[str, Any]]


def measure_floor(candidates: Sequence[str], groups: Mapping[str, Sequence[str]], probe: Probe,
                  key_of: Callable[[Config], str]) -> list[dict[str, Any]]:
    """Each op type alone in the reduced type until one passes; `probe(off)` judges a configuration and
    `key_of(off)` names its verdict (so pruning the workspace keeps it)."""
    rows = []
    for op_type, nodes in groups.items():
        off = frozenset(candidates) - frozenset(nodes)
        verdict = probe(off)
        rows.append({"op_type": op_type, "nodes": len(nodes), "passed": verdict["passed"], "worst": verdict["worst"],
                     "verdict": key_of(off)})
        if verdict["passed"]:
            break
    return rows


def floor_record(rows: Sequence[Mapping[str, Any]], accuracy: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """The floor's rows, whether the check is reachable, and the warning and suggestion when it is not."""
    reachable = not rows or any(row["passed"] for row in rows)
    suggestion = {} if reachable else suggest(rows, accuracy)
    warning = None if reachable else _warning(rows, accuracy, dtype, suggestion)
    if warning:
        log.warning("%s", warning)
    return {"op_types": list(rows), "reachable": reachable, "suggestion": suggestion, "warning": warning}


def suggest(rows: Sequence[Mapping[str, Any]], accuracy: Mapping[str, Any]) -> dict[str, float]:
    """Tolerances under which half of the op types would pass alone: the median worst mismatch fraction
    and cosine, rounded to one significant digit in the lenient direction."""
    if accuracy.get("val_func"):
        return {}
    measured = [row["worst"] for row in rows if "mismatch" in row["worst"]]
    if not measured:
        return {}
    mismatch = statistics.median(w["mismatch"] for w in measured)
    cosine = statistics.median(w["cosine"] for w in measured)
    suggestion = {}
    if mismatch > accuracy["ntol"]:
        suggestion["ntol"] = min(1.0, _up_to_one_digit(mismatch))
    if math.isfinite(cosine) and cosine < 1.0:
        suggestion["cosine"] = 1.0 - _up_to_one_digit(1.0 - cosine)
    return suggestion


def _up_to_one_digit(value: float) -> float:
    scale = 10.0 ** math.floor(math.log10(value))
    return math.ceil(value / scale - 1e-9) * scale


def _warning(rows: Sequence[Mapping[str, Any]], accuracy: Mapping[str, Any], dtype: str,
             suggestion: Mapping[str, float]) -> str:
    closest = min(rows, key=lambda row: row["worst"].get("mismatch", math.inf))
    worst = closest["worst"]
    metrics = (f"{worst['mismatch']:.2%} of elements outside rtol/atol, cosine {worst['cosine']:.6f}"
               if "mismatch" in worst else "no output metrics")
    check = "val_func " + accuracy["val_func"] if accuracy.get("val_func") else (
        f"rtol {accuracy['rtol']:g}, atol {accuracy['atol']:g}, ntol {accuracy['ntol']:g}"
        + (f", cosine {accuracy['cosine']:g}" if accuracy.get("cosine") is not None else ""))
    settings = " or ".join(f"accuracy.{key}: {_number(value)}" for key, value in suggestion.items())
    remedy = f"a check {dtype} can meet: {settings}, or a val_func on the task's own metric" if settings else (
        f"a check {dtype} can meet, e.g. a val_func on the task's own metric")
    return (f"the accuracy check ({check}) is tighter than {dtype} reaches on this model: no op type passes it "
            f"alone in {dtype} with every other node in fp32 (closest: {closest['op_type']}, {metrics}), so the "
            f"search will keep nearly every node in fp32; use {remedy} ({CHOOSING}); bisect.max_probes bounds "
            "the search meanwhile")


def _number(value: float) -> str:
    return f"{value:.10g}"
