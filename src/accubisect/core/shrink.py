"""The reduce search's strategy: a bisection over positions in node order, pure and replayable.

`snakemake reduce` shrinks a failing model twice (bisection/reduce.py): from the outputs side it looks for
the earliest cut of the node order at which the prefix already fails; from the inputs side, for the latest
start from which the failing outputs, computed from the reference's own tensors, still fail. Both are one
question over positions 0..n-1 whose one end is known to fail: where does the failing run end? `next_step`
answers it from the verdicts known so far (position -> failed), with no state of its own: replaying the
verdicts on disk rebuilds the search exactly, and a test drives it with made-up verdicts.

The verdicts need not be monotone (error can vanish downstream, a cut can split a fusion that broke
accuracy): the answer is always a position probed and found failing, whose neighbour towards the other
end was probed and passed (or is the end itself), so it is a real failing subgraph and locally minimal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

EARLIEST, LATEST = "earliest", "latest"  # which failing position a search looks for


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
    mirror = (lambda p: p) if want == EARLIEST else (lambda p: n - 1 - p)  # noqa: E731
    seen = {mirror(p): verdict for p, verdict in failed.items() if 0 <= p < n}
    step = _earliest(n, seen, None if hint is None else mirror(hint))
    return type(step)(mirror(step.position))


def _earliest(n: int, failed: Mapping[int, bool], hint: int | None) -> Probe | Found:
    """`next_step` for EARLIEST, on positions already mirrored."""
    if n - 1 not in failed:
        return Probe(n - 1)
    if not failed[n - 1]:
        raise ValueError(f"position {n - 1}, the end known to fail, passed")
    bad = min(p for p, verdict in failed.items() if verdict)
    good = max((p for p, verdict in failed.items() if not verdict and p < bad), default=-1)
    if bad - good <= 1:
        return Found(bad)
    if hint is not None and good < hint < bad and hint not in failed:
        return Probe(hint)
    return Probe((good + bad) // 2)
