"""The stage records (compile.json, graph.json, report.json, local.json, assignment.json, the ORT bisections'
result.json): each reads back as it was written, and a file of another format, without one, or missing a field
is refused in one line naming the file and the folder to delete, never a KeyError."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import fields

import pytest

from accubisect.core.errors import WorkspaceError
from accubisect.formats.assignment import Assignment
from accubisect.formats.bisect_result import (
    AssignedAnswer,
    BisectResult,
    DeployedAnswer,
    FusionResult,
    PrecisionResult,
    ResultVerdict,
)
from accubisect.formats.compare_report import CompareReport, Divergence, LocalGrowth, SampleVerdict, TensorRow
from accubisect.formats.compile_record import CompileRecord, Variant
from accubisect.formats.finalize_record import FinalizeRecord
from accubisect.formats.graph_record import GraphNode, GraphRecord, NestedNode
from accubisect.formats.local_errors import LocalErrors
from accubisect.formats.verdict import VerdictRecord

ROW = TensorRow("h", 1, 0, "Gemm", "Gemm", "MatMulAddFusion", ("MatMulAddFusion",), ("mm", "bias"), ("x",),
                {"sample0": {"cosine": 0.5, "mismatch": 0.25, "reasons": ["25.00% of elements"], "passed": False}},
                False, {"cosine": 0.5, "mismatch": 0.25}, {"cosine": 0.5, "mismatch": 0.25}, {}, None)
PROBE = {"round": 0, "off": ["Gelu"], "passed": True, "samples_passed": [True], "worst": {"max_rel": 0.01},
         "seconds": 0.5, "from_disk": False}
COMMON = {"candidates": ("Gelu", "Gemm"), "ranking": ({"name": "Gelu", "local_error": 0.1},), "ranking_use": "ranked",
          "probes": (PROBE,), "culprits": ("Gelu",), "groups": (), "minimal": True, "search": "1 probe in 1 round",
          "final_verdict": ResultVerdict(True, {"max_rel": 0.01}, ("Gelu",), (True,)), "kept": ("Gemm",)}
RECORDS = {
    "compile.json": CompileRecord(Variant("fusion_on", "all", {"a": "1"}, frozenset({"GeluFusion"})), "ort-cpu",
                                  ("GeluFusion",), ("MatMulAddFusion",),
                                  {"ConvBNFusion": Counter({("ai.onnx", "Conv"): 2})}, "1.23.0", "x86_64:avx2", 0.5),
    "graph.json": GraphRecord("fusion_on", ("MatMulAddFusion",), (
        GraphNode(0, "Gemm", "Gemm", "ai.onnx", ("x",), ("h",), ("mm", "bias"), "MatMulAddFusion",
                  ("MatMulAddFusion",)),), ("Constant_0",), "ab" * 32,
        (NestedNode("If_3", "then_branch", 0, "FastGelu", "FastGelu", "com.microsoft", ("h",), ("g",),
                    ("GeluFusion", "GeluApproximation")),)),
    "report.json": CompareReport("fusion_off", "fusion_on", {"rtol": 0.001, "atol": 0.0001, "ntol": 0.0,
                                                           "cosine": None}, "fp16", ("sample0",), False,
                                 (SampleVerdict("sample0", "reference", {"passed": True, "reasons": [],
                                                                         "outputs": {}}),),
                                 (ROW,), True, Divergence.of(ROW), LocalGrowth("h", 0.25), ("relu",), "ab" * 32),
    "local.json": LocalErrors({"Gemm": {"rel_euclidean": 0.001, "max_abs": 0.01, "max_rel": 0.1, "cosine": 1.0}},
                              ("relu",)),
    "assignment.json": Assignment("force_fp16", "fp16", "compiled", ("Gemm",), (), ("If_3",), {"Gemm": "white"},
                                  {"x": "float32"}),
    "fusion result.json": FusionResult(**COMMON, fusion_on_verdict=ResultVerdict(False, {"max_rel": 0.5}),
                                       already_off=("ConvBNFusion",)),
    "precision result.json": PrecisionResult(
        **COMMON, status="fixed", mode="force_fp16", dtype="fp16", graph="compiled", floor=None,
        kept_fp32="1 of 2 nodes", keep_dtype=("Gelu",), reduced_verdict=ResultVerdict(False, {"max_rel": 0.5}),
        mixlist_black=(), assigned=AssignedAnswer(2, ("Gelu",), "found"),
        deployed=DeployedAnswer(("Gelu",), ResultVerdict(True, {"max_rel": 0.01}, ("Gelu",)), "verified", (), None),
        model=FinalizeRecord("m.onnx", "fp16", "compiled", 1, 2, "run on every sample", True, {"max_rel": 0.01})),
}
KINDS = {"compile.json": "compile record", "graph.json": "graph record", "report.json": "compare report",
         "local.json": "local-error record", "assignment.json": "precision assignment",
         "fusion result.json": "fusion_bisect result", "precision result.json": "precision_bisect result"}


def written(tmp_path, name):
    path = tmp_path / "stage" / name
    RECORDS[name].write(path)
    return path


@pytest.mark.parametrize("name", RECORDS)
def test_a_record_reads_back_as_it_was_written_with_its_format_first(tmp_path, name):
    path = written(tmp_path, name)
    assert type(RECORDS[name]).read(path) == RECORDS[name]
    assert next(iter(json.loads(path.read_text()))) == "format"


@pytest.mark.parametrize(("change", "why"), [
    ({"format": 99}, "format 99, this version reads format {}"),
    ({"format": None}, "no format, this version reads format {}"),
])
@pytest.mark.parametrize("name", RECORDS)
def test_a_record_of_another_format_is_refused_in_one_line(tmp_path, name, change, why):
    path = written(tmp_path, name)
    version = json.loads(path.read_text())["format"]
    data = {key: value for key, value in {**json.loads(path.read_text()), **change}.items() if value is not None}
    path.write_text(json.dumps(data))
    why = why.format(version)
    with pytest.raises(WorkspaceError) as error:
        type(RECORDS[name]).read(path)
    assert str(error.value) == (f"{path}: not a {KINDS[name]} of this accubisect version ({why}); delete "
                                f"{path.parent} and rerun to rebuild it")


@pytest.mark.parametrize("name", RECORDS)
def test_a_record_missing_a_field_is_refused_in_one_line_naming_it(tmp_path, name):
    path = written(tmp_path, name)
    data = json.loads(path.read_text())
    optional = {"local_skipped"}  # a report without local errors attached: the command line's compare
    for field in [key for key in data if key != "format" and key not in optional]:
        path.write_text(json.dumps({key: value for key, value in data.items() if key != field}))
        with pytest.raises(WorkspaceError) as error:
            type(RECORDS[name]).read(path)
        message = str(error.value)
        assert message.startswith(f"{path}: not a {KINDS[name]} of this accubisect version (")
        assert message.endswith(f"delete {path.parent} and rerun to rebuild it") and "\n" not in message
        assert f"no field '{field}'" in message


def test_a_damaged_or_missing_record_is_one_line_too(tmp_path):
    path = written(tmp_path, "graph.json")
    path.write_text(path.read_text()[:20])
    with pytest.raises(WorkspaceError, match=r"graph.json: damaged JSON .*delete .* and rerun to rebuild it"):
        GraphRecord.read(path)
    with pytest.raises(WorkspaceError, match=r"none.json: cannot read the graph record .*delete .* and rerun"):
        GraphRecord.read(tmp_path / "none.json")


@pytest.mark.parametrize("shown", [
    {"passed": False, "worst": {"max_rel": 0.5}},  # the comparison's: fusion_on_verdict, reduced_verdict
    {"off": [], "passed": False, "worst": {"max_rel": 0.5}},  # fusion's answer with nothing switched off
    {"off": ["Gelu"], "passed": True, "samples_passed": [True, True], "worst": {"max_rel": 0.01}},  # a probe's
    {"off": ["Gelu"], "passed": False, "samples_passed": [False], "worst": {}, "reasons": ["Gelu: 7e4 > 65504"]},
])
def test_a_result_verdict_keeps_the_keys_it_was_given_in_their_order(shown):
    assert list(ResultVerdict.of(shown).to_json().items()) == list(shown.items())


def test_a_verdict_record_shows_in_result_json_as_a_probe_with_its_first_failing_samples_reasons():
    """precision_deploy's verdicts (`final_verdict`, `carried_verdict`) are built from the verdict record: every key in
    the file's order, `reasons` those of the first sample that failed (none when all passed)."""
    samples = ({"passed": True, "reasons": []}, {"passed": False, "reasons": ["y: 9% outside"]},
               {"passed": False, "reasons": ["tensor 'b' reaches 7e4"]})
    failed = VerdictRecord(("add", "mm"), False, samples, {"max_rel": 0.5}, 1.5)
    assert ResultVerdict.of_record(failed).to_json() == {
        "off": ["add", "mm"], "passed": False, "samples_passed": [True, False, False], "worst": {"max_rel": 0.5},
        "reasons": ["y: 9% outside"]}
    passed = VerdictRecord((), True, samples[:1], {}, 0.1)
    assert list(ResultVerdict.of_record(passed).to_json().items()) == [
        ("off", []), ("passed", True), ("samples_passed", [True]), ("worst", {}), ("reasons", [])]


@pytest.mark.parametrize("kind", [BisectResult, FusionResult, PrecisionResult])
def test_a_result_lists_every_field_once_in_its_order(kind):
    assert sorted(kind.keys) == sorted(field.name for field in fields(kind))
