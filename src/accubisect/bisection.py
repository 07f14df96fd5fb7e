"""What every bisection shares: rounds of probes as Snakemake checkpoint jobs, verdict files, results.

A bisection switches candidates *off* — fusion rules switched off, or nodes kept in fp32 — and asks
the pure search strategy (`strategy.py`) which sets to probe. Each round's plan and each probe's verdict
is a JSON file; the fusion and precision bisections differ only in their candidates, their ranking, how a
probe builds its model, and the deployable answer they write.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from accubisect import ort_compile
from accubisect.accuracy import Tolerance, judge_outputs, load_val_func
from accubisect.dump import DumpReader
from accubisect.errors import AccubisectError
from accubisect.files import read_json, write_json
from accubisect.metrics import local_error
from accubisect.samples import load_arrays, load_golden
from accubisect.strategy import Answer, next_probes


class PreconditionError(AccubisectError):
    """The bisection cannot find an answer for this model and configuration."""


def collect_rounds(plan_of: Callable[[int], str]) -> list[str]:
    """Round plans 0, 1, ... up to the one that is done; `plan_of(r)` makes Snakemake run round r first."""
    plans = [plan_of(0)]
    while not read_json(plans[-1])["done"]:
        plans.append(plan_of(len(plans)))
    return plans


def rows_by(report: Mapping[str, Any], column: str, names: Sequence[str]) -> dict[str, list[Mapping[str, Any]]]:
    """A compare report's tensor rows for each of `names` in `column` ("rule" or "node"), in topological
    order: the evidence a bisection ranks its candidates by."""
    rows: dict[str, list[Mapping[str, Any]]] = {name: [] for name in names}
    for row in report["tensors"]:
        if row[column] in rows:
            rows[row[column]].append(row)
    return rows


def worst_local_error(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The largest error the rows' nodes make run alone; None where none was measured."""
    return max((local_error(row["local"]) for row in rows if row.get("local")), default=None)


def passes(sample_verdicts: Sequence[bool], min_pass_fraction: float) -> bool:
    return bool(sample_verdicts) and sum(sample_verdicts) / len(sample_verdicts) >= min_pass_fraction


def candidate_passes(report: Mapping[str, Any], min_pass_fraction: float, not_the_cause: str) -> bool:
    """The preconditions of a bisection, from its comparison: fails with `not_the_cause` when the reference
    already fails against the golden outputs; returns whether the candidate passes (nothing to bisect)."""
    reference = [v["reference"]["passed"] for v in report["verdicts"] if "reference" in v]
    if reference and not passes(reference, min_pass_fraction):
        raise PreconditionError(not_the_cause)
    return passes([v["candidate"]["passed"] for v in report["verdicts"]], min_pass_fraction)


def known_verdicts(nothing_off_passes: bool, verdict_files: Sequence[str]) -> dict[frozenset[str], bool]:
    """Configuration (candidates off) -> passed, from the compare stage (nothing off) and every probe so far."""
    known = {frozenset(): nothing_off_passes}
    for path in verdict_files:
        verdict = read_json(path)
        known[frozenset(verdict["off"])] = verdict["passed"]
    return known


def write_plan(plan: str, name: str, unit: str, round_index: int, ranking: Sequence[Mapping[str, Any]],
               known: Mapping[frozenset[str], bool], parallel: int) -> None:
    """Checkpoint job body: the next round's probes, or the answer, and one progress line."""
    candidates = [entry["name"] for entry in ranking]
    step = next_probes(candidates, known, parallel)
    if isinstance(step, Answer):
        body = {"done": True, "answer": {"status": step.status, "culprits": list(step.culprits),
                                         "groups": [list(g) for g in step.groups]}}
        print(f"{name}: done after {round_index} round(s), {len(known) - 1} probe(s)", flush=True)
    else:
        body = {"done": False, "probes": [sorted(config) for config in step.probes], "suspects": step.suspects}
        print(f"{name} round {round_index}: {len(step.probes)} probe(s), {step.suspects} suspect {unit}(s) "
              f"left of {len(candidates)}", flush=True)
    write_json(Path(plan), {"round": round_index, "candidates": candidates, "ranking": list(ranking), **body})


def judge_session(session, sample_inputs: Sequence[str], references: Sequence[str], output_names: Sequence[str],
                  accuracy: Mapping[str, Any]) -> dict[str, Any]:
    """Runs every sample through `session` and judges its outputs: `passed`, per-sample verdicts, `worst`."""
    tolerance, val_func = Tolerance.from_config(accuracy), load_val_func(accuracy.get("val_func"))
    samples = []
    for inputs, reference in zip(sample_inputs, references, strict=True):
        outputs = ort_compile.run_session(session, load_arrays(Path(inputs)), list(output_names))
        judged = judge_outputs(load_reference(Path(reference), output_names), outputs, tolerance, val_func)
        samples.append({"inputs": Path(inputs).name, **judged})
    passed = passes([s["passed"] for s in samples], accuracy["min_pass_fraction"])
    return {"passed": passed, "samples": samples, "worst": worst_outputs(samples)}


def judge_probe(session, sample_inputs: Sequence[str], references: Sequence[str], output_names: Sequence[str],
                accuracy: Mapping[str, Any], off: Sequence[str], verdict: str, start: float) -> None:
    """A probe's verdict file: what it switched off, how the samples fared, and how long it took."""
    judged = judge_session(session, sample_inputs, references, output_names, accuracy)
    write_json(Path(verdict), {"off": sorted(off), **judged, "seconds": round(time.perf_counter() - start, 3)})


def load_reference(path: Path, output_names: Sequence[str]) -> dict[str, np.ndarray]:
    """Golden outputs (.npz) or the model outputs held in a reference dump."""
    if path.suffix == ".npz":
        return load_golden(path)
    with DumpReader(path) as dump:
        return {name: dump.read_output(name) for name in output_names}


def worst_outputs(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    rows = [row for sample in samples for row in sample["outputs"].values() if "max_abs" in row]
    if not rows:
        return {}
    return {"max_abs": max(r["max_abs"] for r in rows), "max_rel": max(r["max_rel"] for r in rows),
            "cosine": min(r["cosine"] for r in rows), "mismatch": max(r["mismatch"] for r in rows)}


def probes_by_round(rounds: Sequence[Mapping[str, Any]], verdict_files: Sequence[str]) -> list[dict[str, Any]]:
    verdicts = {tuple(sorted(v["off"])): v for v in map(read_json, verdict_files)}
    probes = []
    for plan in rounds:
        for off in plan.get("probes", []):
            verdict = verdicts[tuple(off)]
            probes.append({"round": plan["round"], "off": off, "passed": verdict["passed"],
                           "samples_passed": [s["passed"] for s in verdict["samples"]], "worst": verdict["worst"],
                           "seconds": verdict["seconds"]})
    return probes


def final_verdict(culprits: Sequence[str], probes: Sequence[Mapping[str, Any]],
                  nothing_off: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict of the answer: its probe, or the compare stage's when nothing is switched off."""
    if not culprits:
        return {"off": [], **nothing_off}
    (probe,) = [p for p in probes if sorted(p["off"]) == sorted(culprits)]
    return {key: probe[key] for key in ("off", "passed", "samples_passed", "worst")}


def compare_verdict(report: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate's verdict in a compare report, shaped like a probe's."""
    return {"passed": report["passed"], "worst": worst_outputs([v["candidate"] for v in report["verdicts"]])}
