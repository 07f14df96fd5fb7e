"""The workflow's stages against what a plain script pays for the same work, side by side in one run (issue 22
item 7, restating issue 12's targets).

    .venv/bin/python bench/stages.py [--cases ppocr_det,ppocr_rec,large] [--repeat 2] [--keep DIR]

Per case (the PP-OCRv4 detector and recognizer of `tests/corpus.py`, with their samples; `large`,
bench/large_model.py's 1.07 GB transformer with external data, generated once and cached; also `example`, the
bundled example, and `ppocr_det640`, the detector on one 640x640 sample, the size issue 12's users measured),
best of `--repeat`:

- workflow: `snakemake compare --cores 2` in a fresh copy of the workflow (as the tests make one) with an
  empty workspace, against the *plain script* `baseline_dump` below, run as its own process, plus Snakemake's
  nothing-to-do time (the same command again once the workflow is done: reading the config, building the
  DAG, finding every output up to date): ORT compiles the model with fusion off (ORT_DISABLE_ALL) and on
  (ORT_ENABLE_ALL, the case's session config), saving the graph it runs; each saved graph gets every node
  output as a graph output and runs the same samples with ORT's defaults; h5py writes every tensor, one
  dataset each. Target: workflow <= 2 x (plain script + nothing to do).
- compare: the workflow's compare job run again on the dumps it read (Snakemake's own job script, kept
  with --skip-script-cleanup, in a new process), against the *plain pass* `plain_compare`, also its own
  process: h5py reads each tensor both dumps hold, numpy computes the report's columns (`METRICS`: cosine,
  max/mean abs, max rel, rmse, relative euclidean, KL, SQNR, mismatch, NaN/Inf counts, fp16 overflow and
  underflow fractions, min and max of each side) in float64, whole-tensor expressions. Both run with the one
  BLAS thread Snakemake gives a job of one thread. Target: at most 1.5x.
- memory (issue 22 item 2): every job's peak RSS (the larger of Snakemake's samples and the high-water mark
  `resources.HOOK` writes beside its log) <= base + 1.5 x model size + 7 x largest tensor pair, where base is
  the job's RSS after its imports: its own job script (kept with --skip-script-cleanup) run in a new process
  up to its last statement, then importing h5py, numpy, onnx and onnxruntime (the stages import them where
  they use them). The row shows the job nearest its limit.

A model with external data is sized by its graph and data files (`model MB`), and the plain script's saved
graphs write their own data files, as the workflow's compiled copies do.

Both sides of a ratio run in the same minute on the same machine, interleaved, and each side's best of the
repeats is kept, so the ratio holds while other work on the machine changes the absolute times. Per stage it
also prints the seconds Snakemake's benchmark files (`*.benchmark.tsv`) record for the best workflow run, the
sum over the stage's jobs, and every job over its memory limit. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

from accubisect.formats.model import load_graph, model_bytes
from accubisect.formats.paths import stage_root

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the corpus of real models, the workflow copier

from conftest import copy_workflow  # noqa: E402
from resources import HOOK, largest_pair  # noqa: E402

TARGETS = {"workflow": 2.0, "compare": 1.5, "memory": 1.0}
# appended to a job script cut before its last statement: the libraries the library imports where it uses them,
# then the job's log file and its RSS, MiB
REPORT_FLOOR = ("\nimport h5py, numpy, onnx, onnxruntime\nprint(snakemake.log[0], next(int(line.split()[1]) for line "
                "in open('/proc/self/status') if line.startswith('VmRSS:')) / 1024)")
# What Snakemake sets for a job of one thread (snakemake/shell.py): the compare job, and the plain pass
# beside it, run with one BLAS thread. Left to its default, OpenBLAS starts a thread per core for every
# dot product, and on a machine whose cores are busy that made the same comparison several times slower.
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}


def baseline_dump(model: str, session_config: dict[str, str], samples: list[str], out: str) -> None:
    """The plain script: compile both variants, expose every node output, run the samples, write with h5py."""
    import h5py
    import numpy as np
    import onnx
    import onnxruntime as ort

    external = any(t.data_location == onnx.TensorProto.EXTERNAL
                   for t in onnx.load(model, load_external_data=False).graph.initializer)
    levels = {"fusion_off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "fusion_on": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    for variant, level in levels.items():
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        for key, value in session_config.items():
            options.add_session_config_entry(key, value)
        options.optimized_model_filepath = f"{out}/{variant}.onnx"
        if external:  # the saved graph writes its own data file, as the workflow's compiled copies do
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                             f"{variant}.onnx.data")
        ort.InferenceSession(model, options)
        compiled = onnx.load(f"{out}/{variant}.onnx", load_external_data=False)  # over 2 GB it cannot be bytes
        names = [name for node in compiled.graph.node for name in node.output if name]
        present = {value.name for value in compiled.graph.output}
        compiled.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names if name not in present)
        plain = ort.SessionOptions()
        plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        plain.add_session_config_entry("session.model_external_initializers_file_folder_path", out)
        session = ort.InferenceSession(compiled.SerializeToString(), plain)
        for index, sample in enumerate(samples):
            feeds = dict(np.load(sample))
            with h5py.File(f"{out}/{variant}_{index}.h5", "w") as dump:
                for name, array in zip(names, session.run(names, feeds), strict=True):
                    dump.create_dataset(name.replace("/", "|"), data=array)


def plain_compare(pairs: list[tuple[str, str]], rtol: float = 1e-3, atol: float = 1e-4) -> None:
    """The plain pass: the compare report's columns (`core.metrics.METRICS`) of every tensor both dumps of a
    sample hold, each a whole-tensor numpy expression in float64, as one would write them."""
    import h5py
    import numpy as np

    results = {}
    for ref_path, cand_path in pairs:
        with h5py.File(ref_path, "r") as ref, h5py.File(cand_path, "r") as cand, np.errstate(all="ignore"):
            for name in [name for name in cand["tensors"] if name in ref["tensors"]]:
                r = ref["tensors"][name][()].astype(np.float64).ravel()
                c = cand["tensors"][name][()].astype(np.float64).ravel()
                results[name] = plain_columns(r, c, rtol, atol) if r.size else {}
    print(len(results))


def plain_columns(r, c, rtol: float, atol: float) -> dict[str, float]:
    """The compare report's columns of one non-empty tensor pair, plainly (fp16's range)."""
    import numpy as np

    error, magnitude_r, magnitude_c = np.abs(r - c), np.abs(r), np.abs(c)
    noise, signal = error @ error, r @ r  # numpy floats: a zero divides to inf or NaN, as the report's do
    p, q = magnitude_r / magnitude_r.sum(), np.maximum(magnitude_c / magnitude_c.sum(), 1e-12)
    present = p > 0
    columns = {"cosine": (r @ c) / (np.linalg.norm(r) * np.linalg.norm(c)), "max_abs": error.max(),
               "mean_abs": error.mean(), "max_rel": (error / np.maximum(magnitude_r, 1e-12)).max(),
               "rmse": np.sqrt(noise / r.size), "rel_euclidean": np.sqrt(noise / signal),
               "kl": p[present] @ np.log(p[present] / q[present]), "sqnr_db": 10 * np.log10(signal / noise),
               "mismatch": np.mean(error > atol + rtol * magnitude_r)}
    for side, values, magnitude in (("ref", r, magnitude_r), ("cand", c, magnitude_c)):
        columns |= {f"nan_{side}": np.isnan(values).sum(), f"inf_{side}": np.isinf(values).sum(),
                    f"overflow_{side}": np.mean(magnitude >= 65504.0),
                    f"underflow_{side}": np.mean((magnitude < 2.0**-14) & (magnitude > 0)),
                    f"min_{side}": values.min(), f"max_{side}": values.max()}
    return columns


def case_configs(folder: Path, names: list[str]) -> dict[str, dict]:
    """The workflow config of each case (paths absolute, so any copy of the workflow can use it)."""
    import numpy as np
    from corpus import CORPUS

    configs = {}
    for name in names:
        if name == "example":
            config = yaml.safe_load((REPO / "examples/config.yaml").read_text())
            config.update(model=str(REPO / config["model"]), samples=str(REPO / config["samples"]))
        elif name == "large":  # its config.yaml names its files by absolute paths
            from large_model import large_model

            config = yaml.safe_load(large_model().config.read_text())
        elif name == "ppocr_det640":  # the detector at the size it is deployed at: ~1.4 GB of dump per variant
            model = CORPUS["ppocr_det"]
            samples = folder / name / "samples"
            samples.mkdir(parents=True, exist_ok=True)
            x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 640, 640)).astype(np.float32)
            np.savez(samples / "sample0_inputs.npz", x=x)
            config = {"model": str(model.model_path()), "samples": str(samples), **model.fusion_config}
        else:
            model = CORPUS[name]
            config = {"model": str(model.model_path()), "samples": str(model.write_samples(folder / name / "samples")),
                      **model.fusion_config}
        configs[name] = {**config, "workspace": "workspace", "results": "results"}
    return configs


def timed(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False,
                            env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {cwd}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return seconds


def run_workflow(workflow: Path, env: dict[str, str]) -> tuple[float, float]:
    """Seconds of `snakemake compare --cores 2` from an empty workspace, and of the same command again, with
    nothing left to do."""
    for leftover in ("workspace", "results", ".snakemake"):
        shutil.rmtree(workflow / leftover, ignore_errors=True)
    command = [sys.executable, "-m", "snakemake", "compare", "--cores", "2", "--configfile", "bench.yaml",
               "--skip-script-cleanup"]
    return timed(command, workflow, env), timed(command, workflow, env)


def stage_seconds(workflow: Path) -> dict[str, float]:
    """Seconds per stage, summed over its jobs, from the benchmark files of the last run."""
    seconds: dict[str, float] = defaultdict(float)
    for path in (workflow / "workspace").rglob("*.benchmark.tsv"):
        with path.open() as handle:
            row = next(csv.DictReader(handle, delimiter="\t"))
        seconds[path.name.removesuffix(".benchmark.tsv")] += float(row["s"])
    return dict(seconds)


def dump_pairs(workflow: Path) -> list[tuple[str, str]]:
    """(fusion-off dump, fusion-on dump) per sample, from the dumps' own attributes."""
    import h5py

    by_sample: dict[str, dict[str, str]] = defaultdict(dict)
    for path in stage_root(workflow / "workspace", "dump").glob("*/dump.h5"):
        with h5py.File(path, "r") as dump:
            by_sample[str(dump.attrs["sample"])][str(dump.attrs["variant"])] = str(path)
    return [(pair["fusion_off"], pair["fusion_on"]) for _, pair in sorted(by_sample.items())]


def compare_job(workflow: Path) -> list[str]:
    """The compare job's own script, as Snakemake ran it."""
    scripts = sorted((workflow / ".snakemake" / "scripts").glob("*compare_dumps.py"))
    return [sys.executable, str(scripts[-1])]


def job_peaks(workflow: Path) -> dict[Path, float]:
    """Log file -> its job's peak RSS in the last run, MiB: the larger of Snakemake's samples (the benchmark
    file beside the log) and the high-water mark `resources.HOOK` wrote there."""
    peaks: dict[Path, float] = {}
    for path in (workflow / "workspace").rglob("*.benchmark.tsv"):
        with path.open() as handle:
            sampled = next(csv.DictReader(handle, delimiter="\t"))["max_rss"]
        log = path.with_name(path.name.removesuffix(".benchmark.tsv") + ".log")
        hook = log.with_name(log.name + ".peak")
        peaks[log] = max(float(sampled) if sampled not in ("", "NA", "-") else 0.0,
                         float(hook.read_text()) if hook.exists() else 0.0)
    return peaks


def import_floors(workflow: Path) -> dict[Path, float]:
    """Log file -> its job's RSS after the job's imports, MiB (issue 22 item 2's base): each job script of the
    last run (kept by --skip-script-cleanup), run in a new process up to its last statement, `run_step(...)`,
    and then importing the libraries the stages import only where they use them (`REPORT_FLOOR`)."""
    floors: dict[Path, float] = {}
    for script in list((workflow / ".snakemake" / "scripts").glob("*.py")):
        text = script.read_text()
        cut = script.with_name(f"floor_{script.name}")  # a file: the preamble reads its own __file__
        cut.write_text(text[:text.rindex("\nrun_step(")] + REPORT_FLOOR)
        result = subprocess.run([sys.executable, str(cut)], cwd=workflow, capture_output=True, text=True, check=True)
        cut.unlink()
        log, rss = result.stdout.split()[-2:]
        floors[workflow / log] = float(rss)
    return floors


def memory(workflow: Path, peaks: dict[Path, float], model_mb: float) -> list[tuple[str, float, float]]:
    """(job, peak, limit) MiB of every job, highest peak / limit first; limit = its import floor + 1.5 x the
    model + 7 x the largest tensor pair any dump holds (a job without a script of its own: the highest
    floor)."""
    floors, pair = import_floors(workflow), largest_pair(workflow)
    rows = [(str(log.relative_to(workflow / "workspace").parent / log.stem), peak,
             floors.get(log, max(floors.values())) + 1.5 * model_mb + 7 * pair) for log, peak in peaks.items()]
    return sorted(rows, key=lambda row: -row[1] / row[2])


def measure(folder: Path, name: str, config: dict, repeat: int) -> dict[str, float | dict | list]:
    workflow = copy_workflow(folder / f"workflow-{name}")
    (workflow / "bench.yaml").write_text(yaml.safe_dump(config))
    (folder / "hook").mkdir(exist_ok=True)
    (folder / "hook" / "sitecustomize.py").write_text(HOOK)
    hooked = {"PYTHONPATH": os.pathsep.join([str(folder / "hook"), os.environ.get("PYTHONPATH", "")])}
    samples = sorted(str(path) for path in Path(config["samples"]).glob("sample*_inputs.npz"))
    session_config = {k: str(v) for k, v in config.get("compile", {}).get("session_config", {}).items()}
    me = [sys.executable, str(Path(__file__).resolve())]
    best: dict[str, float] = defaultdict(lambda: float("inf"))
    stages: dict[str, float] = {}
    peaks: dict[Path, float] = {}
    for _ in range(repeat):
        out = folder / f"baseline-{name}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        best["baseline"] = min(best["baseline"], timed([*me, "--baseline-dump", config["model"], yaml.safe_dump(
            session_config), str(out), *samples], workflow))
        shutil.rmtree(out)  # the large case's copies take 2 GB
        seconds, idle = run_workflow(workflow, hooked)
        best["nothing_to_do"] = min(best["nothing_to_do"], idle)
        if seconds < best["workflow"]:
            best["workflow"], stages = seconds, stage_seconds(workflow)
        for log, peak in job_peaks(workflow).items():  # stage keys repeat across runs; the lowest peak
            peaks[log] = min(peaks.get(log, peak), peak)
        pairs = [path for pair in dump_pairs(workflow) for path in pair]
        best["plain_compare"] = min(best["plain_compare"], timed([*me, "--plain-compare", *pairs], workflow,
                                                                 ONE_THREAD))
        best["compare"] = min(best["compare"], timed(compare_job(workflow), workflow, ONE_THREAD))
    model = Path(config["model"])
    model_mb = model_bytes(load_graph(model)) / 2**20  # as the plan sizes it
    return {**best, "stages": stages, "model_mb": model_mb, "memory": memory(workflow, peaks, model_mb)}


def checks(best: dict) -> list[tuple[str, str, str, float]]:
    """(check, measured, baseline, ratio) of one case, in the order `TARGETS` lists them. The workflow is
    allowed 2 x the plain script plus Snakemake's nothing-to-do time: its ratio is (workflow - nothing to do)
    / plain script; memory's is the peak over the limit of the job nearest its limit."""
    job, peak, limit = best["memory"][0]
    return [("workflow", f"{best['workflow']:.2f}-{best['nothing_to_do']:.2f} s", f"{best['baseline']:.2f} s",
             (best["workflow"] - best["nothing_to_do"]) / best["baseline"]),
            ("compare", f"{best['compare']:.2f} s", f"{best['plain_compare']:.2f} s",
             best["compare"] / best["plain_compare"]),
            ("memory", f"{peak:.0f} MiB {job}", f"{limit:.0f} MiB", peak / limit)]


def report(results: dict[str, dict]) -> bool:
    """Prints one row per case and check, PASS or MISS against `TARGETS`; whether every check passed."""
    print(f"{'case':<12} {'model MB':>9}  {'check':<8} {'measured':>30} {'baseline':>14} {'ratio':>6} {'target':>7}")
    met = True
    for name, best in results.items():
        for check, measured, baseline, ratio in checks(best):
            passed = ratio <= TARGETS[check]
            met &= passed
            print(f"{name:<12} {best['model_mb']:>9.1f}  {check:<8} {measured:>30} {baseline:>14} {ratio:>6.2f} "
                  f"{'<=' + str(TARGETS[check]):>7}  {'PASS' if passed else 'MISS'}")
    print("\nworkflow: its wall time less Snakemake's nothing-to-do run, over the plain script's; memory: the job "
          "nearest its limit, its import floor + 1.5 x model + 7 x largest tensor pair")
    print("\njob seconds per stage (Snakemake benchmark files, summed over jobs, best workflow run)")
    for name, best in results.items():
        print(f"{name:<12} " + "  ".join(f"{stage} {seconds:.2f}" for stage, seconds in sorted(best["stages"].items())))
    print("\njobs over their memory limit (peak/limit MiB)")
    for name, best in results.items():
        over = [f"{job} {peak:.0f}/{limit:.0f}" for job, peak, limit in best["memory"] if peak > limit]
        print(f"{name:<12} {', '.join(over) or 'none'}")
    return met


def main() -> int:
    if sys.argv[1:2] == ["--baseline-dump"]:
        model, session_config, out, *samples = sys.argv[2:]
        baseline_dump(model, yaml.safe_load(session_config), samples, out)
        return 0
    if sys.argv[1:2] == ["--plain-compare"]:
        paths = sys.argv[2:]
        plain_compare(list(zip(paths[::2], paths[1::2], strict=True)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="ppocr_det,ppocr_rec,large")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    arguments = parser.parse_args()
    folder = arguments.keep or Path(tempfile.mkdtemp(prefix="accubisect-stages-"))
    try:
        configs = case_configs(folder, arguments.cases.split(","))
        results = {name: measure(folder, name, config, arguments.repeat) for name, config in configs.items()}
    finally:
        if arguments.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
