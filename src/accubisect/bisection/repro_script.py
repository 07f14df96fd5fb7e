"""The text of the repro.py that `snakemake reduce` writes beside the reduced model (`reduce.py`).

It is a program of its own, run by whoever gets the folder: for a fusion candidate it needs only numpy and
onnxruntime; a precision candidate lowers the nodes with accubisect's own emulation (or finalization on a
GPU), so there it imports accubisect. It reads candidate.json (how the candidate was compiled, the
tolerances), inputs/ and expected/ beside it.
"""

REPRO = '''\
"""A minimal failing subgraph, written by accubisect (`snakemake reduce`).

    python repro.py                                   exits 1 while the bug is there
    python repro.py --fusion-switch fusion_switch.cfg  with fusion_bisect's answer applied (fusion)
    python repro.py --keep-dtype keep_dtype.txt        with precision_bisect's answer applied (precision)

model.onnx is part of the original model; it is compiled as the failing candidate was (candidate.json:
ONNX Runtime level, session config entries, rules switched off, reduced-precision nodes), run on every
inputs/sample*.npz (the reference's own tensors at its boundary) and judged against expected/sample*.npz
(the reference, fusion off in fp32) with the run's tolerances. Exit status: 0 passes, 1 fails, 2 bad usage.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
LEVELS = {"off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def refuse(message):
    """Bad usage: exit status 2, as argparse exits, never 1 (which says the bug is there)."""
    print(message, file=sys.stderr)
    sys.exit(2)


def rules_off(path, rules):
    """The rules a fusion_switch.cfg switches off ("ALL": "off" a whole section, names "on" beside it)."""
    try:
        switch = json.loads(Path(path).read_text())["Switch"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        refuse(f"{path}: not a fusion switch file ({error})")
    off = set()
    for section, states in switch.items():
        if states.get("ALL") == "off":
            off |= {rule for rule, about in rules.items() if about["section"] == section}
        off |= {name for name, state in states.items() if name != "ALL" and state == "off"}
        off -= {name for name, state in states.items() if state == "on"}
    unknown = sorted(off - set(rules))
    if unknown:
        refuse(f"{path}: unknown fusion rule(s) {unknown} for this ONNX Runtime")
    return off


def kept_names(path):
    try:
        return {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
    except OSError as error:
        refuse(f"{path}: cannot read it ({error})")


def model_bytes(spec, args):
    """The model as the candidate compiles it, and the ORT optimizer names switched off."""
    disabled = set(spec["disabled_optimizers"])
    if spec["kind"] == "fusion":
        for rule in sorted(rules_off(args.fusion_switch, spec["rules"]) if args.fusion_switch else ()):
            disabled |= set(spec["rules"][rule]["optimizers"])
        return (HERE / "model.onnx").read_bytes(), disabled
    import onnx  # a precision candidate: its nodes are lowered as accubisect lowers them
    from accubisect.runtime.backends import backend_named

    low = set(spec["low"]) - (kept_names(args.keep_dtype) if args.keep_dtype else set())
    lowered = backend_named(spec["backend"]).reduced_model(onnx.load(str(HERE / "model.onnx")), low, spec["dtype"],
                                                             spec["dtypes"])
    return lowered.SerializeToString(), disabled


def failures(expected, got, tolerance):
    """Why `got` fails the check, as accubisect judges it; empty when it passes."""
    if expected.shape != got.shape:
        return [f"shapes differ: expected {list(expected.shape)}, got {list(got.shape)}"]
    ref, cand = expected.astype(np.float64), got.astype(np.float64)
    reasons = []
    new_nan = int(np.isnan(cand).sum()) - int(np.isnan(ref).sum())
    if new_nan > 0:
        reasons.append(f"{new_nan} new NaN")
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs(cand - ref)
        close = error <= tolerance["atol"] + tolerance["rtol"] * np.abs(ref)
        close &= np.isfinite(ref)
        close |= cand == ref
    mismatch = 1.0 - np.count_nonzero(close) / close.size if close.size else 0.0
    if mismatch > tolerance["ntol"]:
        worst = float(np.nanmax(error)) if error.size and not np.isnan(error).all() else float("nan")
        reasons.append(f"{mismatch:.2%} of elements outside rtol={tolerance['rtol']:g}, atol={tolerance['atol']:g} "
                       f"(max abs error {worst:.3g})")
    if tolerance["cosine"] is not None:
        similarity = cosine(ref, cand)
        if not similarity >= tolerance["cosine"]:
            reasons.append(f"cosine {similarity:.6g} < {tolerance['cosine']:g}")
    return reasons


def cosine(ref, cand):
    if ref.size == 0 or np.array_equal(ref, cand):
        return 1.0
    if not (np.isfinite(ref).all() and np.isfinite(cand).all()):
        return float("nan")
    norms = float(np.linalg.norm(ref)) * float(np.linalg.norm(cand))
    return 0.0 if norms == 0 else float(np.dot(ref.ravel(), cand.ravel())) / norms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fusion-switch", help="a fusion_switch.cfg to apply (a fusion candidate)")
    parser.add_argument("--keep-dtype", help="a keep_dtype.txt of nodes kept in fp32 (a precision candidate)")
    args = parser.parse_args()
    spec = json.loads((HERE / "candidate.json").read_text())
    wrong = "--keep-dtype" if spec["kind"] == "fusion" and args.keep_dtype else (
        "--fusion-switch" if spec["kind"] == "precision" and args.fusion_switch else None)
    if wrong:
        parser.error(f"{wrong} does not apply: this repro reduces a {spec['kind']} candidate")
    data, disabled = model_bytes(spec, args)
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[spec["level"]]
    options.log_severity_level = 3
    for key, value in sorted(spec["session_config"].items()):
        options.add_session_config_entry(key, str(value))
    if "CUDAExecutionProvider" in spec["providers"] and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    session = ort.InferenceSession(data, options, providers=spec["providers"], disabled_optimizers=sorted(disabled))
    outputs = [output.name for output in session.get_outputs()]
    verdicts = []
    for sample in spec["samples"]:
        with np.load(HERE / "inputs" / f"{sample}.npz", allow_pickle=False) as archive:
            feeds = {name: archive[name] for name in archive.files}
        with np.load(HERE / "expected" / f"{sample}.npz", allow_pickle=False) as archive:
            expected = {name: archive[name] for name in archive.files}
        got = dict(zip(outputs, session.run(outputs, feeds)))
        reasons = [f"{name}: {reason}" for name in outputs for reason in failures(expected[name], got[name],
                                                                                spec["tolerance"])]
        verdicts.append(not reasons)
        print(f"{sample}: " + ("passes" if not reasons else "FAILS: " + "; ".join(reasons)))
    passed = sum(verdicts) / len(verdicts) >= spec["min_pass_fraction"]
    print(f"{sum(verdicts)} of {len(verdicts)} samples pass: " + ("the subgraph passes" if passed else
                                                                   "the bug is there"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
'''
