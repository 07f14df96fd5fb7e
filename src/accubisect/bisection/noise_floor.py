"""What the reduced type can reach at all, measured before a precision search.

A check tighter than the reduced type's own rounding fails every useful configuration, and the search
then keeps almost every node in fp32 after hundreds of probes (a paddle2onnx recognizer with 400 reduced
nodes: 732 probes in 26 minutes at ntol 0, a handful of softmax elements failing every configuration).

A culprit makes an error of its own far above rounding: overflow, or cancellation in a reduction. Every
other node makes about the type's unit roundoff (2^-11 for fp16) on exact inputs, a little more where it
sums many terms. So the floor is the model with every node above rounding level kept in fp32 and the rest
reduced: one probe (none when no node is above it: that is the compare stage's reduced run). When the
floor passes, the check can be met and the search finds the culprits. When it fails, the search's first
guess is probed too, the most suspect node alone in fp32: a check that fails by an element or two may be
met by luck that way (a recognizer at rtol 1e-2). When both fail, what is left is rounding noise: one
warning line says so and suggests the tolerances the floor meets, each one a check that can still fail
(never `ntol: 1` alone, which passes anything): the floor's mismatch fraction as `ntol` while that is below
1, else its largest absolute error as `atol`, and its cosine as a bound beside `ntol: 1`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.strategy import Configuration

log = logging.getLogger("accubisect")

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
ROUNDING_LEVEL = 10  # a node whose local error is within 10 unit roundoffs makes rounding error, no more
CHOOSING = "docs/precision.md, 'Choosing a check for fp16'"


def above_rounding(ranking: Sequence[Mapping[str, Any]], dtype: str) -> list[str]:
    """Nodes whose own error is more than rounding: beyond the level, overflowing, or not measured."""
    limit = ROUNDING_LEVEL * UNIT_ROUNDOFF[dtype]
    return [entry["name"] for entry in ranking
            if entry["local_error"] is None or entry["local_error"] > limit or entry["overflow"] > 0]


def measure_floor(ranking: Sequence[Mapping[str, Any]], dtype: str, check: AccuracyCheck,
                  probe: Callable[[Configuration], Mapping[str, Any]], reduced_verdict: Mapping[str, Any],
                  key_of: Callable[[Configuration], str]) -> dict[str, Any]:
    """The floor's verdict, and the warning and suggestion when it and the guess fail. `probe(off)` judges a
    configuration, `key_of(off)` names its verdict file (so pruning the workspace keeps it), and
    `reduced_verdict` is the compare stage's verdict with every node reduced."""
    fp32 = above_rounding(ranking, dtype)  # the floor's configuration: these switched off, i.e. kept in fp32
    verdict = probe(frozenset(fp32)) if fp32 else reduced_verdict
    record = {"rounding_level": ROUNDING_LEVEL * UNIT_ROUNDOFF[dtype], "kept_fp32": fp32,
              "passed": verdict["passed"], "worst": verdict["worst"],
              "verdict": key_of(frozenset(fp32)) if fp32 else None, "suggestion": {}, "warning": None}
    guess = frozenset([ranking[0]["name"]])
    if not verdict["passed"] and not probe(guess)["passed"]:
        record["suggestion"] = suggest(verdict["worst"], check)
        record["warning"] = _warning(record, len(ranking), check, dtype)
        log.warning("%s", record["warning"])
    return record


def suggest(worst: Mapping[str, float], check: AccuracyCheck) -> dict[str, float]:
    """Tolerances the floor meets, measured: its mismatch fraction as `ntol` (below 1 only: `ntol: 1`
    passes any tensor), else its largest absolute error as `atol`; and its cosine (above -1: a bound of -1
    passes any tensor). Each rounded to one significant digit in the lenient direction. None for a
    val_func, whose check is the user's own."""
    if check.val_func or "mismatch" not in worst:
        return {}
    suggestion = {}
    ntol = _up_to_one_digit(worst["mismatch"]) if worst["mismatch"] > check.ntol else None
    if ntol is not None and ntol < 1.0:
        suggestion["ntol"] = ntol
    elif ntol is not None and math.isfinite(worst["max_abs"]):
        suggestion["atol"] = _up_to_one_digit(worst["max_abs"])
    if math.isfinite(worst["cosine"]) and worst["cosine"] < 1.0:
        cosine = round(1.0 - _up_to_one_digit(1.0 - worst["cosine"]), 12)
        if cosine > -1.0:
            suggestion["cosine"] = cosine
    return suggestion


def _up_to_one_digit(value: float) -> float:
    scale = 10.0 ** math.floor(math.log10(value))
    return math.ceil(round(value / scale, 9)) * scale


def _warning(record: Mapping[str, Any], candidates: int, check: AccuracyCheck, dtype: str) -> str:
    worst, fp32, suggestion = record["worst"], len(record["kept_fp32"]), record["suggestion"]
    metrics = (f"{worst['mismatch']:.2%} of elements outside rtol/atol, cosine {worst['cosine']:.6f}"
               if "mismatch" in worst else "no output metrics")
    options = []
    if "ntol" in suggestion:
        options.append(f"accuracy.ntol: {suggestion['ntol']:.6g}")
    if "atol" in suggestion:
        options.append(f"accuracy.atol: {suggestion['atol']:.6g}")
    if "cosine" in suggestion:
        options.append(f"accuracy.ntol: 1 with accuracy.cosine: {suggestion['cosine']:.12g}")
    remedy = ", or ".join([*options, "a val_func on the task's own metric"])
    level = f"local error above {record['rounding_level']:.2g}"
    floor = (f"no node makes more than rounding error ({level}), and with all {candidates} in {dtype} the model "
             f"fails it" if not fp32 else
             f"with the {fp32} node(s) that make more than rounding error ({level}) kept in fp32, the other "
             f"{candidates - fp32} in {dtype} still fail it")
    return (f"the accuracy check ({check.describe()}) is tighter than {dtype} reaches on this model: {floor} "
            f"({metrics}), "
            f"as with only the most suspect node in fp32; what is left is {dtype}'s rounding noise, so the search "
            f"would keep nearly every node in fp32. Use a "
            f"check {dtype} can meet: {remedy} ({CHOOSING}); bisect.max_probes bounds the search meanwhile")
