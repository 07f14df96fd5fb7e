"""Self-contained HTML pages a person reads: the comparison, and a bisection's probes and answer.

One file each, no external resource: the error-along-depth plot, the histograms and the probe timeline
are inline SVGs written here, and a few lines of inline script sort the tensor table. Every page opens with
the same header (`header_html`): the model and its digest, the config, the tolerances, the library versions,
the date, and links to the pages beside it in the results folder (`PAGES`: compare ↔ bisect).
"""

from __future__ import annotations

import html
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.metrics import METRICS
from accubisect.formats.bisect_result import BisectResult
from accubisect.formats.compare_report import CompareReport, Divergence, LocalGrowth, TensorRow
from accubisect.formats.instances import InstanceEntry, InstancesRecord
from accubisect.reports.run_context import PageHeader, config_yaml

# Where each comparison's pages are published, by results folder (`<results>/<folder>/report.html`): the
# comparison's page and its bisection's. The pages link each other relatively, as they lie in `results/`.
PAGES = {"fusion": ("compare", "fusion_bisect"), "precision": ("precision", "precision_bisect")}

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
.pass { color: #18794e; font-weight: 600; } .fail { color: #c62828; font-weight: 600; }
table { border-collapse: collapse; margin: .5em 0; } td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; }
th { background: #f4f4f4; cursor: pointer; text-align: left; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.first td { background: #ffe9e9; } tr:target td { outline: 2px solid #1f77b4; }
.box { background: #f7f7f7; padding: .8em 1em; border-radius: 6px; }
details { margin: .2em 0; } summary { cursor: pointer; }
header.run { font-size: 12px; color: #444; border-bottom: 1px solid #ddd; padding-bottom: .5em; }
header.run table td, header.run table th { border: 0; padding: 0 8px 0 0; background: none; cursor: auto; }
header.run nav a { margin-right: 1.2em; } pre { background: #f7f7f7; padding: .6em; overflow-x: auto; }
pre.command { white-space: pre-wrap; word-break: break-all; }
"""

SORT_SCRIPT = """
document.querySelectorAll('table.sortable th').forEach((th, column) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0];
  const rows = Array.from(body.rows);
  const ascending = th.dataset.order !== 'asc';
  th.dataset.order = ascending ? 'asc' : 'desc';
  const key = row => { const text = row.cells[column].dataset.value ?? row.cells[column].textContent;
                       const number = parseFloat(text); return isNaN(number) ? text : number; };
  rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (ascending ? 1 : -1));
  rows.forEach(row => body.appendChild(row));
}));
"""


@dataclass(frozen=True)
class Answer:
    """A bisection's deployable answer as its page shows it: the answer files (name beside the page, content)
    and the command that applies it."""

    files: tuple[tuple[str, str], ...]
    command: str | None  # None: nothing to apply
    applies: str  # one sentence: what the command does


def page(title: str, body: str, script: str = "", header: PageHeader | None = None) -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{header_html(header)}{body}<script>{script}</script></body></html>\n")


def header_html(header: PageHeader | None) -> str:
    """What the page was made from: links to the pages beside it, the model and its digest, the tolerances,
    the library versions, the date, and the config (folded)."""
    if header is None:
        return ""
    links = " ".join(f"<a href='{html.escape(href)}'>{html.escape(text)}</a>" for text, href in header.links)
    digest = f" (sha256 {html.escape(header.model_sha256[:12])})" if header.model_sha256 else ""
    rows = (("model", f"<code>{html.escape(header.model)}</code>{digest}"),
            ("tolerances", html.escape(AccuracyCheck.from_config(header.tolerances).describe())),
            ("versions", html.escape(", ".join(f"{name} {version}" for name, version in header.versions.items()))),
            ("written", html.escape(header.written)))
    facts = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    config = (f"<details><summary>{html.escape(header.config_scope)}</summary>"
              f"<pre>{html.escape(config_yaml(header.config))}</pre></details>" if header.config else "")
    return f"<header class='run'>{f'<nav>{links}</nav>' if links else ''}<table>{facts}</table>{config}</header>"


def verdict_word(passed: bool) -> str:
    return "<span class='pass'>PASS</span>" if passed else "<span class='fail'>FAIL</span>"


def number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return html.escape(str(value))


def compare_links(comparison: str) -> tuple[tuple[str, str], ...]:
    """The compare page's links: its bisection's page and its own files, as published side by side."""
    own, bisect = PAGES[comparison]
    return ((f"{bisect} report", f"../{bisect}/report.html"), ("report.csv", "report.csv"),
            ("report.json", "report.json"), ("node_data.json", "node_data.json"), ("summary.txt", "summary.txt"))


def explorer_note(model: str) -> str:
    """How to see the same errors over the model in Google's Model Explorer: node_data.json beside the page."""
    command = (f"model-explorer {shlex.quote(model)} --extensions=model_explorer_onnx "
               "--node_data_paths=node_data.json")
    return ("<p>The same error per original node, over your own model in Google's Model Explorer "
            "(<code>pip install ai-edge-model-explorer model-explorer-onnx</code>): <a href='node_data.json'>"
            "node_data.json</a> beside this page, opened from this page's folder with</p>"
            f"<pre class='command'>{html.escape(command)}</pre>")


def bisect_links(comparison: str, answer_files: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """A bisect page's links: the comparison it started from and its own files, as published side by side."""
    own, bisect = PAGES[comparison]
    return ((f"{own} report", f"../{own}/report.html"), *((name, name) for name in answer_files),
            ("result.json", "result.json"), ("summary.txt", "summary.txt"))


def compare_page(report: CompareReport, header: PageHeader | None = None, graph: str = "") -> str:
    """The comparison: the divergence, the error along the network with the tolerance lines, the verdict per
    sample, every tensor's row (id `row-{i}`, i its position in `report.tensors`, the plot's x), details;
    `graph` is an HTML fragment (the graph view around the divergence) placed after the plot."""
    body = [f"<h1>{html.escape(report.candidate)} vs {html.escape(report.reference)}: "
            f"{verdict_word(report.passed)}</h1>", _divergence_box(report.first_divergence, report.worst_local),
            "<h2>Error along the network</h2>", depth_plot(report), graph, "<h2>Verdict per sample</h2>",
            _verdict_table(report), "<h2>Every compared tensor (worst over samples; click a header to sort)</h2>",
            _tensor_table(report), "<h2>Tensor details</h2>", _details_note(report),
            *(_detail(row) for row in report.tensors if row.details)]
    return page(f"accubisect compare: {report.candidate} vs {report.reference}", "\n".join(body), SORT_SCRIPT,
                header)


def _divergence_box(divergence: Divergence | None, local: LocalGrowth | None) -> str:
    if divergence is None:
        return "<p class='box'>No compared tensor fails the tolerances.</p>"
    origin = ", ".join(divergence.original_nodes) or "no original node"
    text = (f"Error first appears at tensor <b>{html.escape(divergence.tensor)}</b>, made by node "
            f"<b>{html.escape(divergence.node)}</b> ({html.escape(divergence.op_type)}), rule "
            f"<b>{html.escape(divergence.rule or 'none')}</b>; original nodes: {html.escape(origin)}.")
    if local:
        text += (f"<br>Largest local error: <b>{html.escape(local.tensor)}</b> adds "
                 f"{local.growth:.2%} mismatched elements to what its inputs had.")
    return f"<p class='box'>{text}</p>"


def _verdict_table(report: CompareReport) -> str:
    rows = []
    for verdict in report.verdicts:
        reasons = "; ".join(verdict.candidate["reasons"]) or "-"
        reference = verdict_word(verdict.reference["passed"]) if verdict.reference is not None else "-"
        rows.append(f"<tr><td>{html.escape(verdict.sample)}</td><td>{html.escape(verdict.against)}</td>"
                    f"<td>{verdict_word(verdict.candidate['passed'])}</td><td>{reference}</td>"
                    f"<td>{html.escape(reasons)}</td></tr>")
    return (f"<table><thead><tr><th>sample</th><th>judged against</th><th>{html.escape(report.candidate)}</th>"
            f"<th>{html.escape(report.reference)}</th><th>why</th></tr></thead><tbody>{''.join(rows)}</tbody>"
            "</table>")


def _tensor_table(report: CompareReport) -> str:
    """One row per compared tensor: `#` is its position (the plot's x), `node #` its node's topological index."""
    first = report.first_divergence.tensor if report.first_divergence else None
    head = "".join(f"<th>{h}</th>" for h in ("#", "node #", "tensor", "node", "op_type", "rule", *METRICS, "verdict"))
    rows = []
    for i, row in enumerate(report.tensors):
        cells = [f"<td class='num'>{i}</td><td class='num'>{row.index}</td>",
                 *(f"<td>{html.escape(str(value or '-'))}</td>" for value in (row.tensor, row.node, row.op_type,
                                                                             row.rule))]
        cells += [f"<td class='num'>{number(row.worst.get(m, ''))}</td>" for m in METRICS]
        cells.append(f"<td>{verdict_word(row.passed)}</td>")
        rows.append(f"<tr id='row-{i}'{' class=first' if row.tensor == first else ''}>{''.join(cells)}</tr>")
    return f"<table class='sortable'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _details_note(report: CompareReport) -> str:
    shown = sum(1 for row in report.tensors if row.details)
    return (f"<p>{shown} of {len(report.tensors)} tensors: around the first divergence, the largest local error, "
            "the model outputs and the worst by mismatch and cosine. Every tensor's metrics are in the table above "
            "and in report.csv.</p>")


def _detail(row: TensorRow) -> str:
    parts = []
    for sample, detail in row.details.items():
        if not detail:
            continue
        worst = "".join(f"<tr><td>{e['index']}</td><td class='num'>{number(e['reference'])}</td>"
                        f"<td class='num'>{number(e['candidate'])}</td><td class='num'>{number(e['abs_error'])}</td>"
                        "</tr>" for e in detail["worst_elements"])
        parts.append(f"<h4>{html.escape(sample)}</h4>{histogram_svg(detail)}<table><thead><tr><th>index</th>"
                     f"<th>reference</th><th>candidate</th><th>abs error</th></tr></thead><tbody>{worst}</tbody>"
                     "</table>")
    return (f"<details><summary>{html.escape(row.tensor)} ({html.escape(row.op_type)}) "
            f"{verdict_word(row.passed)}</summary>{''.join(parts)}</details>")


def histogram_svg(detail: Mapping[str, Any], width: int = 420, height: int = 120) -> str:
    """Reference (blue) and candidate (orange) value histograms over the same bins."""
    counts = (detail["reference_counts"], detail["candidate_counts"])
    peak = max(max(counts[0], default=0), max(counts[1], default=0), 1)
    bar = width / max(len(counts[0]), 1)
    shapes = []
    for series, (colour, offset) in zip(counts, (("#1f77b4", 0.0), ("#ff7f0e", 0.5)), strict=True):
        for i, count in enumerate(series):
            h = (height - 20) * count / peak
            shapes.append(f"<rect x='{i * bar + offset * bar:.1f}' y='{height - 15 - h:.1f}' width='{bar / 2:.1f}' "
                          f"height='{h:.1f}' fill='{colour}'/>")
    edges = detail["edges"]
    labels = (f"<text x='0' y='{height - 2}' font-size='10'>{edges[0]:.3g}</text>"
              f"<text x='{width}' y='{height - 2}' font-size='10' text-anchor='end'>{edges[-1]:.3g}</text>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img'>"
            f"{''.join(shapes)}{labels}</svg>")


RULE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                "#17becf")  # matplotlib's tab10
PLOT_WIDTH, PANEL_HEIGHT, PANEL_GAP, MARGIN = 1000, 180, 34, 70
FLOOR = 1e-17  # an exact match still gets a point on a log axis
TOLERANCE_COLOUR = "#e65100"
MARK_CHARS = 48  # of a tensor name in a mark's label; the table and the point's hover have it whole


@dataclass(frozen=True)
class Panel:
    """One panel of the depth plot: a metric per tensor, its scale, and the tolerance line a tensor is judged
    by on it (None: no line; `limit_text` says why or what the line means)."""

    label: str
    values: Sequence[float]
    log: bool
    limit: float | None
    limit_text: str


def depth_panels(report: CompareReport) -> tuple[Panel, ...]:
    """The mismatch (a tensor fails above ntol), 1 - cosine (fails above 1 - cosine tolerance, when set) and
    the max relative error (an element fails above rtol where it is also beyond atol)."""
    tensors, accuracy = report.tensors, report.accuracy
    ntol, cosine, rtol = accuracy.get("ntol"), accuracy.get("cosine"), accuracy.get("rtol")
    return (
        Panel("mismatch", [row.worst.get("mismatch", math.nan) for row in tensors], False, ntol,
              "" if ntol is None else f"ntol {ntol:g}: a tensor above fails"),
        Panel("1 - cosine", [max(1 - row.worst.get("cosine", math.nan), FLOOR) for row in tensors], True,
              None if cosine is None else max(1 - cosine, FLOOR),
              "no cosine tolerance" if cosine is None else f"cosine {cosine:g}: a tensor above fails"),
        Panel("max relative error", [max(row.worst.get("max_rel", math.nan), FLOOR) for row in tensors], True,
              rtol, "" if rtol is None else f"rtol {rtol:g}: an element above fails if also beyond atol "
                                            f"{accuracy.get('atol', math.nan):g}"))


def depth_plot(report: CompareReport) -> str:
    """The mismatch, 1 - cosine and max relative error per compared tensor, x = the tensor's position (the
    table's # column), each with its tolerance line; fused nodes coloured by rule; the first divergence and
    the largest local error marked; a tensor's column links to its table row. Written as SVG here: matplotlib took
    longer to import and draw than the whole comparison of a small model."""
    tensors = report.tensors
    rules = sorted({row.rule for row in tensors if row.rule})
    colours = {rule: RULE_COLOURS[i % len(RULE_COLOURS)] for i, rule in enumerate(rules)}
    divergence, local = report.first_divergence, report.worst_local
    same = bool(divergence and local and divergence.tensor == local.tensor)
    marks = [(divergence, "first divergence" + (" and largest local error" if same else ""), "#c62828")]
    if not same:
        marks.append((local, "largest local error", "#6a1b9a"))
    starts = [MARGIN + sum(30 + 6.5 * len(rule) for rule in rules[:i]) for i in range(len(rules))]  # 11px text
    legend = "".join(f"<circle cx='{x + 10:.0f}' cy='10' r='5' fill='{colours[rule]}'/>"
                     f"<text x='{x + 20:.0f}' y='14' font-size='11'>{html.escape(rule)}</text>"
                     for x, rule in zip(starts, rules, strict=True))
    panels = depth_panels(report)
    drawn = "".join(_panel(panel, tensors, colours, marks, 24 + index * (PANEL_HEIGHT + PANEL_GAP))
                    for index, panel in enumerate(panels))
    height = 24 + len(panels) * (PANEL_HEIGHT + PANEL_GAP) + 10
    columns = _columns(tensors, panels, height - 34)
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{PLOT_WIDTH + MARGIN + 20}' height='{height}' "
            f"role='img' font-family='sans-serif'>{legend}{drawn}{columns}<text x='{MARGIN + PLOT_WIDTH / 2}' "
            f"y='{height - 2}' font-size='12' text-anchor='middle'>compared tensor # (the table's # column), "
            "in topological order</text></svg>")


def _columns(tensors: Sequence[TensorRow], panels: Sequence[Panel], height: float) -> str:
    """One invisible column per tensor over every panel: hovering it names the tensor and its value in each
    panel, a click opens its table row. One per tensor, not per point: a deep model's long names, once."""
    width = PLOT_WIDTH / max(len(tensors), 1)
    parts = []
    for i, row in enumerate(tensors):
        values = ", ".join(f"{panel.label} {number(panel.values[i])}" for panel in panels)
        parts.append(f"<a href='#row-{i}'><rect x='{MARGIN + i * width:.1f}' y='24' width='{width:.1f}' "
                     f"height='{height:.0f}' fill-opacity='0'><title>#{i} {html.escape(row.tensor)} "
                     f"({html.escape(row.op_type)}): {values}</title></rect></a>")
    return "".join(parts)


def _x(i: int, count: int) -> float:
    return MARGIN + PLOT_WIDTH * (i + 0.5) / max(count, 1)


def _panel(panel: Panel, tensors: Sequence[TensorRow], colours: Mapping[str, str],
           marks: Sequence[tuple[Divergence | LocalGrowth | None, str, str]], top: float) -> str:
    """One panel: the line and points of its values (each linking to its table row), the y ticks (decades on
    a log axis), the x ticks (tensor #), the tolerance line, rule colours and marks."""
    values, count = panel.values, len(panel.values)
    y, ticks = _log_axis(panel, top) if panel.log else _linear_axis(panel, top)
    parts = [f"<rect x='{MARGIN}' y='{top}' width='{PLOT_WIDTH}' height='{PANEL_HEIGHT}' fill='none' stroke='#999'/>",
             f"<text x='14' y='{top + PANEL_HEIGHT / 2}' font-size='12' text-anchor='middle' "
             f"transform='rotate(-90 14 {top + PANEL_HEIGHT / 2})'>{panel.label}</text>"]
    for value, text in ticks:
        parts.append(f"<line x1='{MARGIN - 4}' x2='{MARGIN + PLOT_WIDTH}' y1='{y(value):.1f}' y2='{y(value):.1f}' "
                     f"stroke='#eee'/><text x='{MARGIN - 6}' y='{y(value) + 4:.1f}' font-size='10' "
                     f"text-anchor='end'>{text}</text>")
    step = max(1, math.ceil(count / 10))
    parts += [f"<line x1='{_x(i, count):.1f}' x2='{_x(i, count):.1f}' y1='{top + PANEL_HEIGHT}' "
              f"y2='{top + PANEL_HEIGHT + 4}' stroke='#999'/><text x='{_x(i, count):.1f}' "
              f"y='{top + PANEL_HEIGHT + 14}' font-size='10' text-anchor='middle'>{i}</text>"
              for i in range(0, count, step)]
    points = " ".join(f"{_x(i, count):.1f},{y(v):.1f}" for i, v in enumerate(values))
    parts.append(f"<polyline points='{points}' fill='none' stroke='#999' stroke-width='1'/>")
    for i, (value, row) in enumerate(zip(values, tensors, strict=True)):
        colour, radius = (colours[row.rule], 4) if row.rule else ("#555", 2)
        parts.append(f"<circle cx='{_x(i, count):.1f}' cy='{y(value):.1f}' r='{radius}' fill='{colour}'/>")
    if panel.limit is not None:
        at = y(panel.limit)
        parts.append(f"<line class='tolerance' x1='{MARGIN}' x2='{MARGIN + PLOT_WIDTH}' y1='{at:.1f}' y2='{at:.1f}' "
                     f"stroke='{TOLERANCE_COLOUR}' stroke-width='1.5' stroke-dasharray='6 3'/>")
    if panel.limit_text:
        line = top if panel.limit is None else y(panel.limit)  # the text below a line in the upper half
        at = top - 3 if panel.limit is None else line + 12 if line < top + PANEL_HEIGHT / 2 else line - 3
        parts.append(f"<text x='{MARGIN + PLOT_WIDTH - 4}' y='{at:.1f}' font-size='10' text-anchor='end' "
                     f"fill='{TOLERANCE_COLOUR}'>{html.escape(panel.limit_text)}</text>")
    for point, text, colour in marks:
        if point:
            where = next(i for i, row in enumerate(tensors) if row.tensor == point.tensor)
            anchor = "end" if where > count / 2 else "start"
            parts.append(f"<line x1='{_x(where, count):.1f}' x2='{_x(where, count):.1f}' y1='{top}' "
                         f"y2='{top + PANEL_HEIGHT}' stroke='{colour}' stroke-dasharray='4 3'/><text "
                         f"x='{_x(where, count):.1f}' y='{top + 12}' font-size='11' fill='{colour}' "
                         f"text-anchor='{anchor}'> {html.escape(f'{text}: #{where} {_cut(point.tensor)}')} </text>")
    return "".join(parts)


def _cut(name: str, chars: int = MARK_CHARS) -> str:
    """A tensor name as a mark's label says it: its end, where the names of deep models differ."""
    return name if len(name) <= chars else "…" + name[-(chars - 1):]


def _log_axis(panel: Panel, top: float) -> tuple[Any, list[tuple[float, str]]]:
    """y of a value on a decade axis spanning the values and the tolerance line; NaN and inf drawn at the top."""
    finite = [v for v in (*panel.values, panel.limit) if v is not None and math.isfinite(v) and v > 0] or [1.0]
    low, high = math.floor(math.log10(min(finite))), math.ceil(math.log10(max(finite)))
    high = max(high, low + 1)

    def y(value: float) -> float:
        at = math.log10(value) if math.isfinite(value) and value > 0 else high
        return top + PANEL_HEIGHT * (high - min(max(at, low), high)) / (high - low)

    step = max(1, (high - low) // 8)
    return y, [(10.0**decade, f"1e{decade}") for decade in range(low, high + 1, step)]


def _linear_axis(panel: Panel, top: float) -> tuple[Any, list[tuple[float, str]]]:
    """y of a fraction on an axis from 0 to the largest value or the tolerance (at least 1e-6); NaN at the top."""
    finite = [v for v in (*panel.values, panel.limit) if v is not None and math.isfinite(v)]
    high = max([*finite, 1e-6]) * 1.05

    def y(value: float) -> float:
        at = value if math.isfinite(value) else high
        return top + PANEL_HEIGHT * (1 - min(max(at, 0.0), high) / high)

    return y, [(high * k / 4, f"{high * k / 4:.3g}") for k in range(5)]


def bisect_page(result: BisectResult, name: str = "fusion_bisect", action: str = "switch off",
                header: PageHeader | None = None, answer: Answer | None = None, graph: str = "",
                instances: str = "") -> str:
    """A bisection: the answer (its files and the command that applies it), the probes round by round, the
    ranking; `instances` and `graph` are HTML fragments (which instances break accuracy, `instances_section`;
    the graph view around the culprits) placed after the answer."""
    culprits = ", ".join(result.culprits) or "none"
    groups = "".join(f"<li>{html.escape(' + '.join(group))} fail only together</li>" for group in result.groups)
    rows = "".join(
        f"<tr><td class='num'>{p['round']}</td><td>{_listed(p['off'])}</td>"
        f"<td>{verdict_word(p['passed'])}</td><td class='num'>{number(p['worst'].get('max_rel', ''))}</td>"
        f"<td class='num'>{number(p['worst'].get('mismatch', ''))}</td><td class='num'>{p['seconds']}</td></tr>"
        for p in result.probes)
    body = (f"<h1>{name}: {action} {html.escape(culprits)}</h1>"
            f"<div class='box'>{len(result.culprits)} of {len(result.candidates)} candidates: {action}; "
            f"{_kept(result.kept)}<ul>{groups}</ul></div>"
            f"{answer_html(answer)}{instances}{graph}"
            f"<h2>Probes, round by round</h2>{timeline_svg(result.probes, action)}"
            f"<table class='sortable'><thead><tr><th>round</th><th>{html.escape(action)}</th><th>verdict</th>"
            "<th>max rel err</th>"
            f"<th>mismatch</th><th>seconds</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<h2>Ranking</h2><p>{html.escape(result.ranking_use)}</p>")
    return page(f"accubisect {name}", body, SORT_SCRIPT, header)


def _kept(kept: Sequence[str], shown: int = 10) -> str:
    """The candidates kept as they were: listed, or folded where there are more than `shown`."""
    names = html.escape(", ".join(kept))
    if len(kept) <= shown:
        return f"{len(kept)} kept as they were: {names}."
    return f"<details><summary>{len(kept)} kept as they were</summary>{names}.</details>"


def _listed(names: Sequence[str], shown: int = 10) -> str:
    """A probe's configuration: its names, or their count with the names folded where there are more than
    `shown`."""
    text = html.escape(", ".join(names)) or "-"
    return text if len(names) <= shown else f"<details><summary>{len(names)}</summary>{text}</details>"


def answer_html(answer: Answer | None) -> str:
    """The deployable answer: each file's content under its name (a link to the file beside the page), then
    the command that applies it."""
    if answer is None:
        return ""
    files = "".join(f"<h3><a href='{html.escape(name)}'>{html.escape(name)}</a></h3>"
                    f"<pre class='answer'>{html.escape(content) or '(empty)'}</pre>" for name, content in answer.files)
    command = (f"<p>{html.escape(answer.applies)}</p><pre class='command'>{html.escape(answer.command)}</pre>"
               if answer.command else f"<p>{html.escape(answer.applies)}</p>")
    return f"<h2>The answer</h2>{files}{command}"


def instances_section(record: InstancesRecord, hybrid_lines: Sequence[str], files: Sequence[str]) -> str:
    """Which instances of each culprit rule break accuracy: per rule its line and a table of its instances,
    then hybrid.onnx's lines (`hybrid_lines`) and links to `files`, published beside the page."""
    rules = "".join(f"<p><b>{html.escape(line)}</b></p>{_instance_table(record.of_rule(rule))}"
                    for rule, line in zip(record.culprit_rules, record.summary_lines(), strict=True))
    hybrid = "".join(f"<p>{html.escape(line)}</p>" for line in hybrid_lines)
    links = " · ".join(f"<a href='{html.escape(name)}'>{html.escape(name)}</a>" for name in files)
    return f"<h2>Which instances break accuracy</h2>{rules}{hybrid}<p>{links}</p>"


def _instance_table(instances: Sequence[InstanceEntry]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(i.name)}</td><td>{_listed(i.fused_nodes)}</td><td>{_listed(i.original_nodes)}</td>"
        f"<td class='num'>{number(i.local_error) if i.local_error is not None else '-'}</td>"
        f"<td>{_instance_verdict(i)}</td></tr>" for i in instances)
    return ("<table class='sortable'><thead><tr><th>instance</th><th>fused nodes</th><th>original nodes</th>"
            f"<th>local error</th><th>verdict</th></tr></thead><tbody>{rows}</tbody></table>")


def _instance_verdict(instance: InstanceEntry) -> str:
    if instance.not_revertable:
        return f"stays fused: {html.escape(instance.not_revertable)}"
    if instance.breaks is None:
        return "not known"
    return "<span class='fail'>breaks</span> (reverted)" if instance.breaks else "kept fused"


def timeline_svg(probes: Sequence[Mapping[str, Any]], action: str, box: int = 22) -> str:
    """One column per round, one square per probe: green passed, red failed; hover names what the probe
    changed, in the bisection's words (`action`: the rules it switched off, the nodes it kept in fp32)."""
    rounds: dict[int, list[Mapping[str, Any]]] = {}
    for probe in probes:
        rounds.setdefault(probe["round"], []).append(probe)
    width = (len(rounds) + 1) * (box + 8) + 60
    height = (max((len(p) for p in rounds.values()), default=1) + 1) * (box + 4) + 20
    shapes = []
    for column, (round_index, members) in enumerate(sorted(rounds.items())):
        x = 60 + column * (box + 8)
        shapes.append(f"<text x='{x}' y='12' font-size='10'>r{round_index}</text>")
        for row, probe in enumerate(members):
            colour = "#2e7d32" if probe["passed"] else "#c62828"
            changed = html.escape(f"{action}: {', '.join(probe['off']) or 'nothing'}")
            shapes.append(f"<rect x='{x}' y='{18 + row * (box + 4)}' width='{box}' height='{box}' fill='{colour}'>"
                          f"<title>{changed}</title></rect>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img'>"
            f"<text x='0' y='34' font-size='11'>probes</text>{''.join(shapes)}</svg>")
