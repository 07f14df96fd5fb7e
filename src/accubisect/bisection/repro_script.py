"""The text of the repro.py that `snakemake reduce` writes beside the repro model (`reduce.py`).

It is a program of its own, run by whoever gets the folder: for a fusion candidate it needs only numpy and
onnxruntime; a precision candidate lowers the nodes with accubisect's own emulation (or finalization on a
GPU), so there it imports accubisect. It reads candidate.json (how the candidate was compiled, and the
accuracy check the probes used, `AccuracyCheck.to_config()`), inputs/ and expected/ beside it.

Its exit status 1 says "the bug is there", so anything wrong with its own files (a missing or truncated
file, an archive without the model's names, a malformed switch file, a keep_dtype list naming no node of
the model, accubisect missing for a precision repro) is exit status 2 with one line naming the file, as
argparse exits on bad usage: never a traceback read as the bug.
"""

from accubisect.formats.candidate_spec import CANDIDATE_FORMAT

REPRO = '''\
"""A minimal failing subgraph, written by accubisect (`snakemake reduce`).

    python repro.py                                   exits 1 while the bug is there
    python repro.py --fusion-switch fusion_switch.cfg  with fusion_bisect's answer applied (fusion)
    python repro.py --keep-dtype keep_dtype.txt        with precision_bisect's answer applied (precision)

model.onnx is part of the original model; it is compiled as the failing candidate was (candidate.json:
ONNX Runtime level, session config entries, rules switched off, reduced-precision nodes), run on every
inputs/sample*.npz (the reference's own tensors at its boundary) and judged against expected/sample*.npz
(the reference, fusion off in fp32) with the run's check. Exit status: 0 passes, 1 fails, 2 bad usage or a
broken file of the repro's own.
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
FORMAT = CANDIDATE_FORMAT  # of candidate.json


def refuse(message):
    """Bad usage or a broken file: exit status 2, as argparse exits, never 1 (which says the bug is there)."""
    print(f"accubisect: {message}", file=sys.stderr)
    sys.exit(2)


def read_spec():
    path = HERE / "candidate.json"
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        refuse(f"{path}: cannot read it ({error}); run snakemake reduce again to rewrite the repro")
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        refuse(f"{path}: not a candidate.json of format {FORMAT}; run snakemake reduce again to rewrite the repro")
    return spec


def arrays(path, names, what):
    """An .npz archive's arrays by `names`, refused in one line when unreadable or without one of them."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            found = {name: archive[name] for name in archive.files}
    except Exception as error:  # OSError, BadZipFile, ValueError, EOFError: a missing or damaged archive
        refuse(f"{path}: cannot read it ({type(error).__name__}: {error}); run snakemake reduce again to rewrite it")
    missing = sorted(set(names) - set(found))
    if missing:
        refuse(f"{path}: has no {what} {missing} (it holds {sorted(found)}); run snakemake reduce again to rewrite it")
    return {name: found[name] for name in names}


def rules_off(path, rules):
    """The rules a fusion_switch.cfg switches off ("ALL": "off" a whole section, names "on" beside it)."""
    try:
        switch = json.loads(Path(path).read_text())["Switch"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        refuse(f"{path}: not a fusion switch file ({type(error).__name__}: {error})")
    if not isinstance(switch, dict) or not all(isinstance(states, dict) and all(
            isinstance(state, str) for state in states.values()) for states in switch.values()):
        refuse(f'{path}: not a fusion switch file: "Switch" maps each section to {{rule: "on" | "off"}}')
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


def kept_names(path, model):
    """The names a keep_dtype.txt keeps in fp32; refused when it names no node of `model` (it would apply
    nothing, and the repro would say the answer does not fix it)."""
    try:
        names = {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
    except (OSError, UnicodeDecodeError) as error:
        refuse(f"{path}: cannot read it ({error})")
    nodes = sorted(node.name for node in model.graph.node)
    if not names & set(nodes):
        refuse(f"{path}: names none of the {len(nodes)} node(s) of model.onnx ({', '.join(nodes[:5])}"
               f"{', ...' if len(nodes) > 5 else ''}); give the keep_dtype.txt of the precision_bisect this repro "
               "was cut from")
    return names


def model_bytes(spec, args):
    """The model as the candidate compiles it, and the ORT optimizer names switched off."""
    disabled = set(spec["disabled_optimizers"])
    if spec["kind"] == "fusion":
        for rule in sorted(rules_off(args.fusion_switch, spec["rules"]) if args.fusion_switch else ()):
            disabled |= set(spec["rules"][rule]["optimizers"])
        return model_file(), disabled
    try:  # a precision candidate: its nodes are lowered as accubisect lowers them
        import onnx
        from accubisect.runtime.backends import backend_named
    except ImportError as error:
        refuse(f"a precision repro lowers its nodes with accubisect, which cannot be imported here ({error}); "
               "install accubisect (and onnx) in this Python")
    try:
        model = onnx.load_from_string(model_file())
    except Exception as error:  # onnx's DecodeError: a damaged file
        refuse(f"{HERE / 'model.onnx'}: not an ONNX model ({type(error).__name__}); run snakemake reduce again")
    low = set(spec["low"]) - (kept_names(args.keep_dtype, model) if args.keep_dtype else set())
    lowered = backend_named(spec["backend"]).reduced_model(model, low, spec["dtype"], spec["dtypes"])
    return lowered.SerializeToString(), disabled


def model_file():
    try:
        return (HERE / "model.onnx").read_bytes()
    except OSError as error:
        refuse(f"{HERE / 'model.onnx'}: cannot read it ({error}); run snakemake reduce again to rewrite it")


def session_of(spec, data, disabled):
    """The candidate's ONNX Runtime session; a model ONNX Runtime cannot load is refused in one line."""
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[spec["level"]]
    options.log_severity_level = 3
    for key, value in sorted(spec["session_config"].items()):
        options.add_session_config_entry(key, str(value))
    if "CUDAExecutionProvider" in spec["providers"] and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    try:
        return ort.InferenceSession(data, options, providers=spec["providers"], disabled_optimizers=sorted(disabled))
    except Exception as error:  # ONNX Runtime's own exception types: a damaged or foreign model
        refuse(f"{HERE / 'model.onnx'}: ONNX Runtime cannot load it ({' '.join(str(error).split())[:200]}); "
               "run snakemake reduce again to rewrite it")


def failures(expected, got, tolerance):
    """Why `got` fails the check's tolerances, as accubisect judges them; empty when it passes."""
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
    spec = read_spec()
    wrong = "--keep-dtype" if spec["kind"] == "fusion" and args.keep_dtype else (
        "--fusion-switch" if spec["kind"] == "precision" and args.fusion_switch else None)
    if wrong:
        refuse(f"{wrong} does not apply: this repro reduces a {spec['kind']} candidate")
    session = session_of(spec, *model_bytes(spec, args))
    inputs = [item.name for item in session.get_inputs()]
    outputs = [item.name for item in session.get_outputs()]
    check = spec["check"]
    verdicts = []
    for sample in spec["samples"]:
        feeds = arrays(HERE / "inputs" / f"{sample}.npz", inputs, "input")
        expected = arrays(HERE / "expected" / f"{sample}.npz", outputs, "output")
        try:
            got = dict(zip(outputs, session.run(outputs, feeds)))
        except Exception as error:  # ONNX Runtime's: an input of the wrong type or shape
            refuse(f"{HERE / 'inputs' / (sample + '.npz')}: ONNX Runtime cannot run on it "
                   f"({' '.join(str(error).split())[:200]}); run snakemake reduce again to rewrite it")
        reasons = [f"{name}: {reason}" for name in outputs for reason in failures(expected[name], got[name], check)]
        verdicts.append(not reasons)
        print(f"{sample}: " + ("passes" if not reasons else "FAILS: " + "; ".join(reasons)))
    passed = bool(verdicts) and sum(verdicts) >= check["min_pass_fraction"] * len(verdicts)  # AccuracyCheck.passes
    print(f"{sum(verdicts)} of {len(verdicts)} samples pass (min pass fraction {check['min_pass_fraction']:g}): "
          + ("the subgraph passes" if passed else "the bug is there"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
'''.replace("CANDIDATE_FORMAT", str(CANDIDATE_FORMAT))
