"""The bisection protocol: what each search adds to the shared driver, and what a bisection adds to it.

Every search is a `Search`, run by one driver (`driver.drive`): it supplies its candidates and their ranking
with the evidence (`candidates()`, `rank()`), its preconditions (`nothing_off_passes()`; a search that starts
from a comparison, `ComparedSearch`, words the failing one alike for all: `not_the_cause()`), its prober
(`prober()`: what every probe shares, loaded once, as the function that builds and judges one configuration)
and what it must know before it starts (`floor()`: precision's noise floor); the driver runs the strategy's
rounds, the progress lines, the verdict store and resume and the probe budget (`search.py`), and judges an
answer again on every sample (`driver.judged_again`). The searches: fusion_bisect and precision_bisect (the
`Bisection`s below), the instance search (`instances.InstanceSearch`), OpenVINO's (`openvino_fusion`'s
`SwitchSearch` and `BarrierSearch`, `openvino_precision.KeepWalk`), precision_deploy's two passes in the
user's model (`deploy_settle.InYourModel`) and reduce's two sides (below).

A `Bisection` is a `ComparedSearch` that is two jobs (`jobs.py`): the search job runs it through the driver
into search.json, and the result job turns the search record into the answer files. It adds:

- `cause`, `reference_words` and `advice`: its words in the one precondition line when the reference fails;
- `result()`, `write_answer()`, `summary()`: result.json, the kind's own answer files, the summary;
- `answer()`, `culprits_graph()`, `sections()`: its parts of the bisect page (the answer and the command
  that applies it, the graph around the culprits, any section of its own).

Each job makes its bisection from its own step record (`SearchStep`, `ResultStep`: the rule's files and
params by name, each kind's own files None in the other kind's job), and a method reads only what its job
has (`search_step`, `result_step`): the search job's methods the model, samples and check, the result job's
the search record and what the answer files need. The words are docs/glossary.md's.

reduce (`reduce.py`) is two `Search`es run one after the other, its outputs side and its inputs side
(`reduce_search.CutSearch`). It cuts the model rather than switching candidates off, so each side supplies:
as candidates, the nodes its cut's end (or start) may lie at, in node order; as configurations, the cuts'
own (`Cut.config`, one readable line each), with the cut each names kept for its prober and its answer; as
its precondition, the verdict of its known end (the whole model must show the bug), which is the
configuration with nothing off; as its strategy, a bisection of the node order (`core.shrink.next_cut`),
not group testing; as its prober, a cut's two judgements (fails as compiled, passes with the bisection's
answer). It has no probe budget, and its answer's re-verification is the repro run as written and with the
answer.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.search import Prober
from accubisect.core.accuracy import AccuracyCheck, worst_outputs
from accubisect.core.errors import PreconditionError, StepError
from accubisect.core.metrics import local_error
from accubisect.core.strategy import Configuration, Outcome, Round, next_probes
from accubisect.formats.bisect_result import BisectResult
from accubisect.formats.compare_report import CompareReport, TensorRow
from accubisect.formats.config_sections import AccuracySection, BisectSection
from accubisect.formats.paths import published_dir
from accubisect.formats.search_record import SearchRecord
from accubisect.formats.step import Step
from accubisect.formats.verdict import VerdictRecord
from accubisect.reports.report_html import PAGES, Answer


@dataclass(frozen=True)
class SearchStep(Step):
    """The search job's files and params (rules `fusion_search`, `precision_search`)."""

    bisection: str  # the kind: fusion | precision
    compare_report: Path
    sample_inputs: tuple[Path, ...]
    references: tuple[Path, ...]  # per sample: golden outputs, or the reference's dump
    search_json: Path
    verdicts: Mapping[str, Any]  # the verdict store (`VerdictStore.to_json`)
    bisect: BisectSection
    output_names: tuple[str, ...]
    accuracy: AccuracySection
    backend: str
    threads: int
    model: Path | None = None  # fusion: the user's model
    compile_record: Path | None = None  # fusion: the fusion-on variant's compile.json
    compiled_model: Path | None = None  # precision: the compiled graph precision was assigned on
    assignment: Path | None = None  # precision: the precision stage's assignment.json


@dataclass(frozen=True)
class ResultStep(Step):
    """The result job's files and params (rules `fusion_result`, `precision_result`)."""

    bisection: str
    search_json: Path
    compare_report: Path
    context: Mapping[str, Any]  # `context_line`'s arguments: the summary's first line
    result_json: Path
    report_html: Path
    summary: Path
    compile_record: Path | None = None  # fusion
    fusion_switch: Path | None = None  # fusion: the answer
    instances_json: Path | None = None  # fusion: which instances of the culprit rules break accuracy
    hybrid: Path | None = None  # fusion: the verified hybrid model, linked from the page
    assignment: Path | None = None  # precision
    graph_json: Path | None = None  # precision: the graph precision was assigned on
    keep_dtype: Path | None = None  # precision: the answer
    modify_mixlist: Path | None = None  # precision: the answer
    deployed_json: Path | None = None  # precision: the answer in the deployable model (`deployable.py`)


Result = TypeVar("Result", bound=BisectResult)  # result.json (`formats/bisect_result.py`)


class Search(abc.ABC):
    """What one search supplies to the shared driver (`driver.drive`): its candidates and their ranking with
    the evidence, whether the configuration with nothing off passes (its preconditions), its prober, its
    strategy, and what it must know before searching. The driver does the rest alike for every search: the
    strategy's rounds, progress lines, the verdict store and resume, the probe budget, and judging an answer
    again."""

    name: ClassVar[str]  # in progress lines: fusion_bisect | precision_bisect | fusion_instances | reduce outputs | ...
    unit: ClassVar[str]  # what one candidate is: rule | node | instance | switch | executed node

    @abc.abstractmethod
    def candidates(self) -> list[str]:
        """What the search may switch off, in the order the evidence's ties keep."""

    @abc.abstractmethod
    def rank(self, candidates: Sequence[str]) -> list[dict[str, Any]]:
        """The ranking: per candidate, most suspect first, `name` and the evidence it was ranked by."""

    @abc.abstractmethod
    def nothing_off_passes(self) -> bool | None:
        """The preconditions (a failing one is a one-line error); whether the configuration with nothing off
        passes, i.e. nothing to search; None where that is not known before (a search that starts elsewhere,
        `deploy_settle.InYourModel`): the strategy asks for it like any other configuration."""

    @abc.abstractmethod
    def prober(self) -> Prober:
        """The probe of this search: builds one configuration and judges it on the samples."""

    def strategy(self, candidates: Sequence[str], verdicts: Mapping[Configuration, bool],
                 parallel: int) -> Round | Outcome:
        """Which configurations to probe next, or the outcome, from the verdicts known: group testing
        (`core/strategy.py`) unless the search walks its ranking otherwise."""
        return next_probes(candidates, verdicts, parallel)

    def floor(self, ranking: Sequence[Mapping[str, Any]], judge_whole: Callable[[Configuration], VerdictRecord],
              key_of: Callable[[Configuration], str]) -> dict[str, Any] | None:
        """What the search must know first, kept in search.json: `judge_whole(off)` is a configuration's
        verdict on every sample, `key_of(off)` its verdict key. Asked only when nothing off fails."""
        return None


class ComparedSearch(Search):
    """A search that starts from a comparison (`report`, judged by `check`): its candidate run is the
    configuration with nothing off, and when the comparison's reference fails against the golden outputs
    there is nothing to search, said in one line worded alike for every such search (`not_the_cause()`)."""

    cause: ClassVar[str]  # what the search looks for the failure in: fusion | precision
    reference_words: ClassVar[str]  # how the reference runs, in the precondition line: with fusion off | in fp32
    advice: ClassVar[str]  # what to do when the reference fails, the precondition line's end
    report: CompareReport  # the comparison the search starts from
    check: AccuracyCheck  # the run's accuracy check

    def not_the_cause(self) -> str:
        """Why there is nothing to search when the reference itself fails against the golden outputs."""
        return (f"the model fails even {self.reference_words} ({self.report.reference} fails against the golden "
                f"outputs): {self.cause} is not the cause; {self.advice}")

    def nothing_off_passes(self) -> bool:
        """From the comparison: fails with `not_the_cause()` when the reference fails against the golden
        outputs; returns whether the configuration with nothing off passes."""
        return nothing_off_passes(self.report, self.check, self.not_the_cause())


class Bisection(ComparedSearch, Generic[Result]):
    """One kind of bisection, made from a job's step record; `Result` is its result.json."""

    action: ClassVar[str]  # what the answer does to a culprit, in the report's words: switch off | keep in fp32
    search_files: ClassVar[frozenset[str]]  # the kind's own fields of a SearchStep
    result_files: ClassVar[frozenset[str]]  # the kind's own fields of a ResultStep

    def __init__(self, step: SearchStep | ResultStep) -> None:
        own = self.search_files if isinstance(step, SearchStep) else self.result_files
        given = {field.name for field in dataclasses.fields(step)
                 if field.default is None and getattr(step, field.name) is not None}
        if given != own:
            raise StepError(f"{self.name}: the rule gives the files {sorted(given)}; a {type(step).__name__} of "
                            f"this kind has {sorted(own)}")
        self.step = step  # with this kind's own files set

    @property
    def search_step(self) -> SearchStep:
        """The search job's step; a method of the search job called in the result job is one line."""
        if not isinstance(self.step, SearchStep):
            raise StepError(f"{self.name}: asked in the result job for what only the search job has")
        return self.step

    @property
    def result_step(self) -> ResultStep:
        """The result job's step; a method of the result job called in the search job is one line."""
        if not isinstance(self.step, ResultStep):
            raise StepError(f"{self.name}: asked in the search job for what only the result job has")
        return self.step

    @cached_property
    def report(self) -> CompareReport:
        """The comparison the bisection starts from: its candidate run is the configuration with nothing off."""
        return CompareReport.read(self.step.compare_report)

    @cached_property
    def check(self) -> AccuracyCheck:
        """The run's accuracy check (the search job's: its step has the config's `accuracy` section)."""
        return AccuracyCheck.from_config(self.search_step.accuracy)

    # the search job (its candidates, ranking, prober and floor: `Search`)

    def sample_judge(self) -> SampleJudge:
        step = self.search_step
        return SampleJudge.load(step.sample_inputs, step.references, step.output_names, step.accuracy)

    # the result job

    @abc.abstractmethod
    def not_among_candidates(self, found: SearchRecord) -> str:
        """Why there is no answer when even every candidate switched off fails."""

    @abc.abstractmethod
    def result(self, found: SearchRecord) -> Result:
        """result.json: every probe and the answer."""

    @abc.abstractmethod
    def write_answer(self, result: Result) -> None:
        """The answer as the kind's own files: fusion_switch.cfg, or keep_dtype.txt and modify_mixlist.json."""

    @abc.abstractmethod
    def summary(self, result: Result) -> str:
        """The summary's lines after the run's context line."""

    @abc.abstractmethod
    def answer(self, result: Result) -> Answer:
        """The answer as the bisect page shows it: the answer files just written, and the command that applies
        the published ones to the run's own invocation (`published()`)."""

    @abc.abstractmethod
    def culprits_graph(self, result: Result) -> str:
        """The graph view of the comparison the bisection started from, around the culprits (`graph_view`)."""

    def sections(self, files: Sequence[str]) -> str:
        """The page's own section of this kind, after the answer, linking `files` published beside it."""
        return ""

    def published(self) -> Path:
        """Where the bisection's target publishes its answer files, in the run's results folder."""
        config = self.result_step.context.get("config") or {}
        return published_dir(config.get("results", "results"), PAGES[self.result_step.bisection][1])

    def rows_page(self) -> str:
        """The comparison's page, published beside this one, as a relative link: the graph view's nodes open
        their rows there."""
        return f"../{PAGES[self.result_step.bisection][0]}/report.html"


def rows_by(report: CompareReport, column: str, names: Sequence[str]) -> dict[str, list[TensorRow]]:
    """A compare report's tensor rows for each of `names` in `column` ("rule" or "node"), in topological
    order: the evidence a bisection ranks its candidates by."""
    rows: dict[str, list[TensorRow]] = {name: [] for name in names}
    for row in report.tensors:
        if getattr(row, column) in rows:
            rows[getattr(row, column)].append(row)
    return rows


def worst_local_error(rows: Sequence[TensorRow]) -> float | None:
    """The largest error the rows' nodes make run alone; None where none was measured."""
    return max((local_error(row.local) for row in rows if row.local), default=None)


def nothing_off_passes(report: CompareReport, check: AccuracyCheck, not_the_cause: str) -> bool:
    """From a comparison: fails with `not_the_cause` when the reference already fails `check` against the
    golden outputs; returns whether the candidate run (nothing switched off) passes it, i.e. nothing to
    bisect: the comparison's own verdict, which the same check made."""
    reference = [v.reference["passed"] for v in report.verdicts if v.reference is not None]
    if reference and not check.passes(reference):
        raise PreconditionError(not_the_cause)
    return check.passes([v.candidate["passed"] for v in report.verdicts])


def nothing_off_verdict(report: CompareReport) -> dict[str, Any]:
    """The candidate run's verdict in a compare report (nothing switched off), shaped like a probe's."""
    return {"passed": report.passed, "worst": worst_outputs([v.candidate for v in report.verdicts])}
