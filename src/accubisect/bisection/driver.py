"""The one driver of every search (`protocol.Search`): the parts that do not depend on what is searched.

A search supplies its candidates, their ranking with the evidence, its preconditions, its prober and what it
must know first (`Search`); `drive` runs them in that order and then the pure strategy round by round
(`search.search`, group testing unless the search walks otherwise: the progress lines, the verdict store and
resume, the probe budget). `judged_again` is an answer's re-verification: probed anew on every sample,
whatever the store holds (a search that writes its answer as a model judges that very model instead, as
`instances.verify` does). fusion_bisect and precision_bisect (`jobs.py`), precision_deploy's two passes in
the user's model (`deploy_settle.py`: the carried answer's nodes given back one by one, `core.walk.given_back`,
or group testing again over the user's nodes), the instance search (`instances.py`), both OpenVINO searches
(`openvino_fusion.py`, `openvino_precision.py`) and reduce's two sides (`reduce_search.py`: a bisection of the
node order each, `core.shrink.next_cut`, with no probe budget) run here.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from accubisect.bisection.protocol import Search
from accubisect.bisection.search import Pace, Prober, judged, search
from accubisect.core.accuracy import Judged
from accubisect.core.strategy import Configuration
from accubisect.formats.search_record import SearchRecord
from accubisect.formats.verdict import VerdictStore


def drive(searched: Search, store: VerdictStore, pace: Pace) -> SearchRecord:
    """The search record of `searched`: ranking, preconditions, prober, the floor (asked only when nothing off
    fails), then the strategy's rounds at `pace` (probes side by side, threads, budget), each verdict read from
    `store` when it holds it."""
    ranking = searched.rank(searched.candidates())
    passes = searched.nothing_off_passes()
    probe = searched.prober()
    floor = None
    if passes is False and ranking:  # every sample counts: the floor's metrics are suggested as a check
        judge_whole = functools.partial(judged, functools.partial(probe, stop_early=False), store, pace.threads)
        floor = searched.floor(ranking, judge_whole, store.key_of)
    found = search(searched.name, ranking, passes, store, probe, pace, searched.strategy)
    return replace(found, floor=floor)


def judged_again(probe: Prober, off: Configuration, threads: int) -> Judged:
    """The answer re-verified: `off` probed anew and judged on every sample (a probe may stop at the first
    sample that decides its verdict, and a verdict on disk is not the model about to be published)."""
    return probe(off, threads, stop_early=False)


def failed_samples(judged: Judged) -> int:
    """How many samples a verdict judged fail: the count a refused answer's line gives."""
    return sum(not sample["passed"] for sample in judged["samples"])
