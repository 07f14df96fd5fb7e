"""The two jobs of every bisection, driving either kind (`protocol.py`): the search and the result.

`rules/fusion_bisect.smk` defines the rules once (`fusion_search`, `fusion_result`) and
`rules/precision_bisect.smk` uses them again with its own files (`precision_search`, `precision_result`);
the `bisection` param names the kind.
"""

from __future__ import annotations

from accubisect.bisection.driver import drive
from accubisect.bisection.fusion_bisect import FusionBisection
from accubisect.bisection.precision_bisect import PrecisionBisection
from accubisect.bisection.protocol import Bisection, ResultStep, SearchStep
from accubisect.bisection.search import Pace
from accubisect.core.errors import PreconditionError, StepError
from accubisect.core.strategy import NOT_AMONG_CANDIDATES
from accubisect.formats.files import write_atomic
from accubisect.formats.search_record import SearchRecord
from accubisect.formats.verdict import VerdictStore
from accubisect.reports.report_html import bisect_links, bisect_page
from accubisect.reports.run_context import PageHeader, with_context

BISECTIONS: dict[str, type[Bisection]] = {"fusion": FusionBisection, "precision": PrecisionBisection}


def bisection_of(step: SearchStep | ResultStep) -> Bisection:
    """The kind the rule's `bisection` param names, made from the step."""
    if step.bisection not in BISECTIONS:
        raise StepError(f"bisection {step.bisection!r}: not one of {sorted(BISECTIONS)}")
    return BISECTIONS[step.bisection](step)


def run_search(step: SearchStep) -> None:
    """Search job: the kind's search run by the one driver (`driver.drive`: the ranking, the preconditions, the
    noise floor, then the configurations to switch off, probed round by round in this process), into
    search.json."""
    pace = Pace.from_config(step.bisect, step.threads)
    found = drive(bisection_of(step), VerdictStore.from_json(step.verdicts), pace)
    found.write(step.search_json)


def write_result(step: ResultStep) -> None:
    """Result job: every probe, the answer, the kind's answer files, a report and a short summary whose
    first line is the run's context (`context_line`'s arguments); the kind supplies its parts of each."""
    bisection = bisection_of(step)
    found = SearchRecord.read(step.search_json)
    if found.status == NOT_AMONG_CANDIDATES:
        raise PreconditionError(bisection.not_among_candidates(found))
    result = bisection.result(found)
    result.write(step.result_json)
    bisection.write_answer(result)
    answer = bisection.answer(result)
    own_files = [path.name for path in (step.instances_json, step.hybrid) if path is not None]
    links = bisect_links(step.bisection, [*(name for name, _ in answer.files), *own_files])
    header = PageHeader.now(step.context, bisection.report.accuracy, links)
    page = bisect_page(result, bisection.name, bisection.action, header, answer, bisection.culprits_graph(result),
                       bisection.sections(own_files))
    write_atomic(step.report_html, page)
    write_atomic(step.summary, with_context(step.context, bisection.summary(result)))
