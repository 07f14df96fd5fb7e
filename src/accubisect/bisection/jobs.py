"""The two jobs of every bisection, driving either kind (`protocol.py`): the search and the result.

`rules/fusion_bisect.smk` defines the rules once (`fusion_search`, `fusion_result`) and
`rules/precision_bisect.smk` uses them again with its own files (`precision_search`, `precision_result`);
the `bisection` param names the kind.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from accubisect.bisection.fusion_bisect import FusionBisection
from accubisect.bisection.instances import summary as instance_summary
from accubisect.bisection.precision_bisect import PrecisionBisection
from accubisect.bisection.protocol import Bisection, ResultStep, SearchStep
from accubisect.bisection.search import Budget, SearchRecord, VerdictStore, judged, search
from accubisect.core.errors import PreconditionError, StepError
from accubisect.core.strategy import NOT_AMONG_CANDIDATES
from accubisect.formats.assignment import Assignment
from accubisect.formats.files import write_atomic, write_json
from accubisect.formats.paths import published_dir
from accubisect.reports.graph_view import graph_section
from accubisect.reports.report_html import PAGES, Answer, bisect_links, bisect_page, instances_section
from accubisect.reports.run_context import PageHeader, apply_command, with_context

BISECTIONS: dict[str, type[Bisection]] = {"fusion": FusionBisection, "precision": PrecisionBisection}


def bisection_of(step: SearchStep | ResultStep) -> Bisection:
    """The kind the rule's `bisection` param names, made from the step."""
    if step.bisection not in BISECTIONS:
        raise StepError(f"bisection {step.bisection!r}: not one of {sorted(BISECTIONS)}")
    return BISECTIONS[step.bisection](step)


def run_search(step: SearchStep) -> None:
    """Search job: the preconditions, the ranking, what the search must know first (the noise floor), then
    the configurations to switch off, probed round by round in this process, into search.json."""
    bisection, store, threads = bisection_of(step), VerdictStore.from_json(step.verdicts), step.threads
    ranking = bisection.rank(bisection.candidates())
    nothing_off_passes = bisection.nothing_off_passes()
    probe = bisection.prober()
    floor = None
    if not nothing_off_passes and ranking:  # every sample counts: the floor's metrics are suggested as a check
        judge_whole = functools.partial(judged, functools.partial(probe, stop_early=False), store, threads)
        floor = bisection.floor(ranking, judge_whole, store.key_of)
    found = search(bisection.name, ranking, nothing_off_passes, store, probe, step.bisect["parallel"], threads,
                   Budget.from_config(step.bisect))
    write_json(step.search_json, replace(found, floor=floor).to_json())


def write_result(step: ResultStep) -> None:
    """Result job: every probe, the answer, the kind's answer files, a report and a short summary whose
    first line is the run's context (`context_line`'s arguments)."""
    bisection = bisection_of(step)
    found = SearchRecord.read(step.search_json)
    if found.status == NOT_AMONG_CANDIDATES:
        raise PreconditionError(bisection.not_among_candidates(found))
    result = bisection.result(found)
    write_json(step.result_json, result)
    bisection.write_answer(result)
    answer = answer_of(bisection, result)
    instance_files = [path.name for path in (step.instances_json, step.hybrid) if path is not None]
    links = bisect_links(step.bisection, [*(name for name, _ in answer.files), *instance_files]) if answer else ()
    header = PageHeader.now(step.context, bisection.report.accuracy, links)
    graph = culprits_graph(bisection, result) if answer else ""
    page = bisect_page(result, bisection.name, bisection.action, header, answer, graph,
                       instances_html(bisection, instance_files))
    write_atomic(step.report_html, page)
    write_atomic(step.summary, with_context(step.context, bisection.summary(result)))


def answer_of(bisection: Bisection, result: Mapping[str, Any]) -> Answer | None:
    """The answer as the bisect page shows it: the answer files just written, and the command that applies
    the published ones to the run's own invocation (docs/fusion-bisect.md and
    docs/precision.md); None for a kind with no published page."""
    step = bisection.step  # a ResultStep with this kind's own files (checked when the bisection was made)
    if step.bisection not in PAGES:
        return None
    config = step.context.get("config") or {}
    published = published_dir(config.get("results", "results"), PAGES[step.bisection][1])
    fixed = bool(result["culprits"])
    if step.bisection == "fusion":
        switch = {"compile": {"fusion_switch": str(published / step.fusion_switch.name)}}
        return Answer(((step.fusion_switch.name, step.fusion_switch.read_text()),),
                      apply_command("compare", step.context, switch) if fixed else None,
                      "Apply it: compare again with the switch file; the comparison then passes."
                      if fixed else "Nothing to switch off: fusion-on passes as compiled.")
    kept = [*config.get("precision", {}).get("keep_dtype", []), *result["keep_dtype"]]
    return Answer(((step.keep_dtype.name, step.keep_dtype.read_text()),
                   (step.modify_mixlist.name, step.modify_mixlist.read_text())),
                  apply_command("precision", step.context, {"precision": {"keep_dtype": kept}}) if fixed else None,
                  "Apply it: keep these nodes in fp32 (precision.keep_dtype, with any you kept already) and compare "
                  "again; the precision comparison then passes. modify_mixlist.json moves op types to the black "
                  "list instead, where every reduced node of a type must stay fp32."
                  if fixed else "Nothing to keep in fp32: the reduced model passes as assigned.")


def instances_html(bisection: Bisection, files: list[str]) -> str:
    """The fusion page's section on which instances of the culprit rules break accuracy, linking `files`
    (instances.json, hybrid.onnx); none for precision, or without culprit rules."""
    if not isinstance(bisection, FusionBisection) or not bisection.instances.culprit_rules:
        return ""
    record = bisection.instances
    lines = instance_summary(record).splitlines()
    return instances_section(record, lines[len(record.summary_lines()):], files)


def culprits_graph(bisection: Bisection, result: Mapping[str, Any]) -> str:
    """The graph view of the comparison the bisection started from, around each culprit's compiled nodes:
    the nodes a culprit rule made, or the culprit nodes themselves (marked fp32 or reduced). A click on a
    node opens its row on the comparison's page (published beside this one), as this page has no table."""
    report, step = bisection.report, bisection.step
    rows_page = f"../{PAGES[step.bisection][0]}/report.html"
    if step.bisection == "fusion":
        culprits = set(result["culprits"])
        focus = list(dict.fromkeys(row.node for row in report.tensors if row.rule in culprits))
        return graph_section(report, focus, "The graph around the nodes the culprit rules made", rows_page=rows_page)
    return graph_section(report, result["culprits"], "The graph around the culprits", Assignment.read(step.assignment),
                         rows_page)
