"""Self-contained HTML pages a person reads: the comparison, and a bisection's probes.

One file each, no external resource: the error-along-depth plot, the histograms and the probe timeline
are inline SVGs written here, and a few lines of inline script sort the tensor table.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from accubisect.core.metrics import METRICS
from accubisect.formats.compare_report import CompareReport, Divergence, LocalGrowth, TensorRow

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
.pass { color: #18794e; font-weight: 600; } .fail { color: #c62828; font-weight: 600; }
table { border-collapse: collapse; margin: .5em 0; } td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; }
th { background: #f4f4f4; cursor: pointer; text-align: left; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.first td { background: #ffe9e9; } .box { background: #f7f7f7; padding: .8em 1em; border-radius: 6px; }
details { margin: .2em 0; } summary { cursor: pointer; }
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


def page(title: str, body: str, script: str = "") -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}<script>{script}</script></body></html>\n")


def verdict_word(passed: bool) -> str:
    return "<span class='pass'>PASS</span>" if passed else "<span class='fail'>FAIL</span>"


def number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return html.escape(str(value))


def compare_page(report: CompareReport) -> str:
    body = [f"<h1>{html.escape(report.candidate)} vs {html.escape(report.reference)}: "
            f"{verdict_word(report.passed)}</h1>", _divergence_box(report.first_divergence, report.worst_local),
            "<h2>Error along the network</h2>", depth_plot(report), "<h2>Verdict per sample</h2>",
            _verdict_table(report), "<h2>Every compared tensor (worst over samples; click a header to sort)</h2>",
            _tensor_table(report), "<h2>Tensor details</h2>", _details_note(report),
            *(_detail(row) for row in report.tensors if row.details)]
    return page(f"accubisect compare: {report.candidate} vs {report.reference}", "\n".join(body), SORT_SCRIPT)


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
    first = report.first_divergence.tensor if report.first_divergence else None
    head = "".join(f"<th>{h}</th>" for h in ("#", "tensor", "node", "op_type", "rule", *METRICS, "verdict"))
    rows = []
    for row in report.tensors:
        cells = [f"<td class='num'>{row.index}</td>", *(f"<td>{html.escape(str(value or '-'))}</td>"
                                                        for value in (row.tensor, row.node, row.op_type, row.rule))]
        cells += [f"<td class='num'>{number(row.worst.get(m, ''))}</td>" for m in METRICS]
        cells.append(f"<td>{verdict_word(row.passed)}</td>")
        rows.append(f"<tr{' class=first' if row.tensor == first else ''}>{''.join(cells)}</tr>")
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
PLOT_WIDTH, PANEL_HEIGHT, MARGIN = 1000, 220, 70
FLOOR = 1e-17  # an exact match still gets a point on a log axis


def depth_plot(report: CompareReport) -> str:
    """1 - cosine and max relative error per compared tensor in topological order, on log axes; fused
    nodes coloured by rule; the first divergence and the largest local error marked. Written as SVG here:
    matplotlib took longer to import and draw than the whole comparison of a small model."""
    tensors = report.tensors
    rules = sorted({row.rule for row in tensors if row.rule})
    colours = {rule: RULE_COLOURS[i % len(RULE_COLOURS)] for i, rule in enumerate(rules)}
    series = (("1 - cosine", [max(1 - row.worst.get("cosine", math.nan), FLOOR) for row in tensors]),
              ("max relative error", [max(row.worst.get("max_rel", math.nan), FLOOR) for row in tensors]))
    divergence, local = report.first_divergence, report.worst_local
    same = bool(divergence and local and divergence.tensor == local.tensor)
    marks = [(divergence, "first divergence" + (" and largest local error" if same else ""), "#c62828")]
    if not same:
        marks.append((local, "largest local error", "#6a1b9a"))
    legend = "".join(f"<circle cx='{MARGIN + 10 + 150 * i}' cy='10' r='5' fill='{colours[rule]}'/>"
                     f"<text x='{MARGIN + 20 + 150 * i}' y='14' font-size='11'>{html.escape(rule)}</text>"
                     for i, rule in enumerate(rules))
    panels = "".join(_panel(label, values, tensors, colours, marks, 24 + index * (PANEL_HEIGHT + 30))
                     for index, (label, values) in enumerate(series))
    height = 24 + 2 * (PANEL_HEIGHT + 30) + 10
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{PLOT_WIDTH + MARGIN + 20}' height='{height}' "
            f"role='img' font-family='sans-serif'>{legend}{panels}<text x='{MARGIN + PLOT_WIDTH / 2}' "
            f"y='{height - 2}' font-size='12' text-anchor='middle'>compared tensor, in topological order</text></svg>")


def _panel(label: str, values: Sequence[float], tensors: Sequence[TensorRow], colours: Mapping[str, str],
           marks: Sequence[tuple[Divergence | LocalGrowth | None, str, str]], top: float) -> str:
    """One log-scale panel: the line and points of `values`, decade ticks, rule colours and marks."""
    finite = [v for v in values if math.isfinite(v)] or [1.0]
    low, high = math.floor(math.log10(min(finite))), math.ceil(math.log10(max(finite)))
    high = max(high, low + 1)

    def x(i: int) -> float:
        return MARGIN + PLOT_WIDTH * (i + 0.5) / max(len(values), 1)

    def y(value: float) -> float:
        at = math.log10(value) if math.isfinite(value) else high  # NaN or inf: drawn at the top
        return top + PANEL_HEIGHT * (high - min(max(at, low), high)) / (high - low)

    parts = [f"<rect x='{MARGIN}' y='{top}' width='{PLOT_WIDTH}' height='{PANEL_HEIGHT}' fill='none' stroke='#999'/>",
             f"<text x='14' y='{top + PANEL_HEIGHT / 2}' font-size='12' text-anchor='middle' "
             f"transform='rotate(-90 14 {top + PANEL_HEIGHT / 2})'>{label}</text>"]
    step = max(1, (high - low) // 8)
    for decade in range(low, high + 1, step):
        parts.append(f"<line x1='{MARGIN - 4}' x2='{MARGIN + PLOT_WIDTH}' y1='{y(10.0**decade):.1f}' "
                     f"y2='{y(10.0**decade):.1f}' stroke='#eee'/><text x='{MARGIN - 6}' y='{y(10.0**decade) + 4:.1f}' "
                     f"font-size='10' text-anchor='end'>1e{decade}</text>")
    points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    parts.append(f"<polyline points='{points}' fill='none' stroke='#999' stroke-width='1'/>")
    for i, (value, row) in enumerate(zip(values, tensors, strict=True)):
        colour, radius = (colours[row.rule], 4) if row.rule else ("#555", 2)
        parts.append(f"<circle cx='{x(i):.1f}' cy='{y(value):.1f}' r='{radius}' fill='{colour}'>"
                     f"<title>{html.escape(row.tensor)}: {number(value)}</title></circle>")
    for point, text, colour in marks:
        if point:
            where = next(i for i, row in enumerate(tensors) if row.tensor == point.tensor)
            anchor = "end" if where > len(tensors) / 2 else "start"
            parts.append(f"<line x1='{x(where):.1f}' x2='{x(where):.1f}' y1='{top}' y2='{top + PANEL_HEIGHT}' "
                         f"stroke='{colour}' stroke-dasharray='4 3'/><text x='{x(where):.1f}' y='{top + 12}' "
                         f"font-size='11' fill='{colour}' text-anchor='{anchor}'> {html.escape(text)}: "
                         f"{html.escape(point.tensor)} </text>")
    return "".join(parts)


def bisect_page(result: Mapping[str, Any], name: str = "fusion_bisect", action: str = "switch off") -> str:
    culprits = ", ".join(result["culprits"]) or "none"
    groups = "".join(f"<li>{html.escape(' + '.join(group))} fail only together</li>" for group in result["groups"])
    rows = "".join(
        f"<tr><td class='num'>{p['round']}</td><td>{html.escape(', '.join(p['off']) or '-')}</td>"
        f"<td>{verdict_word(p['passed'])}</td><td class='num'>{number(p['worst'].get('max_rel', ''))}</td>"
        f"<td class='num'>{number(p['worst'].get('mismatch', ''))}</td><td class='num'>{p['seconds']}</td></tr>"
        for p in result["probes"])
    body = (f"<h1>{name}: {action} {html.escape(culprits)}</h1>"
            f"<p class='box'>{len(result['culprits'])} of {len(result['candidates'])} candidates: {action}; "
            f"{len(result['kept'])} kept as they were: {html.escape(', '.join(result['kept']))}.<ul>{groups}</ul></p>"
            f"<h2>Probes, round by round</h2>{timeline_svg(result['probes'])}"
            "<table class='sortable'><thead><tr><th>round</th><th>rules off</th><th>verdict</th><th>max rel err</th>"
            f"<th>mismatch</th><th>seconds</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<h2>Ranking</h2><p>{html.escape(result['ranking_use'])}</p>")
    return page(f"accubisect {name}", body, SORT_SCRIPT)


def timeline_svg(probes: Sequence[Mapping[str, Any]], box: int = 22) -> str:
    """One column per round, one square per probe: green passed, red failed; hover names the rules off."""
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
            shapes.append(f"<rect x='{x}' y='{18 + row * (box + 4)}' width='{box}' height='{box}' fill='{colour}'>"
                          f"<title>off: {html.escape(', '.join(probe['off']) or 'nothing')}</title></rect>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img'>"
            f"<text x='0' y='34' font-size='11'>probes</text>{''.join(shapes)}</svg>")
