"""One install, one command: the wheel carries the workflow, `accubisect init` writes a config that documents
itself, and `accubisect run TARGET` runs the packaged workflow in the user's folder with the project's profiles.
The e2e test builds the real wheel and runs it from a fresh venv outside the checkout."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLE_MODEL, EXAMPLE_SAMPLES, REPO, schema_keys
from snakemake.cli import get_argument_parser

from accubisect.core.errors import ConfigError
from accubisect.formats.config import load_schema, validate_config
from accubisect.workflow.cli import main
from accubisect.workflow.packaged import PROFILES, SNAKEFILE, WORKFLOW, RunRequest, snakemake_command

LINKED = ("Snakefile", "rules", "scripts", "profiles")  # what data/workflow links to, and the wheel carries


def _at(config: dict, dotted: str):
    for part in dotted.split("."):
        config = config[part]
    return config


def test_init_writes_every_key_at_its_default_under_its_description(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    text = (tmp_path / "config.yaml").read_text()
    written = yaml.safe_load(text)
    assert validate_config(written) == written  # nothing left for the schema to fill: every key is there
    comments = " ".join(line.strip().lstrip("# ") for line in text.splitlines() if line.lstrip().startswith("#"))
    leaves = schema_keys(load_schema()["properties"])
    for key, spec in leaves.items():
        assert _at(written, key) == spec.get("default", spec.get("examples", [None])[0]), key
        assert " ".join(spec["description"].split()) in comments, key
    assert "wrote config.yaml" in capsys.readouterr().out


def test_init_leaves_an_existing_config_as_it_is(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("model: mine.onnx\n")
    assert main(["init"]) == 2
    assert (tmp_path / "config.yaml").read_text() == "model: mine.onnx\n"
    error = capsys.readouterr().err.splitlines()
    assert len(error) == 1 and error[0].startswith("accubisect: config.yaml exists"), error


def _as_snakemake_reads(command: list[str]) -> argparse.Namespace:
    assert command[1:3] == ["-m", "snakemake"]
    return get_argument_parser().parse_args(command[3:])


def test_run_reads_the_folders_config_and_passes_the_users_arguments_as_snakemake_reads_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="accubisect init"):
        snakemake_command(RunRequest("compare"))
    (tmp_path / "config.yaml").write_text("model: m.onnx\nsamples: s\n")
    plain = _as_snakemake_reads(snakemake_command(RunRequest("compare", "net.onnx", "data", None, "slurm",
                                                             ("reduce", "-n"))))
    assert (plain.targets, plain.dryrun, plain.configfile) == (["compare", "reduce"], True, [Path("config.yaml")])
    assert (Path(plain.snakefile), plain.profile) == (SNAKEFILE, [str(PROFILES / "slurm")])
    assert plain.config == ["model=net.onnx", "samples=data"]
    (tmp_path / "my.yaml").write_text("model: m.onnx\n")
    own = _as_snakemake_reads(snakemake_command(RunRequest("compare", "net.onnx", None, Path("my.yaml"), "local", (
        "fusion_bisect", "--config", "results=r", "--cores", "2"))))
    assert (own.targets, own.cores, own.configfile) == (["compare", "fusion_bisect"], 2, [Path("my.yaml")])
    assert own.config == ["model=net.onnx", "results=r"]  # one --config: snakemake keeps only the last


def test_run_refuses_a_profile_it_does_not_carry_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "compare", "--model", "m.onnx", "--samples", "s", "--profile", "nosuch"]) == 2
    error = capsys.readouterr().err.splitlines()
    assert len(error) == 1 and "--profile nosuch" in error[0] and "local, slurm" in error[0], error


def test_the_package_links_to_the_checkouts_workflow_and_carries_every_file_of_it():
    """One copy in git: data/workflow's entries are links to the checkout's own files, and pyproject's
    package-data patterns take every file of them into the wheel."""
    for name in LINKED:
        assert (WORKFLOW / name).is_symlink() and (WORKFLOW / name).resolve() == REPO / name, name
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["accubisect"]
    carried = {path.resolve() for pattern in patterns for path in (REPO / "src" / "accubisect").glob(pattern)}
    files = {path for name in LINKED for path in [REPO / name, *(REPO / name).rglob("*")]
             if path.is_file() and "__pycache__" not in path.parts}
    assert sorted(map(str, files - carried)) == []


def _wheel_sources(into: Path) -> Path:
    """The files the wheel is built from, copied (links kept): building writes build/ and *.egg-info beside them,
    which must not land in the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    into.mkdir()
    for name in ("pyproject.toml", "README.md", "Snakefile"):
        shutil.copy(REPO / name, into / name)
    for name in ("src", "rules", "scripts", "profiles"):
        shutil.copytree(REPO / name, into / name, symlinks=True, ignore=ignore)
    return into


def _venv_with(wheel: Path, folder: Path) -> Path:
    """A fresh venv holding the wheel alone; its dependencies come from the test interpreter's site-packages
    (a .pth line: that folder's own .pth files, the editable checkout's among them, are not read)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                          capture_output=True, text=True).stdout.strip()
    Path(site, "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    str(wheel)], check=True)
    return folder / "bin"


@pytest.mark.e2e
def test_the_wheel_runs_the_workflow_in_a_folder_outside_the_checkout(tmp_path):
    started = time.time()
    sources = _wheel_sources(tmp_path / "sources")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path / "dist"),
                    str(sources)], check=True)
    (wheel,) = (tmp_path / "dist").glob("accubisect-*.whl")
    bin_dir = _venv_with(wheel, tmp_path / "venv")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EXAMPLE_MODEL, project / "transformer.onnx")
    shutil.copytree(EXAMPLE_SAMPLES, project / "inputs")
    accubisect = str(bin_dir / "accubisect")
    subprocess.run([accubisect, "init"], cwd=project, check=True, capture_output=True)
    run = subprocess.run([accubisect, "run", "compare", "--model", "transformer.onnx", "--samples", "inputs",
                          "--cores", "2"], cwd=project, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    packaged = next((tmp_path / "venv").glob("lib/python*/site-packages/accubisect/data/workflow"))
    assert not any((packaged / name).is_symlink() for name in LINKED)  # the files themselves
    assert (f"Using profiles {packaged}/profiles/local and workflow specific profile {packaged}/profiles/default"
            in run.stderr), run.stderr  # every core, and rerun-incomplete, from the installed package
    assert "results/compare/summary.txt:\nmodel transformer.onnx; 4 sample(s) from inputs" in run.stdout, run.stdout
    assert (project / "results" / "compare" / "report.json").is_file()
    assert not [path for name in ("workspace", "results") for path in (REPO / name).rglob("*")
                if path.stat().st_mtime > started]
