"""Which fusion rules (or, later, nodes) to switch off: adaptive group testing as a pure function.

A *configuration* is the set of candidates switched off; its verdict says whether the model then passes
the accuracy check. The model fails when some *group* of candidates is all switched on: a single culprit
is a group of one; two rules that only break accuracy together are a group of two. The answer is a set of
candidates to switch off that hits every group, verified to pass, and 1-minimal: switching any one of
them back on fails.

`next_probes(candidates, verdicts, parallel)` is a pure function: the search is written as a generator
that asks for verdicts round by round, and is replayed from the start over the verdicts known so far. It
returns the next Round (configurations to probe in parallel, and how many candidates are still suspect),
or the Outcome. A configuration already judged is never asked for again.

Phases, each skipped when it has nothing to do:
0. guess — switch off only the likeliest candidate (candidates come ranked, most suspect first). If that
   passes it is the answer, found in one probe; whether the culprit also needs partners to fail (e.g.
   GeluApproximation needs the Gelu that GeluFusion makes) is then not searched.
1. singles — split the suspects into parts, probe each part alone switched on; a part that fails holds a
   culprit and is split again, down to single culprits (adaptive group testing).
2. groups — while switching off the culprits found is not enough, find a minimal set of candidates that
   fails when switched on together (prefix search) and switch off its likeliest member.
3. minimality — switch each chosen candidate back on alone; drop any whose return still passes.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace

Configuration = frozenset[str]  # the candidates switched off
Rounds = Generator["Round", dict[Configuration, bool], "Outcome"]  # a search as the rounds it asks for

FOUND = "found"
NOT_AMONG_CANDIDATES = "not_among_candidates"  # even with every candidate off the model fails


@dataclass(frozen=True)
class Round:
    """Configurations to probe together, the phase asking for them (guess, singles, verify, groups,
    minimality; `core/walk.py`'s top), how many candidates that phase still suspects (never more than in its
    previous round), and the culprits found so far."""

    probes: list[Configuration]
    suspects: int
    phase: str = "guess"
    culprits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What the search ends with: its status, the culprits to switch off and the groups (the bisection verifies
    and publishes it as its answer)."""

    status: str
    culprits: tuple[str, ...] = ()  # switch these off
    groups: tuple[tuple[str, ...], ...] = field(default=())  # candidates that fail only together


def next_probes(candidates: Sequence[str], verdicts: Mapping[Configuration, bool],
                parallel: int = 1) -> Round | Outcome:
    """The next round of configurations to probe, or the search's Outcome. `verdicts` maps a configuration to
    whether the model passed with it."""
    return replay(_search(tuple(candidates), max(1, parallel)), verdicts)


def replay(search: Rounds, verdicts: Mapping[Configuration, bool]) -> Round | Outcome:
    """A search written as a generator of rounds, replayed from its start over the verdicts known: its first
    round with a configuration not known yet (those only), or its Outcome."""
    try:
        step = next(search)
        while True:
            unknown = list(dict.fromkeys(c for c in step.probes if c not in verdicts))
            if unknown:
                return replace(step, probes=unknown)
            step = search.send({c: verdicts[c] for c in step.probes})
    except StopIteration as done:
        return done.value


def _search(candidates: tuple[str, ...], parallel: int) -> Rounds:
    everything, nothing = frozenset(candidates), frozenset()
    if (yield Round([nothing], len(candidates)))[nothing]:
        return Outcome(FOUND)  # passes with every candidate on: nothing to switch off
    if not candidates:
        return Outcome(NOT_AMONG_CANDIDATES)
    guess = frozenset(candidates[:1])
    verdicts = yield Round([guess, everything] if parallel > 1 else [guess], len(candidates))
    if verdicts[guess]:
        return Outcome(FOUND, candidates[:1])  # 1-minimal: with nothing off it fails
    if everything not in verdicts:
        verdicts = yield Round([everything], len(candidates))
    if not verdicts[everything]:
        return Outcome(NOT_AMONG_CANDIDATES)
    culprits = yield from _singles(candidates, parallel)
    culprits, groups = yield from _groups(candidates, culprits, parallel)
    culprits = yield from _minimal(candidates, culprits)
    return Outcome(FOUND, tuple(c for c in candidates if c in culprits), tuple(groups))


def _on(candidates: tuple[str, ...], on: Sequence[str], off: Configuration = frozenset()) -> Configuration:
    """The configuration in which only `on`, less `off`, is switched on."""
    return frozenset(candidates) - (frozenset(on) - off)


def _split(pool: tuple[str, ...], parts: int) -> list[tuple[str, ...]]:
    parts = min(parts, len(pool))
    size, extra = divmod(len(pool), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [pool[bounds[i]:bounds[i + 1]] for i in range(parts)]


TESTED, INFERRED, UNKNOWN = "tested", "inferred", "unknown"


def _singles(candidates: tuple[str, ...], parallel: int) -> Generator[Round, dict[Configuration, bool], set[str]]:
    """Phase 1. A pool is a tuple of suspects that fails switched on alone: as probed (TESTED), as
    inferred because its probed siblings passed (INFERRED), or not yet known (UNKNOWN). Only a TESTED
    single is a culprit; a wrong inference (a group split across pools) just finds nothing here."""
    pools: list[tuple[tuple[str, ...], str]] = [(candidates, TESTED)]
    culprits: set[str] = set()
    while True:
        culprits |= {pool[0] for pool, state in pools if len(pool) == 1 and state == TESTED}
        pools = [(pool, state) for pool, state in pools if len(pool) > 1 or state != TESTED]
        if not pools:
            return culprits
        probes: dict[tuple[str, ...], Configuration] = {}
        for pool, state in pools:
            whole = state == UNKNOWN or len(pool) == 1
            for part in [pool] if whole else _split(pool, parallel + 1)[:-1]:
                probes[part] = _on(candidates, part)
        verdicts = yield Round(list(probes.values()), len(culprits) + sum(len(pool) for pool, _ in pools), "singles",
                               _ordered(candidates, culprits))
        fails = {part: not verdicts[config] for part, config in probes.items()}
        pools = [following for pool in pools for following in _after(pool, fails, parallel)]


def _after(pool: tuple[tuple[str, ...], str], fails: dict[tuple[str, ...], bool], parallel: int):
    """The pools that follow from one pool once its probes are judged."""
    suspects, state = pool
    if suspects in fails:  # the pool was probed whole
        return [(suspects, TESTED)] if fails[suspects] else []
    *probed, last = _split(suspects, parallel + 1)
    return [(part, TESTED) for part in probed if fails[part]] + [
        (last, UNKNOWN if any(fails[part] for part in probed) else INFERRED)
    ]


def _groups(candidates: tuple[str, ...], culprits: set[str], parallel: int):
    """Phase 2: until switching off `culprits` passes, find a minimal failing set among the others and
    switch off its likeliest member."""
    groups: list[tuple[str, ...]] = []
    while True:
        off = frozenset(culprits)
        if (yield Round([off], len(culprits), "verify", _ordered(candidates, culprits)))[off]:
            return culprits, groups
        rest = tuple(c for c in candidates if c not in culprits)
        group = yield from _minimal_failing_set(candidates, rest, off, parallel, culprits)
        culprits.add(group[0])
        if len(group) > 1:
            groups.append(group)


def _minimal_failing_set(candidates: tuple[str, ...], suspects: tuple[str, ...], off: Configuration, parallel: int,
                         culprits: set[str]):
    """A minimal set of `suspects` that fails switched on (with `off` off), knowing all of them do.
    Each member is the last of the shortest failing prefix; `parallel` prefixes are probed per round."""
    members: list[str] = []
    while True:
        if members:
            config = _on(candidates, members, off)
            check = Round([config], len(members) + len(suspects), "groups", _ordered(candidates, culprits))
            if not (yield check)[config]:
                return tuple(sorted(members, key=candidates.index))
        low, high = 0, len(suspects)  # the shortest failing prefix has a length in (low, high]
        while high - low > 1:
            points = sorted({low + (high - low) * i // (parallel + 1) for i in range(1, parallel + 1)} - {low})
            configs = {p: _on(candidates, [*members, *suspects[:p]], off) for p in points}
            verdicts = yield Round(list(configs.values()), len(members) + high, "groups",
                                   _ordered(candidates, culprits))
            high = min((p for p in points if not verdicts[configs[p]]), default=high)
            low = max((p for p in points if p < high), default=low)
        members.append(suspects[high - 1])
        suspects = suspects[: high - 1]


def _minimal(candidates: tuple[str, ...], culprits: set[str]):
    """Phase 3: switching any one culprit back on must fail; drop the least suspect that does not."""
    while True:
        checks = {c: frozenset(culprits - {c}) for c in sorted(culprits, key=candidates.index)}
        verdicts = yield Round(list(checks.values()), len(culprits), "minimality", _ordered(candidates, culprits))
        redundant = [c for c in candidates if c in checks and verdicts[checks[c]]]
        if not redundant:
            return culprits
        culprits = culprits - {redundant[-1]}


def _ordered(candidates: tuple[str, ...], chosen: set[str]) -> tuple[str, ...]:
    return tuple(c for c in candidates if c in chosen)
