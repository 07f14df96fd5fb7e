"""The graph a person can look at: the region of the compiled graph around the first divergence and around
each culprit, drawn as an inline SVG fragment for the HTML reports (no external resource, no script).

Nodes are the candidate's compiled nodes, one box per node, laid out left to right in topological order;
an edge runs from the node that produced a tensor to each node that reads it, as the report's rows say
(`inputs` -> the row whose tensor it is). A fused node is a box labelled with its name, op type and rule,
listing the original nodes it absorbed. The fill is the node's error on a log scale (`node_error`), a red
border marks a node whose tensor fails the tolerances, hovering shows the metrics, and a click jumps to the
tensor's row of the report's table (the row of `report.tensors[i]` has the HTML id `row-{i}`).

A region is bounded (`HOPS` producers and consumers away from its seed, at most `MAX_NODES` boxes), so a
detector of hundreds of nodes draws a few dozen boxes around where its error appears, not the whole model.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from accubisect.core.metrics import worst_value
from accubisect.formats.assignment import Assignment
from accubisect.formats.compare_report import CompareReport, TensorRow

HOPS = 3  # producers and consumers drawn on each side of a seed
MAX_NODES = 30  # boxes per region, the nearest to the seed first
MAX_REGIONS = 8  # regions per section; the rest are named, not drawn
SHOWN_ORIGINALS = 6  # original nodes listed inside a fused node's box
BOX_WIDTH, COLUMN_GAP, BOX_GAP, LINE = 210, 44, 14, 15
LABEL_CHARS = 29  # longer names are cut in the box; the hover shows them whole
SCALE_LOW, SCALE_HIGH = -8, 0  # decades of the colour scale: 1e-8 .. 1
PALETTE = ("#1a9850", "#91cf60", "#fee08b", "#fc8d59", "#d73027")  # green (exact) .. red (all wrong)
NOT_FINITE, UNMEASURED = "#8e44ad", "#e0e0e0"
SHOWN_METRICS = ("rel_euclidean", "max_rel", "max_abs", "mismatch", "cosine", "overflow_cand")

STYLE = """
.graph-view .region { overflow-x: auto; margin: .3em 0 1.2em; }
.graph-view a:hover rect.node { stroke-width: 3; }
.graph-view .legend { font-size: 12px; color: #444; max-width: 70em; }
tr:target > td { background: #fff59d; }
"""


@dataclass(frozen=True)
class Box:
    """One compiled node as drawn: its rows (positions in `report.tensors`) and what they say about it."""

    name: str
    index: int
    op_type: str
    rule: str | None
    original_nodes: tuple[str, ...]
    rows: tuple[int, ...]
    inputs: tuple[str, ...]

    @property
    def fused(self) -> bool:
        return self.original_nodes not in ((), (self.name,))


@dataclass(frozen=True)
class Region:
    """The boxes drawn around one seed (or several seeds that fall in one region), with the seeds' labels."""

    labels: tuple[str, ...]
    seeds: tuple[str, ...]
    boxes: tuple[str, ...]  # node names, in topological order


def node_error(rows: Sequence[TensorRow]) -> tuple[float | None, str]:
    """The error a node shows, and which: its local error (the relative Euclidean error it makes run alone on
    the reference's own inputs) where measured, else the worst relative Euclidean error of its outputs (what it
    inherits included), else their worst mismatch fraction; (None, "") where none is known. NaN is worst."""
    for kind, metric, values in (("local", "rel_euclidean", [row.local for row in rows if row.local]),
                                 ("total", "rel_euclidean", [row.worst for row in rows]),
                                 ("mismatch", "mismatch", [row.worst for row in rows])):
        known = [float(value[metric]) for value in values if value.get(metric) is not None]
        if known:
            return worst_value(known, metric), kind
    return None, ""


def _rank(value: float) -> float:
    return math.inf if math.isnan(value) else value


def error_colour(value: float | None) -> str:
    """`value` on the log scale SCALE_LOW..SCALE_HIGH decades, through PALETTE; 0 is the scale's bottom."""
    if value is None:
        return UNMEASURED
    if not math.isfinite(value):
        return NOT_FINITE
    at = math.log10(value) if value > 0 else SCALE_LOW
    position = (min(max(at, SCALE_LOW), SCALE_HIGH) - SCALE_LOW) / (SCALE_HIGH - SCALE_LOW) * (len(PALETTE) - 1)
    low = min(int(position), len(PALETTE) - 2)
    return _mix(PALETTE[low], PALETTE[low + 1], position - low)


def _mix(a: str, b: str, t: float) -> str:
    channels = (round(int(a[i:i + 2], 16) * (1 - t) + int(b[i:i + 2], 16) * t) for i in (1, 3, 5))
    return "#" + "".join(f"{c:02x}" for c in channels)


def boxes_of(report: CompareReport) -> dict[str, Box]:
    """The report's compiled nodes, by name, in topological order."""
    rows: dict[str, list[int]] = {}
    for position, row in enumerate(report.tensors):
        rows.setdefault(row.node, []).append(position)
    boxes = {}
    for name, positions in rows.items():
        first = report.tensors[positions[0]]
        inputs = tuple(dict.fromkeys(i for p in positions for i in report.tensors[p].inputs))
        boxes[name] = Box(name, first.index, first.op_type, first.rule, first.original_nodes, tuple(positions), inputs)
    return boxes


def find_nodes(report: CompareReport, name: str) -> list[str]:
    """The compiled nodes `name` means: a compiled node, an original node one absorbed, or a tensor's name."""
    found = [row.node for row in report.tensors if name in (row.node, row.tensor) or name in row.original_nodes]
    return list(dict.fromkeys(found))


def regions(report: CompareReport, focus: Sequence[str] = ()) -> tuple[list[Region], list[str]]:
    """The regions to draw: around the first divergence (else the report's largest local error, else the node
    showing the largest error, `node_error`) and each of `focus`;
    a seed inside an earlier region is marked there. Also the focus names no compared tensor stands for."""
    boxes = boxes_of(report)
    producers = {report.tensors[p].tensor: box.name for box in boxes.values() for p in box.rows}
    consumers: dict[str, list[str]] = {}
    for box in boxes.values():
        for tensor in box.inputs:
            if tensor in producers and producers[tensor] != box.name:
                consumers.setdefault(producers[tensor], []).append(box.name)
    seeds: list[tuple[str, str]] = []
    if report.first_divergence is not None:
        seeds.append(("first divergence", report.first_divergence.node))
    elif report.worst_local is not None:
        seeds += [("largest local error", node) for node in find_nodes(report, report.worst_local.tensor)]
    else:
        shown = [(node_error([report.tensors[p] for p in box.rows])[0], box.name) for box in boxes.values()]
        shown = [(value, name) for value, name in shown if value]
        if shown:
            seeds.append(("largest error", max(shown, key=lambda pair: _rank(pair[0]))[1]))
    missing = []
    for name in focus:
        found = find_nodes(report, name)
        seeds += [(f"culprit {name}", node) for node in found]
        if not found:
            missing.append(name)
    drawn: list[Region] = []
    for label, seed in seeds:
        home = next((i for i, region in enumerate(drawn) if seed in region.boxes), None)
        if home is not None:
            region = drawn[home]
            if label not in region.labels:
                drawn[home] = Region((*region.labels, label), tuple(dict.fromkeys((*region.seeds, seed))),
                                     region.boxes)
            continue
        near = _neighbourhood(seed, boxes, producers, consumers)
        drawn.append(Region((label,), (seed,), tuple(sorted(near, key=lambda n: boxes[n].index))))
    return drawn, missing


def _neighbourhood(seed: str, boxes: Mapping[str, Box], producers: Mapping[str, str],
                   consumers: Mapping[str, Sequence[str]]) -> list[str]:
    """The seed and the nodes up to HOPS producers or consumers away, nearest first (ties: nearest in
    topological order); at most MAX_NODES. Where the seed has no producer (or no consumer) among the rows,
    because the edge runs through tensors the report does not compare (inside a fused chain, an NCHWc
    layout), the HOPS nodes before (after) it in topological order stand in."""
    order = list(boxes)
    at = order.index(seed)
    chosen = [seed]
    if not any(t in producers for t in boxes[seed].inputs):
        chosen += order[max(at - HOPS, 0):at]
    if not consumers.get(seed):
        chosen += order[at + 1:at + 1 + HOPS]
    frontier = [seed]
    for _ in range(HOPS):
        step = []
        for name in frontier:
            step += [producers[t] for t in boxes[name].inputs if t in producers]
            step += consumers.get(name, [])
        fresh = sorted(dict.fromkeys(n for n in step if n not in chosen),
                       key=lambda n: abs(boxes[n].index - boxes[seed].index))
        room = MAX_NODES - len(chosen)
        chosen += fresh[:room]
        frontier = fresh[:room]
        if not frontier:
            break
    return chosen


def graph_section(report: CompareReport, focus: Sequence[str] = (),
                  title: str = "The graph around the first divergence",
                  assignment: Assignment | None = None, rows_page: str = "",
                  runtime: Mapping[str, str] | None = None) -> str:
    """An HTML fragment: `title`, the legend and one SVG per region (around the first divergence and each
    of `focus`: compiled node, original node or tensor names). `assignment` (a precision comparison's
    assignment.json) marks each node fp32 or the reduced type; without one, `runtime` (node -> the precision
    it ran in, where the backend says: OpenVINO's runtimePrecision) does. A click opens the node's row on
    `rows_page` (a relative link; "": this page)."""
    found, missing = regions(report, focus)
    parts = [f"<section class='graph-view'><style>{STYLE}</style><h2>{html.escape(title)}</h2>"]
    if not found:
        parts.append("<p>No compared tensor fails the tolerances and no culprit was named: nothing to draw.</p>")
    else:
        parts.append(_legend(report, assignment, bool(runtime)))
    boxes = boxes_of(report)
    drawing = _Drawing(report, _precision_of(assignment, runtime or {}), rows_page)
    for region in found[:MAX_REGIONS]:
        parts.append(f"<h3>Around the {html.escape(', '.join(region.labels))}</h3>"
                     f"{_region_svg(drawing, boxes, region)}")
    if len(found) > MAX_REGIONS:
        rest = ", ".join(label for region in found[MAX_REGIONS:] for label in region.labels)
        parts.append(f"<p>Not drawn (more than {MAX_REGIONS} regions): {html.escape(rest)}.</p>")
    if missing:
        parts.append(f"<p>No compared tensor comes from {html.escape(', '.join(missing))}: not drawn.</p>")
    parts.append("</section>")
    return "".join(parts)


def _precision_of(assignment: Assignment | None, runtime: Mapping[str, str]):
    """A function: box -> its precision label: the assignment's, else the one it ran in (`runtime`), else ""."""
    if assignment is None:
        return lambda box: runtime.get(box.name, "")
    reduced = set(assignment.reduced)

    def label(box: Box) -> str:
        if assignment.graph == "compiled":
            return assignment.dtype if box.name in reduced else "fp32"
        inside = [name in reduced for name in box.original_nodes or (box.name,)]
        return assignment.dtype if all(inside) else "fp32" if not any(inside) else f"{assignment.dtype}/fp32"

    return label


def _legend(report: CompareReport, assignment: Assignment | None, runtime: bool = False) -> str:
    width, bar = 460, 300
    stops = "".join(f"<stop offset='{i / (len(PALETTE) - 1):.2f}' stop-color='{c}'/>" for i, c in enumerate(PALETTE))
    ticks = "".join(f"<text x='{10 + bar * (d - SCALE_LOW) / (SCALE_HIGH - SCALE_LOW):.0f}' y='40' font-size='10' "
                    f"text-anchor='middle'>1e{d}</text>" for d in range(SCALE_LOW, SCALE_HIGH + 1, 2))
    swatches = (f"<rect x='{bar + 30}' y='8' width='16' height='16' fill='{NOT_FINITE}'/>"
                f"<text x='{bar + 50}' y='20' font-size='11'>NaN/inf</text>"
                f"<rect x='{bar + 30}' y='28' width='16' height='16' fill='{UNMEASURED}'/>"
                f"<text x='{bar + 50}' y='40' font-size='11'>no metric</text>")
    svg = (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='46' role='img' font-family='sans-serif'>"
           f"<defs><linearGradient id='graph-view-scale'>{stops}</linearGradient></defs>"
           f"<rect x='10' y='8' width='{bar}' height='18' fill='url(#graph-view-scale)' stroke='#999'/>{ticks}"
           f"{swatches}</svg>")
    precision = (f" Each box says whether its node runs in fp32 or {html.escape(assignment.dtype)}."
                 if assignment else " Each box says the precision its node ran in, as the backend reports it."
                 if runtime else "")
    return (f"<p class='legend'>{html.escape(report.candidate)} against {html.escape(report.reference)}. Fill: a "
            "node's local error (relative Euclidean error it makes run alone on the reference's inputs; solid "
            "border); where that was not measured, the worst relative error of its outputs, inherited error "
            "included (dashed border). Red border: a tensor of the node fails the tolerances. A fused node lists "
            "the original nodes it absorbed and the rule that made it. Edges follow the compared tensors; where "
            "a seed has none on a side (its edges run through tensors not compared, inside fused chains or "
            "NCHWc layouts), the nodes just before or after it in topological order stand there, unlinked."
            + precision +
            " Hover a node for its metrics; click it for its row in the table.</p>" + svg)


def _cut(text: str, chars: int = LABEL_CHARS) -> str:
    """`text` in at most `chars` characters, keeping its end: exported names share long scope prefixes
    (`/model/encoder/layer.0/...`) and differ in their last parts."""
    return html.escape(text if len(text) <= chars else "…" + text[1 - chars:])


@dataclass(frozen=True)
class _Drawing:
    """What every box of one graph view is drawn from: the comparison, each box's precision label, the page a
    click opens the box's row on, and the tensors compared (an input not among them is named in the hover)."""

    report: CompareReport
    precision: Callable[[Box], str]
    rows_page: str

    @cached_property
    def compared(self) -> frozenset[str]:
        return frozenset(row.tensor for row in self.report.tensors)


def _region_svg(drawing: _Drawing, boxes: Mapping[str, Box], region: Region) -> str:
    report = drawing.report
    names = region.boxes
    producers = {report.tensors[p].tensor: name for name in names for p in boxes[name].rows}
    seed = boxes[region.seeds[0]].index
    column: dict[str, int] = {}
    for name in names:  # topological order: every producer is placed first
        inside = [producers[t] for t in boxes[name].inputs if producers.get(t) not in (None, name)]
        after_seed = [column[s] + 1 for s in region.seeds if s in column and boxes[name].index > seed]
        column[name] = max((column[p] + 1 for p in inside), default=max(after_seed, default=0))
    heights = {name: _box_height(boxes[name]) for name in names}
    place: dict[str, tuple[float, float]] = {}
    tops: dict[int, float] = {}
    for name in names:
        x, y = 10 + column[name] * (BOX_WIDTH + COLUMN_GAP), tops.get(column[name], 24.0)
        place[name] = (x, y)
        tops[column[name]] = y + heights[name] + BOX_GAP
    width = 20 + (max(column.values()) + 1) * (BOX_WIDTH + COLUMN_GAP) - COLUMN_GAP
    height = max(tops.values()) + 4
    edges = []
    for name in names:
        for tensor in boxes[name].inputs:
            source = producers.get(tensor)
            if source is None or source == name:
                continue
            (x1, y1), (x2, y2) = place[source], place[name]
            x1, y1, y2 = x1 + BOX_WIDTH, y1 + heights[source] / 2, y2 + heights[name] / 2
            bend = (x2 - x1) / 2
            edges.append(f"<path d='M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1:.0f} {x2 - bend:.0f},{y2:.0f} "
                         f"{x2 - 4:.0f},{y2:.0f}' fill='none' stroke='#777' marker-end='url(#graph-view-arrow)'>"
                         f"<title>{html.escape(tensor)}</title></path>")
    drawn = "".join(_box_svg(drawing, boxes[name], *place[name], heights[name], name in region.seeds)
                    for name in names)
    arrow = ("<defs><marker id='graph-view-arrow' viewBox='0 0 8 8' refX='7' refY='4' markerWidth='7' "
             "markerHeight='7' orient='auto'><path d='M0,0 L8,4 L0,8 z' fill='#777'/></marker></defs>")
    return (f"<div class='region'><svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' "
            f"height='{height:.0f}' role='img' font-family='sans-serif' font-size='11'>{arrow}{''.join(edges)}"
            f"{drawn}</svg></div>")


def _box_height(box: Box) -> float:
    originals = min(len(box.original_nodes), SHOWN_ORIGINALS + 1) if box.fused else 0
    return LINE * 3 + 8 + (originals * (LINE + 2) + 6 if originals else 0)


def _box_svg(drawing: _Drawing, box: Box, x: float, y: float, height: float, seed: bool) -> str:
    rows = [drawing.report.tensors[p] for p in box.rows]
    value, kind = node_error(rows)
    failed = not all(row.passed for row in rows)
    stroke = "#c62828" if failed else "#555"
    dash = " stroke-dasharray='5 3'" if kind != "local" else ""
    line2 = " · ".join(part for part in (box.op_type, box.rule or "no rule", drawing.precision(box)) if part)
    error = ("no metric" if value is None else
             f"{'local' if kind == 'local' else 'worst ' + ('rel. error' if kind == 'total' else kind)} "
             f"{value:.3g}") + (" · FAIL" if failed else "")
    parts = [f"<rect class='node' x='{x:.0f}' y='{y:.0f}' width='{BOX_WIDTH}' height='{height:.0f}' rx='5' "
             f"fill='{error_colour(value)}' stroke='{stroke}' stroke-width='{2.5 if failed else 1.2}'{dash}/>",
             f"<text x='{x + 6:.0f}' y='{y + LINE:.0f}' font-weight='bold'>{_cut(box.name)}</text>",
             f"<text x='{x + 6:.0f}' y='{y + 2 * LINE:.0f}'>{_cut(line2, LABEL_CHARS + 4)}</text>",
             f"<text x='{x + 6:.0f}' y='{y + 3 * LINE:.0f}'>{html.escape(error)}</text>"]
    if box.fused and box.original_nodes:
        shown = list(box.original_nodes[:SHOWN_ORIGINALS])
        if len(box.original_nodes) > SHOWN_ORIGINALS:
            shown.append(f"+ {len(box.original_nodes) - SHOWN_ORIGINALS} more")
        for i, name in enumerate(shown):
            top = y + 3 * LINE + 8 + i * (LINE + 2)
            parts.append(f"<rect x='{x + 10:.0f}' y='{top:.0f}' width='{BOX_WIDTH - 20}' height='{LINE}' rx='3' "
                         f"fill='#ffffff' fill-opacity='0.75' stroke='#999'/><text x='{x + 14:.0f}' "
                         f"y='{top + LINE - 4:.0f}' font-size='10'>{_cut(name, LABEL_CHARS + 4)}</text>")
    if seed:
        parts.append(f"<text x='{x:.0f}' y='{y - 4:.0f}' font-size='10' fill='#c62828' font-weight='bold'>"
                     "▼ seed of this region</text>")
    hover = html.escape(_hover(drawing, box, rows, value, kind))
    return f"<a href='{drawing.rows_page}#row-{box.rows[0]}'><g><title>{hover}</title>{''.join(parts)}</g></a>"


def _hover(drawing: _Drawing, box: Box, rows: Sequence[TensorRow], value: float | None, kind: str) -> str:
    lines = [f"node {box.name} ({box.op_type}), topological index {box.index}",
             f"rule: {box.rule or 'none'}" + (f" (rules: {', '.join(rows[0].rules)})" if len(rows[0].rules) > 1
                                              else "")]
    if drawing.precision(box):
        lines.append(f"precision: {drawing.precision(box)}")
    if box.original_nodes:
        lines.append(f"original nodes: {', '.join(box.original_nodes)}")
    lines.append(f"shown error: {kind or 'none'} {'' if value is None else f'{value:.4g}'}")
    other = [tensor for tensor in box.inputs if tensor not in drawing.compared]
    if other:
        lines.append(f"inputs not compared (weights, model inputs, tensors inside fused chains): {', '.join(other)}")
    for row in rows:
        metrics = ", ".join(f"{m} {row.worst[m]:.4g}" for m in SHOWN_METRICS if m in row.worst)
        lines.append(f"tensor {row.tensor}: {'pass' if row.passed else 'FAIL'}; worst over samples: {metrics}")
        if row.local:
            lines.append("  made alone: " + ", ".join(f"{m} {v:.4g}" for m, v in row.local.items()))
    return "\n".join(lines)
