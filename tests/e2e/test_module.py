"""The workflow as a Snakemake module: a user's own Snakefile in a folder outside the checkout, holding the
`module` directive docs/your-project.md shows, runs the targets there; the rules' scripts and the schema are
found from the module, and every file lands in the user's folder."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLE_MODEL, EXAMPLE_SAMPLES, REPO, snakemake

from accubisect.workflow.packaged import SNAKEFILE

pytestmark = pytest.mark.e2e

# As docs/your-project.md gives it. A module's onstart/onsuccess run only when the user's Snakefile calls them:
# they refuse a read-only folder in one line, and print the answers at the end.
USER_SNAKEFILE = """\
from accubisect.workflow.packaged import SNAKEFILE


configfile: "config.yaml"


module accubisect:
    snakefile:
        SNAKEFILE
    config:
        config


use rule * from accubisect


onstart:
    accubisect.onstart()


onsuccess:
    accubisect.onsuccess()
"""


def _checkout_files() -> dict[Path, int]:
    """Where a run in the checkout writes (its workspace, results, Snakemake's folder) and the workflow's own
    folders, with each file's mtime."""
    places = [REPO / name for name in ("workspace", "results", ".snakemake", "rules", "scripts", "profiles")]
    return {path: path.stat().st_mtime_ns for place in places for path in place.rglob("*") if path.is_file()}


def test_a_users_snakefile_with_the_module_runs_compare_and_fusion_bisect_in_the_users_folder(tmp_path):
    project = tmp_path / "my project"
    project.mkdir()
    shutil.copy(EXAMPLE_MODEL, project / "net.onnx")
    shutil.copytree(EXAMPLE_SAMPLES, project / "data")
    config = yaml.safe_load((REPO / "examples" / "config.yaml").read_text()) | {"model": "net.onnx", "samples": "data"}
    (project / "config.yaml").write_text(yaml.safe_dump(config))
    (project / "Snakefile").write_text(USER_SNAKEFILE)
    before, started = _checkout_files(), time.time_ns()

    run = snakemake(project)  # the default target, the module's `all`: compare and fusion_bisect

    assert SNAKEFILE.resolve() == REPO / "Snakefile"  # the module is this checkout's workflow
    result = json.loads((project / "results" / "fusion_bisect" / "result.json").read_text())
    assert result["culprits"] == ["GeluApproximation"]
    assert not json.loads((project / "results" / "compare" / "report.json").read_text())["passed"]
    assert "results/fusion_bisect/summary.txt:\nmodel net.onnx; 4 sample(s) from data" in run.stdout, run.stdout
    after = _checkout_files()
    assert sorted(map(str, set(after) - set(before))) == []
    assert sorted(str(path) for path, mtime in after.items() if mtime >= started) == []
