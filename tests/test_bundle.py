"""`snakemake bundle` on one machine, `accubisect reproduce` in a fresh folder, bit for bit."""

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import pytest
from conftest import EXAMPLE, copy_workflow, snakemake

pytestmark = pytest.mark.e2e


def reproduce(bundle, folder):
    return subprocess.run([sys.executable, "-m", "accubisect.cli", "reproduce", str(bundle)], cwd=folder,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("made_here"))
    snakemake(folder, "bundle", *EXAMPLE)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    return Path(shutil.copy(folder / "results" / "bundle" / "compare_bundle.tar.gz", elsewhere))


def test_bundle_holds_what_the_comparison_needs(bundle):
    with tarfile.open(bundle) as archive:
        names = set(archive.getnames())
        manifest = json.load(archive.extractfile("manifest.json"))
    assert {"manifest.json", "report.json", "graphs/reference.json", "graphs/candidate.json"} <= names
    assert {f"dumps/{side}/sample{i}.h5" for side in ("reference", "candidate") for i in range(4)} <= names
    assert {f"golden/sample{i}_outputs.npz" for i in range(4)} <= names
    assert set(manifest["versions"]) == {"accubisect", "onnxruntime", "onnx", "numpy", "h5py"}
    assert len(manifest["model_sha256"]) == 64 and manifest["config"]["accuracy"]["rtol"] == 1e-3
    assert not any(member.startswith("/") or ".." in member for member in names)


def test_reproduce_in_a_fresh_folder_matches_bit_for_bit(bundle):
    run = reproduce(bundle, bundle.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "reproduced bit for bit" in run.stdout and "rule GeluApproximation" in run.stdout


def test_a_changed_dump_is_not_reproduced(bundle, tmp_path):
    with tarfile.open(bundle) as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive.getmembers()}
    dump = tmp_path / "dump.h5"
    dump.write_bytes(members["dumps/candidate/sample2.h5"])
    with h5py.File(dump, "r+") as h5:
        h5["tensors/gelu%2Fhalf"][0, 0, 0] += 1.0
    members["dumps/candidate/sample2.h5"] = dump.read_bytes()
    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(tampered, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    run = reproduce(tampered, tmp_path)
    assert run.returncode == 1 and "NOT reproduced: report." in run.stdout and "cosine: bundled" in run.stdout


def test_a_file_that_is_no_bundle_fails_in_one_line(tmp_path):
    (tmp_path / "junk.tar.gz").write_bytes(b"junk")
    run = reproduce(tmp_path / "junk.tar.gz", tmp_path)
    assert run.returncode == 2 and "junk.tar.gz: not a readable bundle" in run.stderr
