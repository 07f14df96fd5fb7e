"""The real `snakemake fusion_bisect` on the bundled example and on a model with two culprits."""

import json

import numpy as np
import pytest
import yaml
from conftest import EXAMPLE, EXAMPLE_CONTEXT, copy_workflow, jobs_run, save_model, snakemake
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from accubisect.formats.bisect_result import FusionResult

pytestmark = pytest.mark.e2e


def results(folder):
    base = folder / "results" / "fusion_bisect"
    return (FusionResult.read(base / "result.json"), json.loads((base / "fusion_switch.cfg").read_text()),
            (base / "summary.txt").read_text())


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("bisect"))
    run = snakemake(folder, "fusion_bisect", *EXAMPLE)
    return folder, run


def test_example_finds_exactly_gelu_approximation(example):
    folder, run = example
    result, switch, summary = results(folder)
    assert result.culprits == ("GeluApproximation",)
    assert switch == {"Switch": {"GraphFusion": {"GeluApproximation": "off"}, "UBFusion": {}}}
    context, answer = summary.split("\n", 1)
    assert context == EXAMPLE_CONTEXT  # the run's context first
    assert answer.startswith("1 of 9 fired rules breaks accuracy: GeluApproximation (max rel err")
    assert "8 fusions kept" in summary and summary in run.stdout
    assert result.ranking[0]["name"] == "GeluApproximation"
    assert len(result.probes) <= 2 and result.final_verdict.passed
    progress = [line for line in run.stderr.splitlines() if "fusion_bisect round" in line]
    assert progress == ["INFO accubisect: fusion_bisect round 0: 2 probe(s) running, 0 done · 9 of 9 suspect(s) "
                        "left · culprits so far: none · 0:00 elapsed"]


def test_the_switch_file_makes_compare_pass(example, tmp_path):
    folder, _ = example
    snakemake(folder, "compare", *EXAMPLE, "--config",
              "compile={fusion_switch: results/fusion_bisect/fusion_switch.cfg}", "results=fixed")
    assert json.loads((folder / "fixed" / "compare" / "report.json").read_text())["passed"]
    context = (folder / "fixed" / "compare" / "summary.txt").read_text().splitlines()[0]
    assert context == EXAMPLE_CONTEXT.replace("switch file none", "switch file results/fusion_bisect/fusion_switch.cfg")


def test_deleting_the_result_runs_no_probe_again(example):
    folder, _ = example
    for result in (folder / "workspace" / "fusion_bisect").glob("*/result.json"):
        result.unlink()
    (folder / "results" / "fusion_bisect" / "result.json").unlink()
    rerun = snakemake(folder, "fusion_bisect", *EXAMPLE)
    assert "fusion_search" not in jobs_run(rerun) and "fusion_result" in jobs_run(rerun)
    assert results(folder)[0].culprits == ("GeluApproximation",)


def test_nothing_to_bisect_when_fusion_on_passes(example):
    folder, _ = example
    snakemake(folder, "fusion_bisect", *EXAMPLE, "--config", "accuracy={rtol: 0.01, atol: 0.001}", "results=loose")
    base = folder / "loose" / "fusion_bisect"
    assert json.loads((base / "fusion_switch.cfg").read_text()) == {"Switch": {"GraphFusion": {}, "UBFusion": {}}}
    assert (base / "summary.txt").read_text().splitlines()[1].startswith("nothing to bisect")


def test_culprits_not_among_the_candidates_fail_in_one_line_after_the_instance_job(example):
    """The instance job runs before the result job: with no rule-level answer it searches no instance, and
    the result job says why."""
    folder, _ = example
    run = snakemake(folder, "fusion_bisect", *EXAMPLE, "--config", "bisect={rules: [MatMulAddFusion]}",
                    "results=narrow", check=False)
    assert run.returncode != 0
    assert "accubisect: even with every candidate rule off the model fails: the culprits are not among the " \
           "candidates ['MatMulAddFusion']; widen or drop bisect.rules" in run.stderr, run.stderr
    assert "Error in rule fusion_result:" in run.stderr and "Error in rule fusion_instances:" not in run.stderr
    assert "fusion_instances" in jobs_run(run)


def test_fusion_off_failing_means_fusion_is_not_the_cause(tmp_path):
    folder = copy_workflow(tmp_path)
    for golden in (folder / "examples" / "samples").glob("*_outputs.npz"):
        np.savez(golden, y=np.load(golden)["y"] * 2)
    run = snakemake(folder, "fusion_bisect", *EXAMPLE, check=False)
    assert run.returncode != 0
    assert "the model fails even with fusion off" in run.stderr and "fusion is not the cause" in run.stderr


def test_unknown_rule_in_bisect_rules_fails_at_once(tmp_path):
    folder = copy_workflow(tmp_path)
    run = snakemake(folder, "fusion_bisect", *EXAMPLE, "--config", "bisect={rules: [GeluApprox]}", check=False)
    assert run.returncode != 0
    assert "accubisect: bisect.rules: unknown fusion rule 'GeluApprox'" in run.stderr
    assert "closest: GeluApproximation" in run.stderr


def two_culprit_model(path):
    """Two real ORT rewrites that change the numbers, each on its own branch:

        x ─ MatMul ─ Add ─┬─ Cast(fp16) ─ Cast(fp32) ───────────┬─ Add ─ y
                          └─ Div ─ Erf ─ Add ─ Mul ─ Mul (Gelu) ─┘

    CastChainElimination (switched on by a session config entry) drops the fp16 round trip the model
    asks for; GeluApproximation turns the fused Gelu into the tanh-approximated FastGelu.
    """
    rng = np.random.default_rng(1)
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "b"], ["h"], name="bias"),
        helper.make_node("Cast", ["h"], ["h16"], to=TensorProto.FLOAT16, name="to_fp16"),
        helper.make_node("Cast", ["h16"], ["c"], to=TensorProto.FLOAT, name="to_fp32"),
        helper.make_node("Div", ["h", "sqrt2"], ["g0"], name="gelu/div"),
        helper.make_node("Erf", ["g0"], ["g1"], name="gelu/erf"),
        helper.make_node("Add", ["g1", "one"], ["g2"], name="gelu/add"),
        helper.make_node("Mul", ["h", "g2"], ["g3"], name="gelu/mul"),
        helper.make_node("Mul", ["g3", "half"], ["g"], name="gelu/half"),
        helper.make_node("Add", ["c", "g"], ["y"], name="join"),
    ]
    inits = [const("w", rng.normal(0, 0.6, (16, 16))), const("b", rng.normal(0, 0.1, 16)),
             const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5)]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], inits, path)


def test_two_independent_culprits_are_both_found(tmp_path):
    folder = copy_workflow(tmp_path)
    model = two_culprit_model(folder / "two.onnx")
    samples = folder / "two_samples"
    samples.mkdir()
    reference, rng = ReferenceEvaluator(str(model)), np.random.default_rng(2)
    for index in range(3):
        x = rng.normal(0, 1, (1, 8, 16)).astype(np.float32)
        np.savez(samples / f"sample{index}_inputs.npz", x=x)
        np.savez(samples / f"sample{index}_outputs.npz", y=reference.run(None, {"x": x})[0])
    config = {"model": "two.onnx", "samples": "two_samples", "compile": {"session_config": {
        "optimization.enable_gelu_approximation": "1", "optimization.enable_cast_chain_elimination": "1"}},
        "accuracy": {"rtol": 1e-4, "atol": 1e-5}, "bisect": {"parallel": 1}}
    (folder / "two.yaml").write_text(yaml.safe_dump(config))
    snakemake(folder, "fusion_bisect", "--configfile", "two.yaml")
    result, switch, summary = results(folder)
    assert set(result.culprits) == {"GeluApproximation", "CastChainElimination"}
    assert switch["Switch"] == {"GraphFusion": {"GeluApproximation": "off"},
                                "UBFusion": {"CastChainElimination": "off"}}
    assert "MatMulAddFusion" in result.kept and "GeluFusion" in result.kept
    context, answer = summary.split("\n", 1)
    assert context == ("model two.onnx; 3 sample(s) from two_samples; compile level all; session config "
                       "optimization.enable_cast_chain_elimination=1, optimization.enable_gelu_approximation=1; "
                       "switch file none; backend ort-cpu")
    assert answer.startswith("2 of ")
    snakemake(folder, "compare", "--configfile", "two.yaml", "--config",
              "compile={fusion_switch: results/fusion_bisect/fusion_switch.cfg}")
    assert json.loads((folder / "results" / "compare" / "report.json").read_text())["passed"]


def test_probes_are_shared_across_bisections(example):
    folder, _ = example
    earlier = {tuple(probe["off"]) for probe in results(folder)[0].probes}
    rerun = snakemake(folder, "fusion_bisect", *EXAMPLE, "--config", "bisect={parallel: 1}", "results=sequential")
    assert "fusion_search" in jobs_run(rerun)
    result = FusionResult.read(folder / "sequential" / "fusion_bisect" / "result.json")
    assert result.culprits == ("GeluApproximation",)
    assert [probe["from_disk"] for probe in result.probes] == [tuple(p["off"]) in earlier for p in result.probes]
    assert any(probe["from_disk"] for probe in result.probes)
