"""The walk over the ranking (`core/walk.py`), driven by made-up verdicts: what it answers passes and is
1-minimal, it asks no configuration twice, and where passing is monotone it finds exactly the nodes needed."""

import random

import pytest

from accubisect.core.strategy import FOUND, NOT_AMONG_CANDIDATES, Outcome
from accubisect.core.walk import next_keep


def walk(ranked, passes):
    """The walk to its Outcome, and the configurations it asked for, in order."""
    known, asked = {}, []
    while not isinstance(step := next_keep(ranked, known), Outcome):
        assert len(step.probes) == 1 and step.probes[0] not in known
        asked += step.probes
        known.update({config: passes(config) for config in step.probes})
    return step, asked


@pytest.mark.parametrize("seed", range(300))
def test_the_answer_passes_and_each_node_in_it_is_needed(seed):
    rng = random.Random(seed)
    ranked = [f"n{i}" for i in range(rng.randint(1, 30))]
    needed = set(rng.sample(ranked, rng.randint(1, min(5, len(ranked)))))
    noise = {frozenset(rng.sample(ranked, rng.randint(0, len(ranked)))) for _ in range(5)}  # not monotone

    def passes(kept):
        return needed <= kept and kept not in noise or kept == frozenset(ranked)

    outcome, asked = walk(ranked, passes)
    kept = frozenset(outcome.culprits)
    assert outcome.status == FOUND and passes(kept)
    assert all(not passes(kept - {name}) for name in kept)  # 1-minimal
    assert len(asked) == len(set(asked))


@pytest.mark.parametrize("seed", range(100))
def test_where_passing_is_monotone_it_keeps_exactly_the_nodes_needed_in_ranking_order(seed):
    rng = random.Random(seed)
    ranked = [f"n{i}" for i in range(rng.randint(1, 40))]
    needed = set(rng.sample(ranked, rng.randint(1, min(6, len(ranked)))))
    outcome, _ = walk(ranked, lambda kept: needed <= kept)
    assert outcome == Outcome(FOUND, tuple(name for name in ranked if name in needed))


def test_nothing_kept_passing_asks_one_probe_and_all_kept_failing_is_not_among_the_candidates():
    assert walk(["a", "b"], lambda kept: True) == (Outcome(FOUND), [frozenset()])
    outcome, asked = walk(["a", "b"], lambda kept: False)
    assert outcome.status == NOT_AMONG_CANDIDATES and asked == [frozenset(), frozenset({"a", "b"})]
