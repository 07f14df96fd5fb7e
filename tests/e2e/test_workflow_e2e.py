"""The real `snakemake` command on the bundled example, in a temporary copy of the workflow."""

import json

import numpy as np
import pytest
from conftest import EXAMPLE, EXAMPLE_CONTEXT, copy_workflow, jobs_run, run_expecting_error, snakemake

from accubisect.formats.config import NOT_CONFIGURED
from accubisect.formats.dump_file import DumpReader

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("workflow"))
    snakemake(folder, "compare", *EXAMPLE)
    return folder


def report(folder):
    return json.loads((folder / "results" / "compare" / "report.json").read_text())


def test_compare_names_the_approximated_gelu_and_its_rule(workflow):
    result = report(workflow)
    divergence = result["first_divergence"]
    assert (divergence["op_type"], divergence["rule"], divergence["tensor"]) == ("FastGelu", "GeluApproximation",
                                                                                 "gelu/half")
    assert divergence["original_nodes"] == ["gelu/div", "gelu/erf", "gelu/add", "gelu/mul", "gelu/half"]
    assert not result["passed"]
    assert all(v["against"] == "golden" and v["reference"]["passed"] for v in result["verdicts"])
    summary = (workflow / "results" / "compare" / "summary.txt").read_text()
    assert summary.splitlines()[0] == EXAMPLE_CONTEXT and "rule GeluApproximation" in summary
    assert (workflow / "results" / "compare" / "report.csv").read_text().count("\n") == 1 + 4 * len(result["tensors"])


def test_fusion_on_dump_holds_the_gemm_made_by_matmul_add_fusion(workflow):
    graph_file = next((workflow / "workspace" / "graph").glob("*/graph.json"))
    graphs = [json.loads(p.read_text()) for p in (workflow / "workspace" / "graph").glob("*/graph.json")]
    (fused,) = [g for g in graphs if g["variant"] == "fusion_on"]
    gemms = [n for n in fused["nodes"] if n["op_type"] == "Gemm"]
    assert gemms and all(n["rule"] == "MatMulAddFusion" for n in gemms), graph_file
    fusion_on = []
    for path in (workflow / "workspace" / "dump").glob("*/dump.h5"):
        with DumpReader(path) as dump:
            if dump.attrs["variant"] == "fusion_on":
                fusion_on.append({dump.info(name)["op_type"] for name in dump.names()})
    assert len(fusion_on) == 4
    assert {"Gemm", "FastGelu", "FusedConv", "SkipLayerNormalization"} <= fusion_on[0]


def test_second_run_runs_nothing(workflow):
    assert "Nothing to be done" in snakemake(workflow, "compare", *EXAMPLE).stderr


def test_changing_tolerances_reruns_only_the_compare_stage(workflow):
    changed = snakemake(workflow, "compare", *EXAMPLE, "--config", "accuracy={rtol: 0.01, atol: 0.001}")
    assert jobs_run(changed) == ["compare", "compare_dumps", "publish_compare"]
    assert report(workflow)["passed"]
    reverted = snakemake(workflow, "compare", *EXAMPLE)  # the earlier compare folder is found again
    assert jobs_run(reverted) == ["compare", "publish_compare"]
    assert not report(workflow)["passed"]


def test_switching_the_culprit_off_makes_compare_pass(tmp_path):
    folder = copy_workflow(tmp_path)
    switch = {"Switch": {"GraphFusion": {"GeluApproximation": "off"}, "UBFusion": {}}}
    (folder / "fusion_switch.cfg").write_text(json.dumps(switch))
    snakemake(folder, "compare", *EXAMPLE, "--config", "compile={fusion_switch: fusion_switch.cfg}")
    result = report(folder)
    assert result["passed"] and result["first_divergence"] is None


def test_bad_inputs_fail_in_one_line_before_anything_runs(tmp_path):
    folder = copy_workflow(tmp_path)
    assert "compile.level: 'high' is not one of" in run_expecting_error(folder, "compile={level: high}")
    assert "model file not found" in run_expecting_error(folder, "model=missing.onnx")
    (folder / "bad.cfg").write_text('{"Switch": {"GraphFusion": {"GeluApproximaton": "off"}}}')
    line = run_expecting_error(folder, "compile={fusion_switch: bad.cfg}")
    assert "unknown fusion rule 'GeluApproximaton'" in line and "closest: GeluApproximation" in line
    samples = folder / "examples" / "samples"
    np.savez(samples / "sample0_inputs.npz", x=np.zeros((1, 16, 32)))
    assert "input 'x' has dtype float64, the model expects float32" in run_expecting_error(folder, "workspace=ws")
    assert not (folder / "ws" / "compile").exists()


def test_nan_in_golden_outputs_fails_the_compare_job_with_the_file(tmp_path):
    folder = copy_workflow(tmp_path)
    golden = folder / "examples" / "samples" / "sample1_outputs.npz"
    np.savez(golden, y=np.full((1, 16, 32), np.nan, np.float32))
    result = snakemake(folder, "compare", *EXAMPLE, check=False)
    assert result.returncode != 0
    assert "sample1_outputs.npz: golden output 'y' holds 512 NaN values" in result.stderr


def test_a_killed_run_loses_no_earlier_result(tmp_path):
    """A stage file left half-written is never under its final name; a rerun redoes only what is missing."""
    folder = copy_workflow(tmp_path)
    snakemake(folder, "dump", *EXAMPLE)
    dump = next((folder / "workspace" / "dump").glob("*/dump.h5"))
    dump.unlink()
    (dump.parent / ".dump.h5.abc.part").write_bytes(b"torn")  # what a kill leaves behind
    result = snakemake(folder, "compare", *EXAMPLE)
    assert jobs_run(result).count("dump_sample") == 1 and "compile_variant" not in jobs_run(result)
    assert (folder / "results" / "compare" / "report.json").exists()


def test_val_func_judges_the_model_outputs(tmp_path):
    folder = copy_workflow(tmp_path)
    (folder / "judges.py").write_text(
        "def same_sign(reference, candidate):\n"
        "    return bool(((reference['y'] > 0) == (candidate['y'] > 0)).all())\n"
    )
    snakemake(folder, "compare", *EXAMPLE, "--config", "accuracy={val_func: 'judges:same_sign'}")
    result = report(folder)
    assert result["passed"] and result["first_divergence"]["rule"] == "GeluApproximation"
    (folder / "judges.py").write_text("def same_sign(reference, candidate):\n    return False\n")
    rerun = snakemake(folder, "compare", *EXAMPLE, "--config", "accuracy={val_func: 'judges:same_sign'}")
    assert "compare_dumps" in jobs_run(rerun) and not report(folder)["passed"]


def test_bad_precision_settings_fail_in_one_line(tmp_path):
    folder = copy_workflow(tmp_path)
    assert "missing.json: modify_mixlist file not found" in run_expecting_error(
        folder, "precision={modify_mixlist: missing.json}")
    assert "precision.no_fp32_ops: unknown op type 'Convv'; closest: Conv" in run_expecting_error(
        folder, "precision={no_fp32_ops: [Convv]}")


def fusion_on_record(folder):
    records = [json.loads(p.read_text()) for p in (folder / "workspace" / "compile").glob("*/compile.json")]
    (record,) = [r for r in records if r["variant"]["name"] == "fusion_on"]
    return record


def test_a_users_own_config_starts_from_the_schema_defaults(tmp_path):
    """The bundled example's session config (GeluApproximation on) does not leak into a run given only a
    model and samples, whether by --configfile or by --config."""
    folder = copy_workflow(tmp_path)
    (folder / "mine.yaml").write_text("model: examples/transformer.onnx\nsamples: examples/samples\n")
    run = snakemake(folder, "compare", "--configfile", "mine.yaml")
    assert fusion_on_record(folder)["variant"]["session_config"] == {}
    context = ("model examples/transformer.onnx; 4 sample(s) from examples/samples; compile level all; "
               "session config none; switch file none; backend ort-cpu")
    summary = (folder / "results" / "compare" / "summary.txt").read_text()
    assert summary.splitlines()[0] == context and summary in run.stdout
    assert report(folder)["passed"]  # without the example's approximate Gelu, fusion-on passes
    rerun = snakemake(folder, "compare", "--config", "model=examples/transformer.onnx", "samples=examples/samples",
                      "results=by_config")
    assert "compile_variant" not in jobs_run(rerun)  # the same settings: the same stage folders
    assert (folder / "by_config" / "compare" / "summary.txt").read_text().splitlines()[0] == context


def test_no_config_at_all_says_what_to_pass_in_one_line(tmp_path):
    run = snakemake(copy_workflow(tmp_path), "compare", check=False)
    assert run.returncode != 0
    said = [line for line in run.stderr.splitlines() if not line.startswith("Using workflow specific profile")]
    assert said == [f"accubisect: {NOT_CONFIGURED}"] and "Traceback" not in run.stdout
    assert "--configfile examples/config.yaml" in NOT_CONFIGURED
