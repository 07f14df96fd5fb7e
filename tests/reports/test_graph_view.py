"""The graph view of the HTML reports, on the bundled example's real compare report (compiled, dumped and
compared through the library's stages) and on large synthetic row sets, and rendered in headless Chromium."""

import math
import re
import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from dataclasses import replace

import numpy as np
import pytest
from conftest import compare_report, tensor_row
from matplotlib import image
from real_reports import example_report

from accubisect.formats.assignment import Assignment
from accubisect.formats.compare_report import Divergence
from accubisect.reports import graph_view
from accubisect.reports.graph_view import error_colour, graph_section, node_error, regions
from accubisect.reports.report_html import page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1300,900"]
GELU = ("gelu/div", "gelu/erf", "gelu/add", "gelu/mul", "gelu/half")


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return example_report(tmp_path_factory.mktemp("example"))


def svgs(section):
    """Each SVG of the section, parsed: the fragment must be well-formed where a browser reads it as XML."""
    return [ElementTree.fromstring(svg) for svg in re.findall(r"<svg .*?</svg>", section, re.S)]


def boxes(svg):
    """(link target, hover text) of every node box in a region's SVG."""
    return [(link.get("href"), link.find("{*}g/{*}title").text) for link in svg.iter("{http://www.w3.org/2000/svg}a")]


def test_the_first_divergence_is_drawn_fused_with_its_original_nodes_and_linked_to_its_row(example):
    section = graph_section(example)
    legend, region = svgs(section)
    row = next(i for i, r in enumerate(example.tensors) if r.node == example.first_divergence.node == "FastGelu")
    drawn = dict(boxes(region))
    assert f"#row-{row}" in drawn
    hover = drawn[f"#row-{row}"]
    assert "rule: GeluApproximation" in hover and "FAIL" in hover and all(name in hover for name in GELU)
    texts = [t.text for t in region.iter("{http://www.w3.org/2000/svg}text")]
    assert "FastGelu" in texts and all(name in texts for name in GELU)  # the box lists what it absorbed
    assert any(t and t.startswith("local ") and t.endswith("FAIL") for t in texts)  # measured alone, failing
    producer = next(i for i, r in enumerate(example.tensors) if r.tensor == example.tensors[row].inputs[0])
    assert f"#row-{producer}" in drawn and len(region.findall(".//{*}path[@marker-end]")) >= 1
    assert "Around the first divergence" in section and "https:" not in section and "<script" not in section


def test_a_culprit_named_by_an_original_node_is_drawn_as_the_fused_node_that_absorbed_it(example):
    section = graph_section(example, focus=["conv/relu", "no/such/node"], title="Culprits")
    drawn, missing = regions(example, ["conv/relu", "no/such/node"])
    assert [region.labels for region in drawn] == [("first divergence",), ("culprit conv/relu",)]
    assert drawn[1].seeds == ("conv/conv1",) and missing == ["no/such/node"]
    assert "<h2>Culprits</h2>" in section and "No compared tensor comes from no/such/node" in section
    assert any("original nodes: conv/conv1, conv/bn, conv/relu" in hover for _, hover in boxes(svgs(section)[2]))


def test_a_culprit_inside_the_divergence_region_marks_that_region(example):
    drawn, _ = regions(example, ["gelu/erf"])
    assert [region.labels for region in drawn] == [("first divergence", "culprit gelu/erf")]


def test_each_node_says_its_precision_when_an_assignment_is_given(example):
    assignment = Assignment("force_fp16", "fp16", "compiled", ("FastGelu",), (), (), {}, {})
    hovers = dict(boxes(svgs(graph_section(example, assignment=assignment))[1]))
    precisions = {re.search(r"^node (\S+)", h).group(1): re.search(r"precision: (\S+)", h).group(1)
                  for h in hovers.values()}
    assert precisions["FastGelu"] == "fp16" and set(precisions.values()) == {"fp16", "fp32"}
    by_original = Assignment("force_fp16", "fp16", "original", ("gelu/div", "gelu/erf"), (), (), {}, {})
    assert "precision: fp16/fp32" in graph_section(example, assignment=by_original)


def test_the_shown_error_is_local_where_measured_then_total_then_mismatch():
    row = tensor_row(0, "a", worst={"rel_euclidean": 0.5, "mismatch": 0.2}, local={"rel_euclidean": 1e-3})
    assert node_error([row]) == (1e-3, "local")
    assert node_error([replace(row, local=None)]) == (0.5, "total")
    assert node_error([tensor_row(0, "a", worst={"mismatch": 0.2})]) == (0.2, "mismatch")
    assert node_error([tensor_row(0, "a")]) == (None, "")
    nan = node_error([row, replace(row, local={"rel_euclidean": math.nan})])
    assert math.isnan(nan[0]) and nan[1] == "local"


PALETTE = graph_view.PALETTE


@pytest.mark.parametrize(("value", "colour"), [(0.0, PALETTE[0]), (1e-12, PALETTE[0]), (1.0, PALETTE[-1]),
                                               (50.0, PALETTE[-1]), (1e-4, PALETTE[2]),
                                               (math.nan, graph_view.NOT_FINITE), (math.inf, graph_view.NOT_FINITE),
                                               (None, graph_view.UNMEASURED)])
def test_colour_scale(value, colour):
    assert error_colour(value) == colour


def wide_report(n=600, fan=6):
    """n nodes: a chain, every node also read by `fan` consumers further on; the middle one fails first."""
    rows = []
    for i in range(n):
        inputs = tuple(f"n{j}:0" for j in range(max(i - fan, 0), i))
        rows.append(replace(tensor_row(i, f"n{i}", passed=i < n // 2, worst={"rel_euclidean": 10.0 ** (i / n * 8 - 8)}),
                            inputs=inputs))
    return replace(compare_report(tensors=rows), first_divergence=Divergence.of(rows[n // 2]))


def test_a_large_graph_draws_bounded_regions():
    report = wide_report()
    focus = [f"n{i}" for i in range(0, 600, 37)]  # more culprits than regions drawn
    section = graph_section(report, focus=focus)
    drawn = svgs(section)[1:]
    assert len(drawn) == graph_view.MAX_REGIONS and all(len(boxes(svg)) <= graph_view.MAX_NODES for svg in drawn)
    assert "Not drawn (more than" in section and len(section) < 400_000


def test_a_passing_report_is_drawn_around_its_largest_error():
    rows = [tensor_row(i, f"n{i}", worst={"rel_euclidean": value}) for i, value in enumerate([1e-7, 3e-5, 0.0])]
    drawn, _ = regions(compare_report(tensors=rows, passed=True))
    assert [(region.labels, region.seeds) for region in drawn] == [(("largest error",), ("n1",))]
    assert "nothing to draw" in graph_section(compare_report(tensors=[tensor_row(0, "a")], passed=True))


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (./run test installs it as root)")
def test_the_view_renders_in_headless_chromium_and_names_the_culprit(example, tmp_path):
    culprits = [row.node for row in example.tensors if row.rule == "GeluApproximation"]
    table = "".join(f"<tr id='row-{i}'><td>{row.tensor}</td></tr>" for i, row in enumerate(example.tensors))
    path = tmp_path / "graph.html"
    path.write_text(page("graph view", graph_section(example, focus=culprits) + f"<table>{table}</table>"))
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "graph.png"
    run = subprocess.run([*common, f"--screenshot={shot}", path.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    grey = image.imread(shot)[..., :3].mean(axis=2)
    assert (grey < 0.9).mean() > 0.02 and np.std(grey) > 0.05  # boxes and text, not a blank page
    assert (np.abs(image.imread(shot)[..., :3] - [0xfe / 255, 0xe0 / 255, 0x8b / 255]).sum(axis=2) < 0.15).any()
    dom = subprocess.run([*common, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    region = re.search(r"Around the first divergence, culprit FastGelu</h3>.*?</svg>", dom.stdout, re.S)
    assert region and ">FastGelu</text>" in region.group(0) and "GeluApproximation" in region.group(0)
