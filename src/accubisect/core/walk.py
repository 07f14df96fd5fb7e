"""Which reduced nodes to keep in fp32 on real kernels: walking the ranking, as a pure function.

Real kernels (OpenVINO's bf16) fail by error piling up over many nodes as often as by one culprit, which costs
group testing (`core/strategy.py`) thousands of probes (yolov8n bf16: 1699). The walk searches the ranking
instead, most suspect first: nothing kept passes (nothing to keep), or all kept fails (the answer is not among
the candidates), else the shortest top of the ranking that passes (`core.shrink`, a bisection over its
length), then each of those nodes given back to the reduced type, least suspect first, and left there when
the model still passes, pass after pass until a pass gives none back: 1-minimal, each node left probed
needed. A configuration is the set kept (switched off its reduction). Like `strategy.next_probes`,
`next_keep` is a generator of rounds replayed over the verdicts known so far (`strategy.replay`), one probe a
round. Its last part alone is a strategy too, `given_back`: from every candidate kept, a configuration known to
pass (precision_deploy's carried answer, `bisection/deploy_settle.py`), each node given back, to 1-minimal.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence

from accubisect.core.shrink import LATEST, Found, next_step, unresolved
from accubisect.core.strategy import FOUND, NOT_AMONG_CANDIDATES, Configuration, Outcome, Round, Rounds, replay


def next_keep(ranked: Sequence[str], verdicts: Mapping[Configuration, bool], parallel: int = 1) -> Round | Outcome:
    """The next configuration to probe, or the walk's Outcome (`parallel` is ignored: each probe decides the
    next). `ranked`: the candidates, most suspect first."""
    return replay(_walk(tuple(ranked)), verdicts)


def given_back(ranked: Sequence[str], verdicts: Mapping[Configuration, bool], parallel: int = 1) -> Round | Outcome:
    """The next configuration to probe, or the Outcome, of the walk's last part alone: every candidate of `ranked`
    (most suspect first) kept, asked first, then each given back, least suspect first, pass after pass. FOUND:
    the nodes left, each probed needed; NOT_AMONG_CANDIDATES: keeping every candidate fails. Its passing
    configurations shrink one into the next, so the one with the fewest kept is always where it has got to: a
    search its budget stops keeps that one (`search.unfinished`). `parallel` is ignored."""
    return replay(_from_everything(tuple(ranked)), verdicts)


def _from_everything(ranked: tuple[str, ...]) -> Rounds:
    everything = frozenset(ranked)
    if not (yield Round([everything], len(ranked), "verify", ranked))[everything]:
        return Outcome(NOT_AMONG_CANDIDATES)
    return Outcome(FOUND, tuple((yield from _given_back(list(ranked)))))


def _walk(ranked: tuple[str, ...]) -> Rounds:
    nothing, everything = frozenset(), frozenset(ranked)
    if (yield Round([nothing], len(ranked)))[nothing]:
        return Outcome(FOUND)
    if not (yield Round([everything], len(ranked)))[everything]:
        return Outcome(NOT_AMONG_CANDIDATES)
    top = yield from _shortest_passing_top(ranked)
    return Outcome(FOUND, tuple((yield from _given_back(top))))


def _shortest_passing_top(ranked: tuple[str, ...]) -> Generator[Round, dict[Configuration, bool], list[str]]:
    """The shortest top of `ranked` that passes kept in fp32, knowing none of it fails and all of it passes."""
    failed = {0: True, len(ranked): False}
    while not isinstance(step := next_step(len(ranked) + 1, failed, LATEST), Found):
        top = frozenset(ranked[:step.position])
        left = unresolved(len(ranked) + 1, failed, LATEST)
        failed[step.position] = not (yield Round([top], left, "top"))[top]
    return list(ranked[:step.position + 1])


def _given_back(kept: list[str]) -> Generator[Round, dict[Configuration, bool], list[str]]:
    """`kept`, less each node (least suspect first) whose return to the reduced type still passes, pass after
    pass until one gives none back: then every node left was probed needed in the set as it is (1-minimal)."""
    while True:
        before = kept
        for name in reversed(before):
            fewer = frozenset(other for other in kept if other != name)
            if (yield Round([fewer], len(kept), "minimality", tuple(kept)))[fewer]:
                kept = [other for other in kept if other != name]
        if kept == before:
            return kept
