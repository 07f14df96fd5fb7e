"""The search strategy against an oracle, over thousands of random cases: no ONNX, no files."""

import math
import os
import random
import subprocess
import sys

import pytest

from accubisect.core.strategy import FOUND, NOT_AMONG_CANDIDATES, Outcome, next_probes


def oracle(groups):
    """The model passes when every failing group has a member switched off."""
    return lambda off: all(group & off for group in groups)


def search(candidates, groups, parallel):
    passes = oracle([frozenset(g) for g in groups])
    verdicts, rounds = {}, 0
    while not isinstance(step := next_probes(candidates, verdicts, parallel), Outcome):
        rounds += 1
        for config in step.probes:
            assert config not in verdicts, "a configuration was probed twice"
            verdicts[config] = passes(config)
    return step, len(verdicts), rounds


def probe_bound(n, singles, pairs, parallel):
    """Adaptive group testing needs about k*log2(N/k)+k probes for k culprits of N. Splitting into
    parallel+1 parts costs parallel/log2(parallel+1) times more probes for fewer rounds. On top: the
    guess, the all-off check, the final verification and one minimality check per culprit."""
    widen = parallel / math.log2(parallel + 1)
    search_cost = 2 * widen * (singles * math.log2(n / singles) + singles) if singles else 0
    pair_cost = pairs * (3 * widen * math.ceil(math.log2(n)) + 4)
    return search_cost + pair_cost + singles + 4


def random_case(rng):
    n = rng.randint(1, 64)
    names = [f"rule{i}" for i in range(n)]
    singles = rng.sample(names, rng.randint(0, min(4, n)))
    rest = [name for name in names if name not in singles]
    pairs = [rng.sample(rest, 2)] if len(rest) >= 2 and rng.random() < 0.3 else []
    rng.shuffle(names)  # the ranking knows nothing here
    return names, singles, pairs, rng.choice([1, 2, 3, 4])


@pytest.mark.parametrize("seed", range(10))
def test_finds_every_culprit_and_group_minimally(seed):
    rng = random.Random(seed)
    for _ in range(120):
        candidates, singles, pairs, parallel = random_case(rng)
        answer, probes, _ = search(candidates, [[s] for s in singles] + pairs, parallel)
        assert answer.status == FOUND
        off = set(answer.culprits)
        assert set(singles) <= off
        assert all(len(off & set(pair)) == 1 for pair in pairs)
        assert len(off) == len(singles) + len(pairs)
        if candidates[0] not in {member for pair in pairs for member in pair}:  # else the guess ends the search
            assert [set(group) for group in answer.groups] == [set(pair) for pair in pairs]
        passes = oracle([frozenset([s]) for s in singles] + [frozenset(p) for p in pairs])
        assert passes(frozenset(off)) and not any(passes(frozenset(off - {c})) for c in off)
        assert probes <= probe_bound(len(candidates), len(singles), len(pairs), parallel)


def test_a_correctly_ranked_single_culprit_takes_one_probe():
    candidates = ["GeluApproximation", "MatMulAddFusion", "LayerNormFusion", "GeluFusion"]
    answer, probes, rounds = search(candidates, [["GeluApproximation"]], parallel=1)
    assert answer.culprits == ("GeluApproximation",)
    assert probes == 2 and rounds == 2  # nothing off (known from compare), then the guess
    answer, probes, rounds = search(candidates, [["GeluApproximation"]], parallel=2)
    assert probes == 3 and rounds == 2  # the guess and all off share one round


def test_more_probes_per_round_means_fewer_rounds():
    rng = random.Random(7)
    totals = {1: 0, 4: 0}
    for _ in range(200):
        n = rng.randint(16, 64)
        names = [f"r{i}" for i in range(n)]
        culprits = [[c] for c in rng.sample(names, 3)]
        for parallel in totals:
            totals[parallel] += search(names, culprits, parallel)[2]
    assert totals[4] < 0.75 * totals[1]


def test_nothing_to_switch_off_when_all_on_passes():
    assert search(["a", "b"], [], parallel=2)[0] == Outcome(FOUND)


def test_culprits_outside_the_candidates_are_reported():
    answer, _, _ = search(["a", "b", "c"], [["elsewhere"]], parallel=2)
    assert answer.status == NOT_AMONG_CANDIDATES


def test_next_probes_is_pure():
    candidates = [f"r{i}" for i in range(20)]
    passes = oracle([frozenset(["r7"]), frozenset(["r13"])])
    verdicts = {}
    while not isinstance(step := next_probes(candidates, verdicts, 2), Outcome):
        assert next_probes(candidates, dict(verdicts), 2) == step
        verdicts.update({config: passes(config) for config in step.probes})
    assert step.culprits == ("r7", "r13")


PROBE_ORDER = """
import json, random
from accubisect.core.strategy import Outcome, next_probes
names = [f"rule{i}" for i in range(40)]
groups = [frozenset(g) for g in ({"rule3"}, {"rule17"}, {"rule29", "rule30"}, {"rule8"})]
verdicts, order = {}, []
while not isinstance(step := next_probes(names, verdicts, 3), Outcome):
    for config in step.probes:
        order.append(sorted(config))
        verdicts[config] = all(group & config for group in groups)
print(json.dumps(order))
"""


def test_the_probes_and_their_order_do_not_depend_on_the_hash_seed():
    """Round plans are files a resumed run must write again byte for byte: no set order may leak into them."""
    orders = {subprocess.run([sys.executable, "-c", PROBE_ORDER], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(orders) == 1


@pytest.mark.parametrize("seed", range(4))
def test_progress_never_rises_within_a_phase(seed):
    """The console's "suspects left" and "culprits so far" come from the rounds: within one phase (one
    partner search, in the groups phase) suspects never rise and culprits are never lost."""
    rng = random.Random(seed)
    for _ in range(120):
        candidates, singles, pairs, parallel = random_case(rng)
        passes = oracle([frozenset([s]) for s in singles] + [frozenset(p) for p in pairs])
        verdicts, previous = {}, None
        while not isinstance(step := next_probes(candidates, verdicts, parallel), Outcome):
            if previous and previous.phase == step.phase and previous.culprits == step.culprits:
                assert step.suspects <= previous.suspects, (previous, step)
            if previous and previous.phase == step.phase == "singles":
                assert set(previous.culprits) <= set(step.culprits)
            verdicts.update({config: passes(config) for config in step.probes})
            previous = step
