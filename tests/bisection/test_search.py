"""The search job's loop (`bisection.search`) over fake verdicts and real verdict files: resuming from disk,
budgets and the best answer so far, the search record's format. The probes of the workflow's own runs
are exercised end to end in test_fusion_bisect_e2e.py and test_precision_e2e.py."""

import json
import random

import pytest

from accubisect.bisection.search import Budget, Pace, PreconditionError, answer_status, check_budget, search
from accubisect.core.errors import ConfigError, WorkspaceError
from accubisect.core.strategy import FOUND
from accubisect.formats.digest import stage_key
from accubisect.formats.search_record import UNFINISHED, SearchRecord
from accubisect.formats.verdict import VerdictRecord, VerdictStore


def ranking(names):
    return [{"name": name, "local_error": None} for name in names]


def prober(groups, calls):
    """Passes when every failing group has a member off; records each configuration it is asked."""

    def probe(off, threads):
        calls.append(off)
        passed = all(group & off for group in groups)
        return {"passed": passed, "samples": [{"passed": passed}], "worst": {}}

    return probe


def run(tmp_path, names, groups, budget=Budget(), calls=None, parallel=2):
    store = VerdictStore(tmp_path / "probe", {"stage": "probe", "model": "m"})
    calls = [] if calls is None else calls
    return search("fusion_bisect", ranking(names), False, store, prober(groups, calls), Pace(parallel, 2, budget))


@pytest.mark.parametrize("seed", range(3))
def test_a_rerun_takes_every_verdict_from_disk(tmp_path, seed):
    rng = random.Random(seed)
    names = [f"rule{i}" for i in range(rng.randint(2, 40))]
    groups = [frozenset([name]) for name in rng.sample(names, rng.randint(1, 2))]
    first = run(tmp_path, names, groups)
    calls = []
    again = run(tmp_path, names, groups, calls=calls)
    assert first.status == again.status == FOUND and again.culprits == first.culprits
    assert calls == [] and all(probe["from_disk"] for probe in again.probes)
    assert [p["off"] for p in again.probes] == [p["off"] for p in first.probes]


def test_a_budget_publishes_the_best_so_far_and_a_bigger_one_goes_on(tmp_path):
    names = [f"rule{i}" for i in range(32)]
    groups = [frozenset(["rule7"]), frozenset(["rule20"])]
    unbounded = run(tmp_path / "alone", names, groups)
    stopped = run(tmp_path, names, groups, Budget(max_probes=4))
    assert stopped.status == UNFINISHED and stopped.stopped_by == "bisect.max_probes (4)"
    assert len(stopped.probes) == 4
    passing = [p["off"] for p in stopped.probes if p["passed"]]
    assert sorted(stopped.culprits) == sorted(min(passing, key=len))  # the fewest off among those that passed
    assert "not proven minimal" in answer_status(stopped, "rule")
    calls = []
    resumed = run(tmp_path, names, groups, calls=calls)
    assert resumed.status == FOUND and resumed.culprits == unbounded.culprits == ("rule7", "rule20")
    assert len(calls) == len(unbounded.probes) - 4
    assert [p["from_disk"] for p in resumed.probes[:4]] == [True] * 4


def test_a_budget_spent_before_anything_passed_says_what_to_raise(tmp_path):
    names = [f"rule{i}" for i in range(8)]
    stopped = run(tmp_path, names, [frozenset(["rule3"])], Budget(max_probes=1), parallel=1)
    assert stopped.status == UNFINISHED and stopped.culprits == ()
    with pytest.raises(PreconditionError, match=r"bisect.max_probes \(1\) ran out after 1 probe\(s\), before any"):
        answer_status(stopped, "rule")


def test_minutes_run_out_before_the_next_round(tmp_path):
    stopped = run(tmp_path, ["a", "b", "c"], [frozenset(["b"])], Budget(max_minutes=1e-9))
    assert stopped.status == UNFINISHED and stopped.probes == () and stopped.stopped_by == "bisect.max_minutes (1e-09)"


def test_minutes_run_out_before_anything_passed_says_so_not_best_so_far(tmp_path, caplog):
    caplog.set_level("INFO", logger="accubisect")
    run(tmp_path, ["a", "b", "c"], [frozenset(["b"])], Budget(max_minutes=1e-9))
    assert "stopped by bisect.max_minutes (1e-09) before any configuration passed; raise it and rerun" in caplog.text
    assert "best so far" not in caplog.text


@pytest.mark.parametrize("minutes", [float("inf"), float("nan")])
def test_a_budget_of_no_number_of_minutes_is_refused(minutes):
    with pytest.raises(ConfigError, match=r"bisect.max_minutes: (inf|nan) is not a number of minutes; for no time "
                                          r"limit leave it null"):
        check_budget({"max_minutes": minutes})
    check_budget({"max_minutes": None})


NOT_A_SEARCH_RECORD = r"search.json: not a search record of this accubisect version \(.*\); delete"


def test_the_search_record_is_versioned(tmp_path):
    record = run(tmp_path, ["a", "b"], [frozenset(["a"])])
    path = tmp_path / "search.json"
    path.write_text(json.dumps(record.to_json()))
    assert SearchRecord.read(path) == record
    path.write_text(json.dumps({**record.to_json(), "format": 0}))
    with pytest.raises(WorkspaceError, match=NOT_A_SEARCH_RECORD):
        SearchRecord.read(path)


def verdict(off, passed=True):
    return VerdictRecord(tuple(sorted(off)), passed, ({"inputs": "sample0_inputs.npz", "passed": passed},),
                         {"max_rel": 0.5}, 0.25)


def test_a_damaged_verdict_is_named(tmp_path):
    store = VerdictStore(tmp_path / "probe", {"stage": "probe"})
    store.write(verdict(["a"]))
    store.path(frozenset(["a"])).write_text('{"passed": tr')
    with pytest.raises(WorkspaceError, match=r"verdict.json: damaged JSON .*delete .* and rerun"):
        store.read(frozenset(["a"]))


def test_the_verdict_record_is_versioned(tmp_path):
    store = VerdictStore(tmp_path / "probe", {"stage": "probe"})
    store.write(verdict(["b", "a"], passed=False))
    path = store.path(frozenset(["a", "b"]))
    written = json.loads(path.read_text())
    assert list(written) == ["format", "off", "passed", "samples", "worst", "seconds"] and written["format"] == 1
    assert store.read(frozenset(["a", "b"])) == verdict(["a", "b"], passed=False)
    for damaged in ({**written, "format": 2}, {key: value for key, value in written.items() if key != "worst"}, [1]):
        path.write_text(json.dumps(damaged))
        with pytest.raises(WorkspaceError, match=r"verdict.json: not a verdict of this accubisect version \(.*\); "
                                                 r"delete .*probe/[0-9a-f]{16} and rerun to rebuild it$"):
            store.read(frozenset(["a", "b"]))


def test_what_the_backend_did_not_apply_is_kept_with_the_verdict(tmp_path):
    """An OpenVINO probe's dropped marks are part of its verdict: a rerun that reads it back still knows them."""
    store = VerdictStore(tmp_path / "precision_probe", {"stage": "precision_probe"})
    judged = {"passed": False, "samples": [{"inputs": "sample0_inputs.npz", "passed": False}],
              "worst": {"max_rel": 0.5}, "not_applied": ["fc"]}
    store.write(VerdictRecord.of(frozenset(["fc", "conv"]), judged, 0.25))
    assert json.loads(store.path(frozenset(["conv", "fc"])).read_text())["not_applied"] == ["fc"]
    assert store.read(frozenset(["conv", "fc"])).not_applied == ("fc",)


def test_a_verdict_written_before_the_format_field_is_still_found(tmp_path):
    """Verdicts already on disk keep their keys and their layout: the search goes on from them."""
    store = VerdictStore(tmp_path / "probe", {"stage": "probe", "model": "m"})
    names, groups = ["a", "b", "c"], [frozenset(["b"])]
    first = run(tmp_path, names, groups)
    for probe in first.probes:
        path = store.path(frozenset(probe["off"]))
        path.write_text(json.dumps({key: value for key, value in json.loads(path.read_text()).items()
                                    if key != "format"}))
    calls = []
    again = run(tmp_path, names, groups, calls=calls)
    assert calls == [] and again.culprits == first.culprits == ("b",)


def test_verdict_keys_are_those_on_disk_before_the_records_were_typed(tmp_path):
    """The key is a hash of the store's key and `off`, as the workspace's verdicts were written."""
    store = VerdictStore(tmp_path / "probe", {"stage": "probe", "model": "m"})
    assert store.key_of(frozenset(["b", "a"])) == stage_key(stage="probe", model="m", off=["a", "b"])


def test_a_search_record_missing_a_field_is_refused_in_one_line(tmp_path):
    record = run(tmp_path, ["a", "b"], [frozenset(["a"])])
    path = tmp_path / "search.json"
    path.write_text(json.dumps({key: value for key, value in record.to_json().items() if key != "groups"}))
    with pytest.raises(WorkspaceError, match=NOT_A_SEARCH_RECORD):
        SearchRecord.read(path)
