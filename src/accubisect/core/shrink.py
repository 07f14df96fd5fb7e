"""The reduce search's strategy: a bisection over positions in node order, pure and replayable.

`snakemake reduce` shrinks a failing model twice (bisection/reduce.py): from the outputs side it looks for
the earliest cut of the node order at which the prefix already fails; from the inputs side, for the latest
start from which the failing outputs, computed from the reference's own tensors, still fail. Both are one
question over positions 0..n-1 whose one end is known to fail: where does the failing run end? `next_step`
answers it from the verdicts known so far (position -> failed), with no state of its own: replaying the
verdicts on disk rebuilds the search exactly, and a test drives it with made-up verdicts. `next_cut` asks the
same question as the driver's strategies do (`core/strategy.py`): a generator of rounds over configurations,
one a position, replayed over the verdicts known (`strategy.replay`); `core/walk.py` bisects this way too.

The verdicts need not be monotone (error can vanish downstream, a cut can split a fusion that broke
accuracy): the answer is always a position probed and found failing, whose neighbour towards the other
end was probed and passed (or is the end itself), so it is a real failing subgraph and locally minimal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from accubisect.core.strategy import Configuration, Outcome, Round, Rounds, replay

EARLIEST, LATEST = "earliest", "latest"  # which failing position a search looks for
OUTPUTS, INPUTS = "outputs", "inputs"  # reduce's two sides, each one search: the phase of its rounds
CUT_FOUND = "cut found"  # `next_cut`'s Outcome: its culprits are the configuration of the position found


@dataclass(frozen=True)
class Probe:
    position: int


@dataclass(frozen=True)
class Found:
    position: int  # failing, and its neighbour towards the far end passes (or there is none)


def next_step(n: int, failed: Mapping[int, bool], want: str, hint: int | None = None) -> Probe | Found:
    """The next position to probe, or the answer. `want` EARLIEST: the smallest failing position, the last
    one (n - 1) failing; LATEST: the largest, position 0 failing. The known end is probed first if its
    verdict is not known; a `hint` (where the evidence says the boundary is) is probed next if it lies
    strictly inside the unresolved interval. An end that turns out to pass is an error of the caller's: it
    raises ValueError."""
    if n < 1:
        raise ValueError(f"nothing to search: {n} positions")
    if want not in (EARLIEST, LATEST):
        raise ValueError(f"want must be {EARLIEST!r} or {LATEST!r}, not {want!r}")
    mirror = _mirror(n, want)
    seen = {mirror(p): verdict for p, verdict in failed.items() if 0 <= p < n}
    step = _earliest(n, seen, None if hint is None else mirror(hint))
    return type(step)(mirror(step.position))


def _mirror(n: int, want: str) -> Callable[[int], int]:
    """Positions as EARLIEST sees them: as they are, or (LATEST) counted from the other end."""
    return (lambda p: p) if want == EARLIEST else (lambda p: n - 1 - p)


def _interval(n: int, failed: Mapping[int, bool]) -> tuple[int, int]:
    """On mirrored positions: the failing position nearest the start (n - 1 while none is known), and the
    passing one nearest it before it (-1: none); the answer lies after the one, up to and including the other."""
    bad = min((p for p, verdict in failed.items() if verdict), default=n - 1)
    return bad, max((p for p, verdict in failed.items() if not verdict and p < bad), default=-1)


def _earliest(n: int, failed: Mapping[int, bool], hint: int | None) -> Probe | Found:
    """`next_step` for EARLIEST, on positions already mirrored."""
    if n - 1 not in failed:
        return Probe(n - 1)
    if not failed[n - 1]:
        raise ValueError(f"position {n - 1}, the end known to fail, passed")
    bad, good = _interval(n, failed)
    if bad - good <= 1:
        return Found(bad)
    if hint is not None and good < hint < bad and hint not in failed:
        return Probe(hint)
    return Probe((good + bad) // 2)


def next_cut(configs: Sequence[Configuration], verdicts: Mapping[Configuration, bool], want: str,
             hint: int | None = None, phase: str = "") -> Round | Outcome:
    """`next_step` as a strategy over configurations: `configs[p]` is the configuration probed at position p, and
    `verdicts` maps a configuration to whether it passed (a pass: no failure there). The known end (n - 1 for
    EARLIEST, 0 for LATEST) is the configuration with nothing off, frozenset(), which the driver knows before
    the first round (its `nothing_off_passes`); its own configuration is never asked for. One probe a round,
    `phase` naming it; `suspects` is how many positions the answer may still be. `configs` may build each
    configuration when first indexed (a cut of a large model): only the positions probed are. The Outcome
    (CUT_FOUND) names the position found by its configuration: `culprits` are that configuration's members."""
    return replay(_cut(configs, want, hint, phase), verdicts)


def _cut(configs: Sequence[Configuration], want: str, hint: int | None, phase: str) -> Rounds:
    n, nothing = len(configs), frozenset()
    failed = {n - 1 if want == EARLIEST else 0: not (yield Round([nothing], n, phase))[nothing]}
    while not isinstance(step := next_step(n, failed, want, hint), Found):
        config = configs[step.position]
        failed[step.position] = not (yield Round([config], unresolved(n, failed, want), phase))[config]
    return Outcome(CUT_FOUND, tuple(sorted(configs[step.position])))


def unresolved(n: int, failed: Mapping[int, bool], want: str) -> int:
    """How many positions the answer may still be: after the passing position nearest to the failing one that
    is nearest the far end, up to and including that failing one (mirrored for LATEST)."""
    mirror = _mirror(n, want)
    bad, good = _interval(n, {mirror(p): verdict for p, verdict in failed.items()})
    return bad - good
