"""The compare stage on real dumps of a small model: judging, re-judging, filters, statistics-only dumps."""

import math

import numpy as np
import pytest
from conftest import GELU_APPROXIMATION

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import ConfigError, DumpError, SampleError
from accubisect.formats.compare_report import CompareReport, LocalGrowth, TensorRow
from accubisect.formats.config import validate_config
from accubisect.formats.dump_file import SAMPLE_SIZE, DumpReader
from accubisect.formats.samples import Sample, select_samples
from accubisect.reports.run_context import context_line
from accubisect.stages.compare import CompareStep, compare_dumps, detail_tensors, judge_report
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.dump import DumpStep, dump_sample
from accubisect.stages.graph import GraphStep, write_graph
from accubisect.stages.local_error import LocalErrorsStep, local_errors

ACCURACY = validate_config({"model": "m", "samples": "s"})["accuracy"]
VARIANTS = {"fusion_off": ("off", {}), "fusion_on": ("all", GELU_APPROXIMATION)}
CONTEXT = {"model": "ffn.onnx", "samples": ".", "sample_count": 1, "level": "all",
           "session_config": GELU_APPROXIMATION, "fusion_switch": None, "backend": "ort-cpu"}


def build(folder, model, dump_options=None, samples=1):
    paths = {}
    for variant, (level, session_config) in VARIANTS.items():
        spec = {"name": variant, "level": level, "session_config": session_config, "rules_off": []}
        base = folder / variant
        compile_variant(CompileStep(model, spec, "ort-cpu", base / "model.onnx", base / "compile.json"))
        write_graph(GraphStep(model, base / "model.onnx", base / "compile.json", base / "graph.json"))
        paths[variant] = []
        for index in range(samples):
            inputs = folder / f"sample{index}_inputs.npz"
            if not inputs.exists():
                np.savez(inputs, x=np.random.default_rng(index).normal(0, 2, (1, 4, 8)).astype(np.float32))
            dump = base / f"dump{index}.h5"
            dump_sample(DumpStep(model, base / "model.onnx", inputs, dump, variant, f"sample{index}", "ort-cpu",
                                 dump_options))
            paths[variant].append(dump)
    return paths


def run_compare(folder, paths, accuracy=ACCURACY, golden=None):
    n = len(paths["fusion_on"])
    inputs = tuple(folder / f"sample{i}_inputs.npz" for i in range(n))
    local_errors(LocalErrorsStep(folder / "fusion_on" / "model.onnx", tuple(paths["fusion_off"]), inputs, "ort-cpu",
                                 folder / "local.json"))
    compare_dumps(CompareStep(
        reference_dumps=tuple(paths["fusion_off"]), candidate_dumps=tuple(paths["fusion_on"]),
        golden=tuple(golden or [""] * n), samples=tuple(f"sample{i}" for i in range(n)), output_names=("y",),
        accuracy=accuracy, low_precision="fp16", labels=("fusion_off", "fusion_on"),
        candidate_graph=folder / "fusion_on" / "graph.json", local_errors=folder / "local.json", context=CONTEXT,
        report_json=folder / "report.json", report_csv=folder / "report.csv", report_html=folder / "report.html",
        summary=folder / "summary.txt"))
    return CompareReport.read(folder / "report.json")


def test_summary_states_the_run_context_first(ffn_model, tmp_path):
    run_compare(tmp_path, build(tmp_path, ffn_model))
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert lines[0] == context_line(**CONTEXT)
    assert lines[1].startswith("compare fusion_on vs fusion_off on 1 sample(s)")


def test_a_saved_report_is_judged_again_without_the_dumps(ffn_model, tmp_path):
    paths = build(tmp_path, ffn_model, samples=2)
    report = run_compare(tmp_path, paths)
    assert report.first_divergence.rule == "GeluApproximation"
    for dump in tmp_path.glob("*/dump*.h5"):
        dump.unlink()
    saved = report.to_json()
    lenient = judge_report(report, AccuracyCheck(ACCURACY["rtol"], ACCURACY["atol"], ntol=1.0))
    assert lenient.passed and lenient.first_divergence is None
    assert report.to_json() == saved  # a new report: the one judged is as it was
    strict = judge_report(lenient, AccuracyCheck(ACCURACY["rtol"], ACCURACY["atol"], ntol=1.0, cosine=0.99999999999))
    assert strict.first_divergence.op_type == "FastGelu"
    assert strict.accuracy["cosine"] == 0.99999999999
    assert judge_report(strict, AccuracyCheck(ACCURACY["rtol"], ACCURACY["atol"], ACCURACY["ntol"])).to_json() == saved
    with pytest.raises(ConfigError, match="rtol/atol define the mismatch metric"):
        judge_report(report, AccuracyCheck(0.5, ACCURACY["atol"], ntol=0.0))


def test_a_golden_output_shaped_unlike_the_model_output_fails_the_job_naming_it(ffn_model, tmp_path):
    """Not a failing verdict: that would read as 'fusion-off fails against golden', and a bisection would say
    that fusion is not the cause."""
    paths = build(tmp_path, ffn_model)
    golden = tmp_path / "sample0_outputs.npz"
    np.savez(golden, y=np.zeros((4, 8), np.float32))
    with pytest.raises(SampleError) as error:
        run_compare(tmp_path, paths, golden=[str(golden)])
    assert str(error.value) == (f"{golden}: golden output 'y' has shape [4, 8], the model produces [1, 4, 8]; "
                                "regenerate the golden outputs")


def test_report_keeps_per_sample_rows_worst_mean_and_details(ffn_model, tmp_path):
    report = run_compare(tmp_path, build(tmp_path, ffn_model, samples=2))
    row = next(r for r in report.tensors if r.op_type == "FastGelu")
    assert set(row.samples) == {"sample0", "sample1"}
    assert row.worst["max_abs"] == max(s["max_abs"] for s in row.samples.values())
    assert row.mean["max_abs"] == pytest.approx(np.mean([s["max_abs"] for s in row.samples.values()]))
    detail = row.details["sample0"]
    assert sum(detail["reference_counts"]) == sum(detail["candidate_counts"]) == 32
    assert detail["worst_elements"][0]["abs_error"] == row.samples["sample0"]["max_abs"]
    assert row.local["rel_euclidean"] > 1e-5  # the approximated Gelu makes its error on exact inputs
    glue = next(r for r in report.tensors if r.tensor == "h")  # the Reshape after MatMulAddFusion's Gemm
    assert glue.local is None  # it reads a tensor fusion made up, which the fusion-off dump lacks


@pytest.mark.parametrize(
    ("options", "op_types"),
    [
        ({"op_type_filter": ["Gemm", "FastGelu"]}, {"Gemm", "FastGelu"}),
        ({"op_type_bypass": ["Reshape"]}, {"Gemm", "FastGelu", "Relu"}),
        ({"op_name_filter": ["Fast*"]}, {"FastGelu"}),
        ({"op_name_bypass": ["*reshape*", "relu"]}, {"Gemm", "FastGelu"}),
    ],
)
def test_dump_filters_choose_nodes(ffn_model, tmp_path, options, op_types):
    paths = build(tmp_path, ffn_model, dump_options=options)
    with DumpReader(paths["fusion_on"][0]) as dump:
        assert {dump.info(name)["op_type"] for name in dump.names()} == op_types
        assert dump.read_output("y").shape == (1, 4, 8)  # the verdict's outputs are always kept


def test_dump_mode_input_keeps_node_inputs_but_not_weights(ffn_model, tmp_path):
    paths = build(tmp_path, ffn_model, dump_options={"mode": "input", "op_type_filter": ["Gemm"]})
    with DumpReader(paths["fusion_on"][0]) as dump:
        infos = [dump.info(name) for name in dump.names()]
    assert [(i["role"], i["op_type"]) for i in infos] == [("input", "Reshape")]


def test_mutually_exclusive_filters_are_a_config_error():
    with pytest.raises(ConfigError, match="dump: op_type_filter and op_name_bypass are mutually exclusive"):
        validate_config({"model": "m", "samples": "s",
                         "dump": {"op_type_filter": ["Gemm"], "op_name_bypass": ["x"]}})


def test_sample_selection_like_dump_step():
    samples = [Sample(i, None, None) for i in range(12)]
    assert [s.index for s in select_samples(samples, "0|3-5|10")] == [0, 3, 4, 5, 10]
    assert select_samples(samples, None) == samples
    with pytest.raises(SampleError, match="dump.samples: '20-30' selects none of the samples"):
        select_samples(samples, "20-30")


def test_statistics_only_dumps_compare_on_their_aligned_samples(ffn_model, tmp_path):
    paths = build(tmp_path, ffn_model, dump_options={"statistics_only": True})
    with DumpReader(paths["fusion_on"][0]) as dump:
        assert dump.statistics_only
        info = dump.info("y")
        assert {"min", "max", "mean", "std", "nan", "inf", "overflow_fp16", "underflow_bf16"} <= set(info)
        assert dump.read("y").size == min(32, SAMPLE_SIZE)
    report = run_compare(tmp_path, paths)
    assert report.statistics_only and report.first_divergence.op_type == "FastGelu"
    full = build(tmp_path / "full", ffn_model)
    with pytest.raises(DumpError, match="cannot compare a statistics-only dump with a full one"):
        run_compare(tmp_path, {"fusion_off": full["fusion_off"], "fusion_on": paths["fusion_on"]})


def test_details_only_for_the_tensors_a_person_reads():
    """The first failing tensors and the input of the first, the largest local error, the model outputs and
    the worst by mismatch then cosine; not every tensor."""
    rows = tuple(row(f"t{i}", (f"t{i - 1}",) if i else (), {}, passed=i < 20,
                     worst={"mismatch": 0.0 if i < 20 else 0.5, "cosine": 1 - i * 1e-9}) for i in range(40))
    chosen = detail_tensors(report(rows, worst_local=LocalGrowth("t3", 0.1)), ["t39"])
    assert chosen == {"t3", "t19", *(f"t{i}" for i in range(20, 28)), *(f"t{i}" for i in range(32, 40))}


def row(tensor, inputs, samples, **judged):
    return TensorRow(tensor, 0, 0, tensor, "Op", None, (), (), tuple(inputs), samples, **judged)


def report(tensors, **judged):
    return CompareReport("fusion_off", "fusion_on", ACCURACY, "fp16", ("sample0", "sample1"), False, (), tensors,
                         **judged)


GOOD = {"nan_ref": 0, "nan_cand": 0, "cosine": 0.99, "max_abs": 0.5, "mismatch": 0.0}
BROKEN = {"nan_ref": 0, "nan_cand": 0, "cosine": math.nan, "max_abs": math.nan, "mismatch": 0.0}


@pytest.mark.parametrize("order", ["nan first", "nan last"])
def test_a_rows_worst_over_samples_is_nan_when_any_sample_is_whatever_the_order(order):
    """NaN counts as worst (`metrics.worst_over`); Python's max(0.5, nan) is 0.5, max(nan, 0.5) nan."""
    samples = {"sample0": BROKEN, "sample1": GOOD} if order == "nan first" else {"sample0": GOOD, "sample1": BROKEN}
    judged = judge_report(report((row("t", (), samples),)), AccuracyCheck(ACCURACY["rtol"], ACCURACY["atol"], 0.0))
    worst = judged.tensors[0].worst
    assert math.isnan(worst["cosine"]) and math.isnan(worst["max_abs"]) and worst["mismatch"] == 0.0


def test_a_report_reads_back_as_it_was_written(tmp_path):
    judged = judge_report(report((row("t", (), {"sample0": GOOD, "sample1": GOOD}),)),
                          AccuracyCheck(ACCURACY["rtol"], ACCURACY["atol"], 0.0))
    judged.write(tmp_path / "report.json")
    assert CompareReport.read(tmp_path / "report.json") == judged
    assert list(judged.to_json())[0] == "format"


def test_judging_leaves_the_report_it_was_given_as_it_was():
    measured = report((row("t", (), {"sample0": dict(GOOD), "sample1": dict(BROKEN)}),))
    before = measured.to_json()
    judged = judge_report(measured, AccuracyCheck(ACCURACY["rtol"], ACCURACY["atol"], 0.0))
    assert measured.to_json() == before and not measured.tensors[0].worst
    assert judged is not measured and "passed" in judged.tensors[0].samples["sample0"]
