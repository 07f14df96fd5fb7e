"""The search job's loop (`bisection.search`) over fake verdicts and real verdict files: resuming from disk,
budgets and the best answer so far, the search record's format. The probes of the workflow's own runs
are exercised end to end in test_fusion_bisect_e2e.py and test_precision_e2e.py."""

import json
import random

import pytest

from accubisect.bisection.search import (
    UNFINISHED,
    Budget,
    PreconditionError,
    SearchRecord,
    VerdictStore,
    answer_status,
    search,
)
from accubisect.core.errors import WorkspaceError
from accubisect.core.strategy import FOUND


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
    return search("fusion_bisect", ranking(names), False, store, prober(groups, calls), parallel, 2, budget)


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


def test_the_search_record_is_versioned(tmp_path):
    record = run(tmp_path, ["a", "b"], [frozenset(["a"])])
    path = tmp_path / "search.json"
    path.write_text(json.dumps(record.to_json()))
    assert SearchRecord.read(path) == record
    path.write_text(json.dumps({**record.to_json(), "format": 0}))
    with pytest.raises(WorkspaceError, match=r"search.json: not a search record of this accubisect version; delete"):
        SearchRecord.read(path)


def test_a_damaged_verdict_is_named(tmp_path):
    store = VerdictStore(tmp_path / "probe", {"stage": "probe"})
    store.write(frozenset(["a"]), {"passed": True})
    store.path(frozenset(["a"])).write_text('{"passed": tr')
    with pytest.raises(WorkspaceError, match=r"verdict.json: damaged JSON .*delete .* and rerun"):
        store.read(frozenset(["a"]))
