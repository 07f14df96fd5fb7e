"""The HTML reports render in a real headless Chromium: a non-blank page and no console message."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from conftest import EXAMPLE, copy_workflow, snakemake
from matplotlib import image

from accubisect.formats.compare_report import CompareReport
from accubisect.reports.report_html import bisect_page, compare_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--window-size=1300,1400"]


def render(page, tmp_path):
    """Screenshot of `page` and the console messages Chromium logged while loading it."""
    shot = tmp_path / f"{page.stem}.png"
    run = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                          page.as_uri()], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return image.imread(shot), [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("html"))
    snakemake(folder, "fusion_bisect", *EXAMPLE)
    return folder / "results"


@pytest.mark.e2e
def test_compare_page_shows_where_the_gelu_error_starts(reports):
    text = (reports / "compare" / "report.html").read_text()
    report = CompareReport.read(reports / "compare" / "report.json")
    assert text == compare_page(report)  # the page is a pure rendering of the saved report
    assert "rule <b>GeluApproximation</b>" in text and "first divergence" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text) and "<link" not in text  # offline
    detailed = [row.tensor for row in report.tensors if row.details]
    assert text.count("<details>") == len(detailed) and report.first_divergence.tensor in detailed


@pytest.mark.e2e
def test_bisect_page_lists_every_probe(reports):
    result = json.loads((reports / "fusion_bisect" / "result.json").read_text())
    text = (reports / "fusion_bisect" / "report.html").read_text()
    assert text == bisect_page(result)
    assert text.count("<rect") == len(result["probes"]) and "switch off GeluApproximation" in text


@pytest.mark.e2e
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (./run test installs it as root)")
@pytest.mark.parametrize("page", ["compare/report.html", "fusion_bisect/report.html"])
def test_pages_render_in_headless_chromium(reports, tmp_path, page):
    pixels, console = render(reports / page, tmp_path)
    assert console == []
    grey = pixels[..., :3].mean(axis=2)
    assert (grey < 0.9).mean() > 0.01 and np.std(grey) > 0.05  # text and plots, not a blank page
