"""The walk over the ranking (`core/walk.py`), driven by made-up verdicts: what it answers passes and is
1-minimal, it asks no configuration twice, and where passing is monotone it finds exactly the nodes needed; its
last part alone (`given_back`, from every candidate kept) the same, and stopped anywhere, the passing
configuration with the fewest kept is where it had got to."""

import random

import pytest

from accubisect.core.strategy import FOUND, NOT_AMONG_CANDIDATES, Outcome
from accubisect.core.walk import given_back, next_keep


def walk(ranked, passes, strategy=next_keep):
    """The walk (or `strategy`) to its Outcome, and the configurations it asked for, in order."""
    known, asked = {}, []
    while not isinstance(step := strategy(ranked, known), Outcome):
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


def made_up(rng, ranked):
    """Verdicts over subsets of `ranked`, kept passing: a random set needed, and random sets that fail anyway
    (passing is not monotone); keeping every node passes."""
    needed = set(rng.sample(ranked, rng.randint(0, min(5, len(ranked)))))
    noise = {frozenset(rng.sample(ranked, rng.randint(0, len(ranked)))) for _ in range(rng.randint(0, 8))}
    return lambda kept: needed <= kept and kept not in noise or kept == frozenset(ranked)


@pytest.mark.parametrize("seed", range(300))
def test_given_back_from_every_candidate_kept_ends_1_minimal_each_node_left_probed_needed(seed):
    rng = random.Random(seed)
    ranked = [f"n{i}" for i in range(rng.randint(0, 25))]
    passes = made_up(rng, ranked)
    outcome, asked = walk(ranked, passes, given_back)
    kept = frozenset(outcome.culprits)
    assert outcome.status == FOUND and passes(kept) and list(outcome.culprits) == [n for n in ranked if n in kept]
    assert asked[0] == frozenset(ranked) and len(asked) == len(set(asked))
    assert asked[1:2] == [frozenset(ranked[:-1])][:len(ranked)]  # the least suspect given back first
    assert all(kept - {name} in asked and not passes(kept - {name}) for name in kept)  # each probed needed
    monotone = walk(ranked, lambda config: passes(frozenset(ranked)) and kept <= config, given_back)[0]
    assert monotone == Outcome(FOUND, outcome.culprits)


@pytest.mark.parametrize("seed", range(200))
def test_given_back_stopped_by_a_budget_has_got_to_its_passing_configuration_with_the_fewest_kept(seed):
    """Its passing configurations shrink one into the next: the one with the fewest kept, what a search its
    budget stops answers (`search.unfinished`), is where the walk had got to, and going on from the verdicts
    known ends where the walk run through ends."""
    rng = random.Random(seed)
    ranked = [f"n{i}" for i in range(rng.randint(1, 25))]
    passes = made_up(rng, ranked)
    outcome, asked = walk(ranked, passes, given_back)
    stop = rng.randint(1, len(asked))
    passing = [config for config in asked[:stop] if passes(config)]
    assert all(later < earlier for earlier, later in zip(passing, passing[1:], strict=False))
    best = min(passing, key=len)
    assert best == passing[-1] and frozenset(outcome.culprits) <= best
    resumed = walk(ranked, passes, lambda ranked, known: given_back(
        ranked, {**known, **{config: passes(config) for config in asked[:stop]}}))[0]
    assert resumed == outcome


def test_given_back_asks_every_candidate_kept_first_and_ends_there_when_it_fails():
    outcome, asked = walk(["a", "b"], lambda kept: False, given_back)
    assert outcome.status == NOT_AMONG_CANDIDATES and asked == [frozenset({"a", "b"})]


def test_the_top_rounds_count_the_lengths_the_shortest_passing_top_may_still_have():
    """Ten candidates, the top three needed (monotone): the top passing lies among 10 lengths, 5, then 3."""
    ranked = [f"n{i}" for i in range(10)]
    known, suspects = {}, []
    while not isinstance(step := next_keep(ranked, known), Outcome):
        if step.phase == "top":
            suspects.append(step.suspects)
        known.update({config: {"n0", "n1", "n2"} <= config for config in step.probes})
    assert suspects == [10, 5, 3] and step.culprits == ("n0", "n1", "n2")
