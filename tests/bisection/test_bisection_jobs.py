"""The bisection protocol and the two jobs that drive either kind (`bisection/jobs.py`), over a kind made up
here: no ONNX, no model, only files. The real kinds run end to end in test_fusion_bisect_e2e.py and
test_precision_e2e.py."""

import json
from pathlib import Path

import pytest
from conftest import compare_report, sample_verdict

from accubisect.bisection import jobs
from accubisect.bisection.fusion_bisect import FusionBisection
from accubisect.bisection.precision_bisect import PrecisionBisection
from accubisect.bisection.protocol import Bisection, ResultStep, SearchStep
from accubisect.core.errors import PreconditionError, StepError
from accubisect.core.strategy import NOT_AMONG_CANDIDATES
from accubisect.formats.bisect_result import BISECT_RESULT_FORMAT, BisectResult, ResultVerdict
from accubisect.formats.search_record import SearchRecord
from accubisect.formats.verdict import VerdictStore
from accubisect.reports.report_html import PAGES, Answer

CONTEXT = {"model": "m.onnx", "samples": "samples", "sample_count": 1, "level": "all", "session_config": {},
           "fusion_switch": None, "backend": "ort-cpu"}
CULPRITS = {"b", "d"}  # the made-up model passes when both are switched off


class Oracle:
    """A probe: passes when every culprit is switched off; records what it is asked."""

    def __init__(self):
        self.asked = []

    def __call__(self, off, threads, stop_early=True):
        self.asked.append((off, stop_early))
        passed = CULPRITS <= off
        return {"passed": passed, "samples": [{"inputs": "s0", "passed": passed}], "worst": {"max_rel": 0.0}}


class Toy(Bisection):
    """Candidates a..e, ranked as listed; a floor that asks for one whole verdict; the answer as one file."""

    name, unit, action = "toy_bisect", "letter", "switch off"
    cause, reference_words, advice = "a toy", "with toys put away", "play with something else"
    search_files, result_files = frozenset(), frozenset()
    oracle = None

    def candidates(self):
        return list("abcde")

    def rank(self, candidates):
        return [{"name": name} for name in candidates]

    def prober(self):
        return Toy.oracle

    def floor(self, ranking, judge_whole, key_of):
        verdict = judge_whole(frozenset("bd"))
        return {"passed": verdict.passed, "verdict": key_of(frozenset("bd"))}

    def not_among_candidates(self, found):
        return f"not among {found.candidates}"

    def result(self, found):
        return BisectResult(tuple(found.candidates), found.ranking, "as listed", found.probes, found.culprits, (),
                            found.minimal, "searched", ResultVerdict(True, {}), tuple(found.kept))

    def write_answer(self, result):
        (self.step.result_json.parent / "answer.txt").write_text(" ".join(result.culprits))

    def summary(self, result):
        return f"switch off {', '.join(result.culprits)}\n"

    def answer(self, result):
        answer = self.step.result_json.parent / "answer.txt"
        return Answer(((answer.name, answer.read_text()),), None, f"published to {self.published()}")

    def culprits_graph(self, result):
        return f"<p>around {', '.join(result.culprits)}, rows on {self.rows_page()}</p>"


def report(candidate_passes=False, reference_passes=True):
    return compare_report([sample_verdict(0, candidate_passes, reference_passes)], passed=candidate_passes)


@pytest.fixture
def toy(monkeypatch, tmp_path):
    monkeypatch.setitem(jobs.BISECTIONS, "toy", Toy)
    monkeypatch.setitem(PAGES, "toy", ("compare", "toy_bisect"))
    Toy.oracle = Oracle()
    report().write(tmp_path / "report.json")
    return tmp_path


ACCURACY = {"rtol": 1e-3, "atol": 1e-4, "ntol": 0.0, "cosine": None, "val_func": None, "min_pass_fraction": 1.0}


def search_step(folder, **changes):
    store = VerdictStore(folder / "probe", {"stage": "probe", "model": "toy"})
    return SearchStep(**{"bisection": "toy", "compare_report": folder / "report.json", "sample_inputs": (),
                         "references": (), "search_json": folder / "search.json", "verdicts": store.to_json(),
                         "bisect": {"parallel": 2, "max_probes": None, "max_minutes": None, "rules": None},
                         "output_names": ("y",), "accuracy": ACCURACY, "backend": "ort-cpu",
                         "threads": 2, **changes})


def result_step(folder, **changes):
    return ResultStep(**{"bisection": "toy", "search_json": folder / "search.json",
                         "compare_report": folder / "report.json", "context": CONTEXT,
                         "result_json": folder / "result.json", "report_html": folder / "report.html",
                         "summary": folder / "summary.txt", **changes})


def test_both_kinds_implement_the_whole_protocol():
    for kind in (FusionBisection, PrecisionBisection):
        assert not kind.__abstractmethods__
    assert jobs.BISECTIONS == {"fusion": FusionBisection, "precision": PrecisionBisection}
    assert (FusionBisection.unit, PrecisionBisection.unit) == ("rule", "node")


def test_the_search_job_drives_any_kind_and_the_result_job_writes_its_answer(toy):
    jobs.run_search(search_step(toy))
    found = SearchRecord.read(toy / "search.json")
    assert found.name == "toy_bisect" and found.culprits == ("b", "d") and found.minimal
    assert found.floor["passed"] and found.floor["verdict"] == VerdictStore.from_json(
        search_step(toy).verdicts).key_of(frozenset("bd"))
    whole = [off for off, stop_early in Toy.oracle.asked if not stop_early]
    assert whole == [frozenset("bd")]  # the floor's verdict judged every sample, and the search found it on disk
    assert frozenset("bd") not in [off for off, stop_early in Toy.oracle.asked if stop_early]
    jobs.write_result(result_step(toy))
    result = json.loads((toy / "result.json").read_text())
    assert result["format"] == BISECT_RESULT_FORMAT
    assert result["culprits"] == ["b", "d"] and result["kept"] == ["a", "c", "e"]
    assert (toy / "answer.txt").read_text() == "b d"
    assert (toy / "summary.txt").read_text().splitlines()[1] == "switch off b, d"
    page = (toy / "report.html").read_text()
    assert "toy_bisect: switch off b, d" in page and "<p>around b, d, rows on ../compare/report.html</p>" in page
    assert "published to results/toy_bisect" in page and "href='answer.txt'" in page


def test_nothing_off_passing_asks_for_no_floor_and_no_probe(toy):
    report(candidate_passes=True).write(toy / "report.json")
    jobs.run_search(search_step(toy))
    assert Toy.oracle.asked == [] and SearchRecord.read(toy / "search.json").floor is None


def test_a_failing_reference_stops_the_search_with_the_kind_s_reason(toy):
    report(reference_passes=False).write(toy / "report.json")
    with pytest.raises(PreconditionError, match=r"^the model fails even with toys put away \(fusion_off fails "
                                                r"against the golden outputs\): a toy is not the cause; play with "
                                                r"something else$"):
        jobs.run_search(search_step(toy))


def test_both_kinds_word_the_precondition_line_alike(toy):
    files = {"fusion": {"model": toy / "m.onnx", "compile_record": toy / "compile.json",
                        "compiled_model": toy / "on.onnx"},
             "precision": {"compiled_model": toy / "c.onnx", "assignment": toy / "assignment.json"}}
    lines = [jobs.bisection_of(search_step(toy, bisection=kind, **files[kind])).not_the_cause() for kind in files]
    assert lines == ["the model fails even with fusion off (fusion_off fails against the golden outputs): fusion is "
                     "not the cause; check the golden outputs and the accuracy check",
                     "the model fails even in fp32 (fusion_off fails against the golden outputs): precision is not "
                     "the cause; try fusion_bisect"]


def test_a_job_asking_for_the_other_job_s_files_is_one_line(toy):
    with pytest.raises(StepError, match="^toy_bisect: asked in the search job for what only the result job has$"):
        jobs.bisection_of(search_step(toy)).culprits_graph(
            BisectResult((), (), "", (), (), (), True, "", ResultVerdict(True, {}), ()))
    with pytest.raises(StepError, match="^toy_bisect: asked in the result job for what only the search job has$"):
        jobs.bisection_of(result_step(toy)).sample_judge()


def test_no_answer_among_the_candidates_is_the_kind_s_one_line(toy):
    record = SearchRecord("toy_bisect", ({"name": "a"},), (), NOT_AMONG_CANDIDATES, ())
    (toy / "search.json").write_text(json.dumps(record.to_json()))
    with pytest.raises(PreconditionError, match=r"^not among \['a'\]$"):
        jobs.write_result(result_step(toy))


def test_a_rule_wired_with_another_kind_s_files_is_named(tmp_path):
    with pytest.raises(StepError, match=r"fusion_bisect: the rule gives the files \['assignment'\]; a SearchStep of "
                                        r"this kind has \['compile_record', 'compiled_model', 'model'\]"):
        jobs.bisection_of(search_step(tmp_path, bisection="fusion", assignment=tmp_path / "assignment.json"))
    with pytest.raises(StepError, match=r"bisection 'gelu': not one of \['fusion', 'precision'\]"):
        jobs.bisection_of(result_step(tmp_path, bisection="gelu"))


def test_the_step_records_take_a_rule_s_named_values_as_run_step_gives_them(tmp_path):
    """Snakemake's files arrive as str, a list of files as a list; params as given."""
    named = {"bisection": "precision", "compiled_model": "c/model.onnx", "assignment": "p/assignment.json",
             "compare_report": "r.json", "sample_inputs": ["s0.npz", "s1.npz"], "references": ["g0.npz", "g1.npz"],
             "search_json": "b/search.json", "verdicts": {"root": "w", "key": {}}, "bisect": {"parallel": 2},
             "output_names": ["y"], "accuracy": {}, "backend": "ort-cpu", "threads": 2}
    step = SearchStep.from_named(named)
    assert step.sample_inputs == (Path("s0.npz"), Path("s1.npz")) and step.output_names == ("y",)
    assert step.model is None and step.compiled_model == Path("c/model.onnx")
    assert isinstance(jobs.bisection_of(step), PrecisionBisection)
