"""Real compare reports for the report tests: a model compiled fusion-off and fusion-on, dumped on its samples,
its local errors measured and the two runs compared, through the library's stages (no Snakemake)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
from conftest import EXAMPLE_MODEL, EXAMPLE_SAMPLES, GELU_APPROXIMATION

from accubisect.formats.compare_report import CompareReport
from accubisect.formats.config import validate_config
from accubisect.stages.compare import CompareStep, compare_dumps
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.dump import DumpStep, dump_sample
from accubisect.stages.graph import GraphStep, write_graph
from accubisect.stages.local_error import LocalErrorsStep, local_errors

ACCURACY = validate_config({"model": "m", "samples": "s"})["accuracy"]


def compare_run(folder: Path, model: Path, samples: Sequence[Path], output_names: Sequence[str],
                session_config: Mapping[str, str] | None = None, accuracy: Mapping | None = None) -> CompareReport:
    """report.json of fusion_on (level all, `session_config`) against fusion_off on `samples` (inputs .npz)."""
    dumps: dict[str, list[Path]] = {}
    for variant, level in (("fusion_off", "off"), ("fusion_on", "all")):
        spec = {"name": variant, "level": level, "session_config": dict(session_config or {}), "rules_off": []}
        base = folder / variant
        compile_variant(CompileStep(model, spec, "ort-cpu", base / "model.onnx", base / "compile.json"))
        write_graph(GraphStep(model, base / "model.onnx", base / "compile.json", base / "graph.json"))
        dumps[variant] = []
        for index, inputs in enumerate(samples):
            dump = base / f"dump{index}.h5"
            dump_sample(DumpStep(model, base / "model.onnx", inputs, dump, variant, f"sample{index}", "ort-cpu",
                                 compile_record=base / "compile.json"))
            dumps[variant].append(dump)
    names = tuple(f"sample{i}" for i in range(len(samples)))
    local_errors(LocalErrorsStep(folder / "fusion_on" / "model.onnx", tuple(dumps["fusion_off"]), tuple(samples),
                                 "ort-cpu", folder / "local.json"))
    context = {"model": model.name, "samples": str(samples[0].parent), "sample_count": len(samples), "level": "all",
               "session_config": dict(session_config or {}), "fusion_switch": None, "backend": "ort-cpu"}
    compare_dumps(CompareStep(
        reference_dumps=tuple(dumps["fusion_off"]), candidate_dumps=tuple(dumps["fusion_on"]),
        golden=("",) * len(samples), samples=names, output_names=tuple(output_names),
        accuracy=accuracy or ACCURACY, low_precision="fp16", labels=("fusion_off", "fusion_on"),
        candidate_graph=folder / "fusion_on" / "graph.json", local_errors=folder / "local.json", context=context,
        report_json=folder / "report.json", report_csv=folder / "report.csv", report_html=folder / "report.html",
        summary=folder / "summary.txt"))
    return CompareReport.read(folder / "report.json")


def example_report(folder: Path) -> CompareReport:
    """The bundled example's fusion comparison on one sample: FastGelu (GeluApproximation) diverges first."""
    outputs = [output.name for output in onnx.load(EXAMPLE_MODEL).graph.output]
    return compare_run(folder, EXAMPLE_MODEL, [EXAMPLE_SAMPLES / "sample0_inputs.npz"], outputs, GELU_APPROXIMATION)
