"""OpenVINO's real bf16 kernels beside ONNX Runtime's bf16 emulation on the same models, in one run (issue 24
item 7): what a compile, a precision probe and the workflow's stages cost on each backend.

    .venv/bin/python bench/backends.py [--cases example,magika,...,yolov8n] [--repeat 3] [--keep DIR]

Cases: the corpus models (`tests/corpus.py`: magika, ppocr_det, ppocr_rec, yolov8n, minilm, deepcut; silero_vad
is skipped with OpenVINO's own reason, it cannot read that export) and the bundled examples (`example`, the
transformer of examples/config.yaml; `precision`, the extractor of examples/precision/config.yaml). The default
is every case but yolov8n, whose two precision searches take minutes: about 2 minutes on 2 cores. Per case and
backend (`ort-cpu`: bf16 storage emulation; `openvino-cpu`: the plugin's bf16 hint; one thread both):

- compile: one compile of the model for the reduced type, best of `--repeat`: ORT a session at level all,
  OpenVINO `read_model` + `compile_model` with `INFERENCE_PRECISION_HINT: bf16`.
- probe: one precision probe as each backend's precision search runs it, best of `--repeat`: ORT the
  workflow's compiled graph with its `assignment.json` applied (nothing kept in fp32) run as it is on every
  sample (`precision_bisect.PrecisionProbe` less its judge); OpenVINO the IR with no `precise` mark compiled
  with the hint and run on every sample (`openvino_keep.MarkedIR`, as the search's child process does). A
  probe the backend cannot run is printed as `-` and its one line below the table.
- the stages of `snakemake compare --cores 2` and then of `snakemake precision_bisect --cores 2` in a fresh
  copy of the workflow: the wall time, and each job's seconds from Snakemake's benchmark files as
  bench/stages.py reads them, summed per stage. A target that ends in one `ERROR accubisect:` line (e.g. no
  keep set passes on OpenVINO) is a result: its line is printed in place of its time.

Both backends run in the same minute, case after case, and each row prints OpenVINO / ORT. It is a report,
not a gate: exit 0 unless something fails to run (a traceback, a command that fails without its one line).
"""

from __future__ import annotations

import argparse
import copy
import csv
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from accubisect.core.errors import AccubisectError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the corpus of real models, the workflow copier

from conftest import copy_workflow  # noqa: E402
from corpus import CORPUS, FP16_REACHABLE  # noqa: E402

BACKENDS = ("ort-cpu", "openvino-cpu")
EXAMPLES = {"example": "examples/config.yaml", "precision": "examples/precision/config.yaml"}
CASES = (*EXAMPLES, *CORPUS)
DEFAULT_CASES = "example,precision,magika,ppocr_det,ppocr_rec,deepcut,minilm,silero_vad"  # yolov8n: minutes
DTYPE, HINT = "bf16", "bf16"
TARGETS = ("compare", "precision_bisect")


def case_config(name: str, folder: Path) -> dict:
    """The workflow config of a case in bf16, paths absolute: the corpus model's own settings, the bundled
    example's file; accuracy what a reduced type can reach (FP16_REACHABLE) unless the case says otherwise."""
    if name in EXAMPLES:
        config = yaml.safe_load((REPO / EXAMPLES[name]).read_text())
        config.update(model=str(REPO / config["model"]), samples=str(REPO / config["samples"]))
        config["accuracy"] = {**config.get("accuracy", {}), **FP16_REACHABLE}
    else:
        model = CORPUS[name]
        config = {"model": str(model.model_path()), "samples": str(model.write_samples(folder / name / "samples")),
                  **copy.deepcopy(model.fusion_config), **copy.deepcopy(model.precision_config)}
    config.pop("results", None)
    config["precision"] = {**config.get("precision", {}), "dtype": DTYPE}
    return {**config, "workspace": "workspace", "results": "results"}


def for_backend(config: dict, backend: str) -> dict:
    """`config` on `backend`; OpenVINO has no ORT session config (it is refused there, not ignored)."""
    config = {**copy.deepcopy(config), "backend": backend}
    if backend == "openvino-cpu":
        config.pop("compile", None)
    return config


def openvino_refusal(model: Path) -> str | None:
    """OpenVINO's one line where it cannot read `model`, else None."""
    from accubisect.core.errors import ModelError
    from accubisect.runtime.openvino_backend import read_openvino

    try:
        read_openvino(model)
    except ModelError as error:
        return str(error)
    return None


def best_of(repeat: int, action: Callable[[], object]) -> float:
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def samples_of(config: dict) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(path)) for path in sorted(Path(config["samples"]).glob("sample*_inputs.npz"))]


def ort_compile(model: Path) -> Callable[[], object]:
    """One session at level all, one thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 1, 3
    return lambda: ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def openvino_compile(model: Path) -> Callable[[], object]:
    """`read_model` and `compile_model` with the bf16 hint, one thread."""
    import openvino as ov

    core = ov.Core()
    return lambda: core.compile_model(core.read_model(str(model)), "CPU",
                                      {"INFERENCE_PRECISION_HINT": HINT, "INFERENCE_NUM_THREADS": 1})


def ort_probe(workflow: Path, config: dict) -> Callable[[], object]:
    """The precision search's probe on ORT (`precision_bisect.PrecisionProbe`, its judge aside): the
    workflow's compiled graph, read without its weights, with its assignment's nodes (nothing kept in fp32)
    rounded to the reduced type, run as it is on one thread on every sample."""
    from accubisect.formats.assignment import Assignment
    from accubisect.formats.model import load_compiled
    from accubisect.runtime import ort_compile
    from accubisect.runtime.backends import CPU
    from accubisect.workflow.plan import Plan

    plan = Plan.from_config({**config, "workspace": str(workflow / "workspace"),
                             "results": str(workflow / "results")})
    assignment = Assignment.read(plan.precision_dir() / "assignment.json")
    path = plan.compile_dir(plan.precision_base) / "model.onnx"
    compiled, feeds = load_compiled(path, load_weights=False), samples_of(config)

    def probe() -> None:
        reduced = CPU.reduced_model(compiled, set(assignment.reduced), assignment.dtype, assignment.dtypes,
                                    path.parent)
        runner = ort_compile.Runner(reduced.SerializeToString(), ort_compile.unoptimized(path.parent), CPU,
                                    1).activate()
        for inputs in feeds:
            runner.infer(inputs)

    return probe


def openvino_probe(model: Path, config: dict) -> Callable[[], object]:
    """The precision search's probe on OpenVINO: the IR with no mark compiled with the hint (and read back),
    run on every sample."""
    from accubisect.runtime.openvino_backend import run_outputs
    from accubisect.runtime.openvino_keep import MarkedIR

    ir, feeds = MarkedIR(model), samples_of(config)

    def probe() -> None:
        compiled = ir.compile({}, HINT, 1).compiled
        for inputs in feeds:
            run_outputs(compiled, inputs)

    return probe


def stage_seconds(workflow: Path, since: float) -> dict[str, float]:
    """Seconds per stage, summed over the jobs whose benchmark files were written after `since`."""
    seconds: dict[str, float] = defaultdict(float)
    for path in (workflow / "workspace").rglob("*.benchmark.tsv"):
        if path.stat().st_mtime >= since:
            with path.open() as handle:
                row = next(csv.DictReader(handle, delimiter="\t"))
            seconds[path.name.removesuffix(".benchmark.tsv")] += float(row["s"])
    return dict(seconds)


def run_target(workflow: Path, target: str) -> dict:
    """`snakemake <target> --cores 2`: wall seconds and stage seconds, or the one line it ended with."""
    since = time.time() - 1  # benchmark files' mtimes have a coarse clock on some file systems
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "snakemake", target, "--cores", "2", "--configfile", "bench.yaml"],
                            cwd=workflow, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    output = result.stdout + result.stderr
    if result.returncode == 0:
        return {"wall": wall, "stages": stage_seconds(workflow, since)}
    lines = [line for line in output.splitlines() if line.startswith("ERROR accubisect:")]
    if lines and "Traceback" not in output:
        return {"wall": wall, "stages": stage_seconds(workflow, since), "ended": lines[0]}
    raise SystemExit(f"snakemake {target} failed in {workflow}:\n{output[-4000:]}")


def measure(folder: Path, name: str, backend: str, config: dict, repeat: int) -> dict:
    workflow = copy_workflow(folder / f"{name}-{backend}")
    config = for_backend(config, backend)
    (workflow / "bench.yaml").write_text(yaml.safe_dump(config))
    model = Path(config["model"])
    targets = {target: run_target(workflow, target) for target in TARGETS}
    if backend == "ort-cpu":
        compiler, prober = ort_compile(model), lambda: ort_probe(workflow, config)
    else:
        compiler, prober = openvino_compile(model), lambda: openvino_probe(model, config)
    try:
        probe: dict = {"probe": best_of(repeat, prober())}
    except AccubisectError as error:
        probe = {"probe": None, "probe_failed": str(error)}
    return {"compile": best_of(repeat, compiler), **probe, **targets}


def cell(run: dict) -> str:
    return f"{run['wall']:.1f} s" if "ended" not in run else f"{run['wall']:.1f} s, no answer"


def ratio(ort: float, openvino: float) -> str:
    return f"{openvino / ort:.2f}x" if ort > 0 else "-"


def print_rows(name: str, by_backend: dict[str, dict]) -> None:
    """A case's rows of the table, printed as soon as it is measured: one per measure, ORT and OpenVINO side
    by side, OpenVINO / ORT."""
    ort, ov = by_backend["ort-cpu"], by_backend["openvino-cpu"]
    for measure_name in ("compile", "probe"):
        seconds = [by_backend[b][measure_name] for b in BACKENDS]
        shown = [f"{s:.3g}" if s is not None else "-" for s in seconds]
        both = ratio(*seconds) if None not in seconds else "-"
        print(f"{name:<10} {measure_name + ' (s)':<26} {shown[0]:>22} {shown[1]:>22} {both:>7}")
    for target in TARGETS:
        print(f"{name:<10} {target + ' wall':<26} {cell(ort[target]):>22} {cell(ov[target]):>22} "
              f"{ratio(ort[target]['wall'], ov[target]['wall']):>7}")
        for stage in sorted(set(ort[target]["stages"]) | set(ov[target]["stages"])):
            seconds = [by_backend[b][target]["stages"].get(stage) for b in BACKENDS]
            shown = [f"{s:.2f}" if s is not None else "-" for s in seconds]
            both = ratio(*seconds) if None not in seconds else "-"
            print(f"{'':<10} {'  ' + stage:<26} {shown[0]:>22} {shown[1]:>22} {both:>7}", flush=True)


def print_notes(results: dict[str, dict[str, dict]], skipped: dict[str, str]) -> None:
    """Below the table: the one line of each probe or target that gave no answer, and the skipped cases."""
    for name, by_backend in results.items():
        for backend, measured in by_backend.items():
            if measured["probe"] is None:
                print(f"{name} {backend} probe: {measured['probe_failed']}")
            for target in TARGETS:
                if "ended" in measured[target]:
                    print(f"{name} {backend} {target}: {measured[target]['ended']}")
    for name, reason in skipped.items():
        print(f"{name}: skipped: {reason}")
    print("\ncompile: one compile for bf16; probe: one precision probe (compile + every sample); stages: job seconds "
          "from Snakemake's benchmark files, summed per stage; ov/ort: OpenVINO over ORT, this run")


def parse(arguments: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help=f"comma-separated, of {', '.join(CASES)} (default {DEFAULT_CASES})")
    parser.add_argument("--repeat", type=int, default=3, help="compiles and probes timed, the best kept")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one)")
    parsed = parser.parse_args(arguments)
    parsed.cases = [name for name in parsed.cases.split(",") if name]
    unknown = [name for name in parsed.cases if name not in CASES]
    if unknown or not parsed.cases:
        parser.error(f"--cases: unknown {', '.join(unknown) or 'nothing given'}; choose from {', '.join(CASES)}")
    if parsed.repeat < 1:
        parser.error("--repeat: at least 1")
    return parsed


def main() -> None:
    arguments = parse()
    with tempfile.TemporaryDirectory() as temporary:
        folder = arguments.keep or Path(temporary)
        results: dict[str, dict[str, dict]] = {}
        skipped: dict[str, str] = {}
        print(f"{'case':<10} {'measure':<26} {'ort-cpu (emulated)':>22} {'openvino-cpu':>22} {'ov/ort':>7}")
        for name in arguments.cases:
            config = case_config(name, folder)
            refusal = openvino_refusal(Path(config["model"]))
            if refusal:
                skipped[name] = refusal
                continue
            start = time.perf_counter()
            results[name] = {backend: measure(folder, name, backend, config, arguments.repeat)
                             for backend in BACKENDS}
            print(f"{name}: measured in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
            print_rows(name, results[name])
        print_notes(results, skipped)


if __name__ == "__main__":
    main()
