"""The HTML pages: their header, the links between them as published, the answer and the command applying it,
the tolerance lines and the tensor rows the chart points to; and they render in a real headless Chromium
(a non-blank page, no console message)."""

import datetime
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import EXAMPLE, compare_report, copy_workflow, snakemake, tensor_row
from html_pages import Page, assert_links_resolve
from matplotlib import image

from accubisect.formats.bisect_result import FusionResult
from accubisect.formats.compare_report import CompareReport
from accubisect.formats.instances import InstanceEntry, InstancesRecord
from accubisect.reports.graph_view import graph_section
from accubisect.reports.report_html import (
    PANEL_HEIGHT,
    bisect_page,
    compare_page,
    depth_panels,
    explorer_note,
    instances_section,
    timeline_svg,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--window-size=1300,1400"]
PRECISION = ("--configfile", "examples/precision/config.yaml")  # publishes to results/precision_example
PAGES = {"compare": "fusion_bisect", "precision_example/precision": "precision_example/precision_bisect"}
PARTNER = {**PAGES, **{bisect: compare for compare, bisect in PAGES.items()}}  # the page each page links
COMPARISON = {**{compare: compare for compare in PAGES}, **{bisect: compare for compare, bisect in PAGES.items()}}
RUN = {"compare": ("examples/config.yaml", "examples/transformer.onnx"),
       "precision_example/precision": ("examples/precision/config.yaml", "examples/precision/extractor.onnx")}


def render(page, tmp_path, mode="--screenshot"):
    """A screenshot of `page` (or with mode "--dump-dom", the DOM Chromium built) and the console messages
    Chromium logged while loading it."""
    shot = tmp_path / f"{page.stem}.png"
    run = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          f"--screenshot={shot}" if mode == "--screenshot" else mode, page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    return (image.imread(shot) if mode == "--screenshot" else run.stdout), console


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """The bundled example after `snakemake fusion_bisect`, and the precision example after
    `snakemake precision_bisect`, in one folder."""
    folder = copy_workflow(tmp_path_factory.mktemp("html"))
    snakemake(folder, "fusion_bisect", *EXAMPLE)
    snakemake(folder, "precision_bisect", *PRECISION)
    return folder


@pytest.fixture(scope="module")
def reports(workflow):
    return workflow / "results"


@pytest.mark.e2e
def test_compare_page_shows_where_the_gelu_error_starts(reports):
    text = (reports / "compare" / "report.html").read_text()
    report = CompareReport.read(reports / "compare" / "report.json")
    # below its header (the date, the versions), the page is a pure rendering of the saved report
    graph = graph_section(report) + explorer_note(str(reports.parent / "examples" / "transformer.onnx"))
    assert text.partition("</header>")[2] == compare_page(report, graph=graph).partition("<body>")[2]
    assert "rule <b>GeluApproximation</b>" in text and "first divergence" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text) and "<link" not in text  # offline
    detailed = [row.tensor for row in report.tensors if row.details]
    assert text.partition("</header>")[2].count("<details>") == len(detailed)
    assert report.first_divergence.tensor in detailed


@pytest.mark.e2e
@pytest.mark.parametrize("folder", ["compare", "fusion_bisect", "precision_example/precision",
                                    "precision_example/precision_bisect"])
def test_every_page_states_model_tolerances_versions_date_and_config(workflow, folder):
    page = Page((workflow / "results" / folder / "report.html").read_text())
    config, model = RUN[COMPARISON[folder]]
    digest = hashlib.sha256((workflow / model).read_bytes()).hexdigest()[:12]
    assert f"model{model} (sha256 {digest})" in page.header
    accuracy = CompareReport.read(workflow / "results" / COMPARISON[folder] / "report.json").accuracy
    assert (f"rtol {accuracy['rtol']:g}, atol {accuracy['atol']:g}, ntol {accuracy['ntol']:g}, "
            f"min pass fraction {accuracy['min_pass_fraction']:g}") in page.header
    assert re.search(r"accubisect \S+, onnxruntime 1\.\d+\.\d+, onnx 1\.\d+\.\d+, numpy \d\S+, python 3\.",
                     page.header)
    assert f"written{datetime.datetime.now(datetime.UTC):%Y-%m-%d}" in page.header
    shown = yaml.safe_load(page.config)  # the folded config block
    assert shown["accuracy"] == {key: accuracy[key] for key in shown["accuracy"]}
    assert ("bisect" in shown) == folder.endswith("bisect")  # a comparison is shown the sections that decide it
    assert ("the sections that decide this comparison" in page.header) != folder.endswith("bisect")
    for key, value in yaml.safe_load((workflow / config).read_text()).items():  # what the run's config file set
        if key in shown:
            assert shown[key] == value or {**shown[key], **value} == shown[key], key


@pytest.mark.e2e
@pytest.mark.parametrize("folder", ["compare", "fusion_bisect", "precision_example/precision",
                                    "precision_example/precision_bisect"])
def test_links_between_published_pages_resolve(reports, folder):
    """compare ↔ fusion_bisect and precision ↔ precision_bisect, and each page's own files, where the pages
    are published; a link to a row (#row-i: a chart point, a graph node) names a row of the page it opens."""
    path = reports / folder / "report.html"
    page = assert_links_resolve(path)
    partner = PARTNER[folder]
    assert (path.parent / f"../{Path(partner).name}/report.html").resolve() == (reports / partner / "report.html")
    assert f"../{Path(partner).name}/report.html" in page.links
    rows = [link for link in page.links if "#row-" in link]
    assert rows and all(link.startswith("#" if "bisect" not in folder else f"../{Path(partner).name}/")
                        for link in rows)  # the bisect page's graph opens rows on the compare page


@pytest.mark.e2e
def test_the_compare_target_publishes_model_explorer_node_data(reports):
    """node_data.json beside the page: each original node of the model keyed as Model Explorer's ONNX adapter
    names it, with its compiled node's error; the page says how to open it."""
    data = json.loads((reports / "compare" / "node_data.json").read_text())
    report = CompareReport.read(reports / "compare" / "report.json")
    assert set(report.first_divergence.original_nodes) <= set(data["results"])  # the FastGelu's Gelu nodes
    assert all(data["results"][name]["value"] > 0 for name in report.first_divergence.original_nodes)
    text = (reports / "compare" / "report.html").read_text()
    assert "--extensions=model_explorer_onnx --node_data_paths=node_data.json</pre>" in text


@pytest.mark.e2e
def test_table_rows_are_the_chart_s_x(reports):
    report = CompareReport.read(reports / "compare" / "report.json")
    text = (reports / "compare" / "report.html").read_text()
    rows = re.findall(r"<tr id='row-(\d+)'[^>]*><td class='num'>(\d+)</td><td class='num'>(\d+)</td><td>([^<]*)</td>",
                      text)
    assert [(int(i), int(x), int(index), tensor) for i, x, index, tensor in rows] == [
        (i, i, row.index, row.tensor) for i, row in enumerate(report.tensors)]
    for i, row in enumerate(report.tensors):  # each tensor's column links its row and names it in its tooltip
        assert text.count(f"<a href='#row-{i}'><rect") == 1 and f"<title>#{i} {row.tensor} ({row.op_type}): " in text


@pytest.mark.e2e
def test_bisect_pages_show_the_answer_and_the_command_that_applies_it(workflow, reports, tmp_path):
    """The fusion page's command, run as the page writes it, makes the comparison pass; the precision page
    shows keep_dtype.txt and modify_mixlist.json and the command feeding keep_dtype back."""
    fusion = (reports / "fusion_bisect" / "report.html").read_text()
    switch = (reports / "fusion_bisect" / "fusion_switch.cfg").read_text()
    assert f"<pre class='answer'>{switch.replace(chr(34), '&quot;')}</pre>" in fusion
    command = re.search(r"<pre class='command'>([^<]*)</pre>", fusion).group(1).replace("&#x27;", "'")
    assert command == ("snakemake compare --cores 2 --configfile examples/config.yaml "
                       "--config compile='{fusion_switch: results/fusion_bisect/fusion_switch.cfg}'")
    copy = shutil.copytree(workflow, tmp_path / "copy", symlinks=True)
    subprocess.run([sys.executable, "-m", *shlex.split(command)], cwd=copy, check=True, capture_output=True)
    assert json.loads((copy / "results" / "compare" / "report.json").read_text())["passed"]

    precision = (reports / "precision_example" / "precision_bisect").joinpath("report.html").read_text()
    kept = (reports / "precision_example" / "precision_bisect" / "keep_dtype.txt").read_text().split()
    assert kept and all(name in precision for name in kept) and "modify_mixlist.json</a>" in precision
    command = re.search(r"<pre class='command'>([^<]*)</pre>", precision).group(1).replace("&#x27;", "'")
    words = shlex.split(command)
    assert words[:6] == ["snakemake", "precision", "--cores", "2", "--configfile", "examples/precision/config.yaml"]
    assert yaml.safe_load(words[-1].partition("precision=")[2]) == {"keep_dtype": kept}


@pytest.mark.e2e
def test_the_fusion_bisect_page_names_the_instances_that_break_accuracy(reports):
    """The page shows fusion_instances' answer: per culprit rule its line and its instances, the breaking
    one(s) marked, and links to instances.json and hybrid.onnx that resolve where the page is published."""
    path = reports / "fusion_bisect" / "report.html"
    page = assert_links_resolve(path)
    record = InstancesRecord.read(reports / "fusion_bisect" / "instances.json")
    text = path.read_text().partition("<h2>Which instances break accuracy</h2>")[2]
    breaking = [instance.name for instance in record.instances if instance.breaks]
    assert record.culprit_rules == ("GeluApproximation",) and breaking
    assert f"<b>rule GeluApproximation: 1 of 1 instances breaks accuracy: {breaking[0]}</b>" in text
    assert f"<td>{breaking[0]}</td>" in text and "<span class='fail'>breaks</span> (reverted)" in text
    assert "hybrid.onnx reverts 1 instance(s)" in text
    assert {"instances.json", "hybrid.onnx"} <= set(page.links)
    summary = (reports / "fusion_bisect" / "summary.txt").read_text().splitlines()
    assert summary[-2:] == (reports / "fusion_bisect" / "instances.txt").read_text().splitlines()[1:]


def test_the_instance_table_folds_long_original_nodes_and_says_why_an_instance_stays_fused():
    long = InstanceEntry("big", ("big",), tuple(f"n{i}" for i in range(12)), ("R",), 0.5, None, True)
    kept = InstanceEntry("small", ("small",), ("m",), ("R",), None, None, False)
    stuck = InstanceEntry("nchwc", ("nchwc", "reorder"), ("c",), ("R",), 0.1, "its output feeds a reorder", None)
    record = InstancesRecord(("R",), (long, kept, stuck), {"minimal": True, "search": "3 probe(s)"}, {})
    text = instances_section(record, ["the hybrid line"], ["instances.json", "hybrid.onnx"])
    assert ("<b>rule R: 1 of 3 instances breaks accuracy: big (1 cannot be reverted alone and stay fused: "
            "nchwc)</b>") in text
    assert "<details><summary>12</summary>n0, n1," in text and "<td>m</td>" in text
    assert "<span class='fail'>breaks</span> (reverted)" in text and "<td>kept fused</td>" in text
    assert "<td>stays fused: its output feeds a reorder</td>" in text and "<td class='num'>-</td>" in text
    assert "<p>the hybrid line</p><p><a href='instances.json'>instances.json</a> · <a href='hybrid.onnx'>" in text


def test_tolerance_lines_divide_failing_tensors_from_passing_ones():
    """On the mismatch panel a tensor above the ntol line fails and one on or below it passes; with a cosine
    tolerance, its line is drawn at 1 - cosine; rtol's line on the max relative error panel."""
    rows = [tensor_row(i, f"n{i}", passed=m <= 0.01, worst={"mismatch": m, "cosine": 1 - m / 10, "max_rel": m * 3})
            for i, m in enumerate([0.0, 0.005, 0.01, 0.02, 0.3, 0.001])]
    report = compare_report(tensors=rows)
    report = type(report)(**{**report.__dict__, "accuracy": {"rtol": 0.05, "atol": 1e-4, "ntol": 0.01,
                                                             "cosine": 0.999}})
    text = compare_page(report)
    lines = re.findall(r"<line class='tolerance' x1='[\d.]+' x2='[\d.]+' y1='([\d.]+)'", text)
    assert len(lines) == 3 and [panel.limit for panel in depth_panels(report)] == [0.01, pytest.approx(0.001), 0.05]
    first_panel = re.findall(r"<circle cx='[\d.]+' cy='([\d.]+)' r='2'", text)[:len(rows)]  # the points, in order
    ntol_y = float(lines[0])
    for row, y in zip(rows, first_panel, strict=True):
        assert (float(y) < ntol_y) == (not row.passed)  # above the line: fails
        assert float(y) <= ntol_y + PANEL_HEIGHT
    assert "no cosine tolerance" not in text
    report = type(report)(**{**report.__dict__, "accuracy": {"rtol": 0.05, "atol": 1e-4, "ntol": 0.01}})
    assert "no cosine tolerance" in compare_page(report) and compare_page(report).count("class='tolerance'") == 2


def test_each_bisection_page_names_a_probes_change_in_its_own_words():
    probes = [{"round": 0, "off": ["n1", "n2"], "passed": False}, {"round": 1, "off": [], "passed": True}]
    assert re.findall("<title>(.*?)</title>", timeline_svg(probes, "keep in fp32")) == ["keep in fp32: n1, n2",
                                                                                       "keep in fp32: nothing"]
    assert re.findall("<title>(.*?)</title>", timeline_svg(probes[:1], "switch off")) == ["switch off: n1, n2"]


@pytest.mark.e2e
def test_bisect_page_lists_every_probe(reports):
    result = FusionResult.read(reports / "fusion_bisect" / "result.json")
    text = (reports / "fusion_bisect" / "report.html").read_text()
    assert text.partition("<h1>")[2].partition("<h2>The answer</h2>")[0] == bisect_page(result).partition(
        "<h1>")[2].partition("<h2>Probes")[0]
    probes = text.partition("<h2>Probes, round by round</h2>")[2]
    assert probes.count("<rect") == len(result.probes) and "switch off GeluApproximation" in text
    graph = text.partition("<h2>The graph around the nodes the culprit rules made</h2>")[2].partition("<h2>Probes")[0]
    assert "culprit FastGelu" in graph  # the node GeluApproximation made


@pytest.mark.e2e
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (./run test installs it as root)")
@pytest.mark.parametrize("page", ["compare/report.html", "fusion_bisect/report.html",
                                  "precision_example/precision_bisect/report.html"])
def test_pages_render_in_headless_chromium(reports, tmp_path, page):
    pixels, console = render(reports / page, tmp_path)
    assert console == []
    grey = pixels[..., :3].mean(axis=2)
    assert (grey < 0.9).mean() > 0.01 and np.std(grey) > 0.05  # text and plots, not a blank page
    dom, _ = render(reports / page, tmp_path, "--dump-dom")
    assert "<header class=\"run\">" in dom and "sha256" in dom and "onnxruntime" in dom
    if page.startswith("compare"):
        report = CompareReport.read(reports / "compare" / "report.json")
        assert dom.count("class=\"tolerance\"") == 2  # ntol and rtol (the example sets no cosine tolerance)
        assert all(f"<tr id=\"row-{i}\"" in dom for i in range(len(report.tensors)))
