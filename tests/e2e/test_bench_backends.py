"""bench/backends.py (issue 24 item 7): its cases are checked before anything runs, and on the bundled example it
prints each measure on ORT and on OpenVINO with their ratio, from real compiles, probes and `snakemake` runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from accubisect.runtime.openvino_backend import cpu_capabilities

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "backends.py"


def bench(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *arguments], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_an_unknown_case_is_refused_in_one_line_naming_the_choices():
    result = bench("--cases", "example,resnet")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert "--cases: unknown resnet" in error and "magika" in error and "example" in error
    assert result.stdout == ""


@pytest.mark.e2e
@pytest.mark.skipif("BF16" not in cpu_capabilities(), reason=f"this CPU's OpenVINO capabilities are "
                                                               f"{cpu_capabilities()}")
def test_the_example_is_measured_on_both_backends_with_their_ratio(tmp_path):
    result = bench("--cases", "example", "--repeat", "1", "--keep", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    rows = {match[0]: match[1:] for match in re.findall(
        r"^example +(compile \(s\)|probe \(s\)) +([\d.]+) +([\d.]+) +([\d.]+)x$", result.stdout, re.MULTILINE)}
    assert set(rows) == {"compile (s)", "probe (s)"}
    for ort, openvino, ratio in rows.values():
        assert float(ort) > 0 and float(openvino) > 0
        assert float(ratio) == pytest.approx(float(openvino) / float(ort), rel=0.05, abs=0.01)
    for target in ("compare", "precision_bisect"):
        assert re.search(rf"^example +{target} wall +[\d.]+ s.* [\d.]+ s.* [\d.]+x$", result.stdout, re.MULTILINE)
    assert re.search(r"^ +  dump +[\d.]+ +[\d.]+ +[\d.]+x$", result.stdout, re.MULTILINE)  # compare's dumps, both
    assert {path.parent.name for path in tmp_path.glob("example-*/bench.yaml")} == {"example-ort-cpu",
                                                                                      "example-openvino-cpu"}
