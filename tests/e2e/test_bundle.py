"""Bundles: built from real dumps and reproduced in a fresh folder, bit for bit; a bundle is data, so a
broken or hostile one fails in one line and its val_func runs only with --trust-bundle-code."""

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import pytest
from conftest import (
    EXAMPLE,
    EXAMPLE_MODEL,
    EXAMPLE_SAMPLES,
    GELU_APPROXIMATION,
    copy_workflow,
    snakemake,
)

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import BundleError
from accubisect.formats.config import validate_config
from accubisect.formats.dump_file import DumpReader
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.local_errors import LocalErrors
from accubisect.formats.val_func import load_val_func
from accubisect.stages.bundle import BundleStep, make_bundle
from accubisect.stages.bundle import reproduce as reproduce_bundle
from accubisect.stages.compare import Compared, build_report, graph_from_dump, with_local_errors
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.dump import DumpStep, dump_sample
from accubisect.workflow.cli import main

VAL_FUNC = "judge_by_marker"  # the module name of the val_func the tests bundle


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """Real dumps of the example's sample0, its fp32 graph against its approximate-Gelu graph."""
    folder = tmp_path_factory.mktemp("parts")
    dumps = {}
    for variant, level, session_config in (("fusion_off", "off", {}), ("fusion_on", "all", GELU_APPROXIMATION)):
        spec = {"name": variant, "level": level, "session_config": session_config, "rules_off": []}
        base = folder / variant
        compile_variant(CompileStep(EXAMPLE_MODEL, spec, "ort-cpu", base / "model.onnx", base / "compile.json"))
        dump_sample(DumpStep(EXAMPLE_MODEL, base / "model.onnx", EXAMPLE_SAMPLES / "sample0_inputs.npz",
                             base / "dump.h5", variant, "sample0", "ort-cpu"))
        dumps[variant] = base / "dump.h5"
    with DumpReader(dumps["fusion_on"]) as dump:
        graph_from_dump(dump).write(folder / "graph.json")
        outputs = dump.output_names()
    LocalErrors({}, ()).write(folder / "local.json")
    return {"folder": folder, "dumps": dumps, "outputs": outputs}


def write_val_func(folder: Path, marker: Path, passes: bool = True) -> None:
    """A val_func module that leaves `marker` behind if anything imports it."""
    (folder / f"{VAL_FUNC}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n\n\n"
        f"def judge(reference, candidate):\n    return {passes}\n")


def make(parts, folder: Path, monkeypatch, val_func: str | None = None) -> Path:
    """A bundle made by make_bundle from the report build_report writes, as the bundle stage does."""
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    config = validate_config({"model": str(EXAMPLE_MODEL), "samples": str(EXAMPLE_SAMPLES),
                              "accuracy": {"val_func": val_func}})
    ref, cand = parts["dumps"]["fusion_off"], parts["dumps"]["fusion_on"]
    golden = (str(EXAMPLE_SAMPLES / "sample0_outputs.npz"),)
    comparison = Compared((ref,), (cand,), golden, ("sample0",), tuple(parts["outputs"]), config["accuracy"], "fp16",
                          ("fusion_off", "fusion_on"))
    loaded = load_val_func(AccuracyCheck.from_config(config["accuracy"]))
    report = build_report(comparison, GraphRecord.read(parts["folder"] / "graph.json"), loaded)
    with_local_errors(report, LocalErrors({}, ())).write(folder / "report.json")
    make_bundle(BundleStep((ref,), (cand,), parts["folder"] / "graph.json", parts["folder"] / "graph.json",
                           parts["folder"] / "local.json", folder / "report.json", golden, ("sample0",),
                           tuple(parts["outputs"]), config, "0" * 64, (), folder / "bundle.tar.gz"))
    sys.modules.pop(VAL_FUNC, None)  # building ran it; reproducing must find it in the bundle
    return folder / "bundle.tar.gz"


def members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}


def repack(files: dict[str, bytes], path: Path, extra: tuple[tarfile.TarInfo, ...] = ()) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for info in extra:
            archive.addfile(info)
    return path


def one_line_error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("accubisect: ") and err.count("\n") == 1, err
    return err


def test_a_bundle_reproduces_bit_for_bit(parts, tmp_path, monkeypatch, capsys):
    bundle = make(parts, tmp_path, monkeypatch)
    assert reproduce_bundle(bundle).matches
    assert main(["reproduce", str(bundle)]) == 0 and "reproduced bit for bit" in capsys.readouterr().out


def test_a_bundled_val_func_runs_only_with_the_trust_flag(parts, tmp_path, monkeypatch, capsys):
    marker = tmp_path / "val_func_ran"
    write_val_func(tmp_path, marker)
    bundle = make(parts, tmp_path, monkeypatch, f"{VAL_FUNC}:judge")
    marker.unlink()
    (tmp_path / f"{VAL_FUNC}.py").unlink()
    err = one_line_error(["reproduce", str(bundle)], capsys)
    assert "judged by val_func 'judge_by_marker:judge'" in err and "--trust-bundle-code" in err
    assert not marker.exists()
    path_before = list(sys.path)
    assert main(["reproduce", str(bundle), "--trust-bundle-code"]) == 0, capsys.readouterr()
    assert marker.exists() and "reproduced bit for bit" in capsys.readouterr().out
    assert VAL_FUNC not in sys.modules and sys.path == path_before


def test_the_trusted_val_func_is_the_bundles_not_one_beside_the_user(parts, tmp_path, monkeypatch):
    bundled_marker, local_marker = tmp_path / "bundled_ran", tmp_path / "local_ran"
    write_val_func(tmp_path, bundled_marker, passes=True)
    bundle = make(parts, tmp_path, monkeypatch, f"{VAL_FUNC}:judge")
    write_val_func(tmp_path, local_marker, passes=False)  # same name, in the working directory
    outcome = reproduce_bundle(bundle, trust_code=True)
    assert outcome.matches and not local_marker.exists()


def test_the_sample_name_cannot_leave_the_bundle(parts, tmp_path, monkeypatch, capsys):
    files = members(make(parts, tmp_path, monkeypatch))
    manifest = json.loads(files["manifest.json"])
    files["manifest.json"] = json.dumps({**manifest, "samples": ["../../../x"]}).encode()
    err = one_line_error(["reproduce", str(repack(files, tmp_path / "evil.tar.gz"))], capsys)
    assert "evil.tar.gz: manifest.json.samples.0:" in err and "does not match" in err


def _without(name):
    return lambda files: {k: v for k, v in files.items() if k != name}


def _replaced(name, data):
    return lambda files: {**files, name: data}


def _manifest(**changes):
    def change(files):
        manifest = {**json.loads(files["manifest.json"]), **changes}
        return {**files, "manifest.json": json.dumps({k: v for k, v in manifest.items() if v is not None}).encode()}
    return change


def _changed(name, **changes):
    return lambda files: {**files, name: json.dumps({**json.loads(files[name]), **changes}).encode()}


def _config(**accuracy):
    def change(files):
        manifest = json.loads(files["manifest.json"])
        manifest["config"]["accuracy"].update(accuracy)
        return {**files, "manifest.json": json.dumps(manifest).encode()}
    return change


@pytest.mark.parametrize(("damage", "message"), [
    (_replaced("manifest.json", b"{not json"), "manifest.json is not JSON"),
    (_without("manifest.json"), "member manifest.json is missing"),
    (_manifest(samples=None), "manifest.json: 'samples' is a required property"),
    (_manifest(format=2), "manifest.json.format: 3 was expected"),
    (_manifest(model_data_sha256=None), "manifest.json: 'model_data_sha256' is a required property"),
    (_manifest(model_data_sha256=["abc"]), "manifest.json.model_data_sha256.0: 'abc' does not match"),
    (_manifest(model_sha256="abc"), "manifest.json.model_sha256: 'abc' does not match"),
    (_manifest(golden=[True, False]), "manifest.json.golden has 2 entries for 1 samples"),
    (_manifest(config={"model": "m.onnx"}), "manifest.json config: 'samples' is a required property"),
    (_config(rtol="tight"), "manifest.json config: accuracy.rtol: 'tight' is not of type 'number'"),
    (_config(rtl=1), "manifest.json config: accuracy: Additional properties are not allowed"),
    (_without("dumps/reference/sample0.h5"), "member dumps/reference/sample0.h5 is missing"),
    (_without("golden/sample0_outputs.npz"), "member golden/sample0_outputs.npz is missing"),
    (_replaced("report.json", b"\x00garbage"), "report.json is not JSON"),
    (_replaced("report.json", b"[]"), "report.json: [] is not of type 'object'"),
    (_replaced("local.json", b"{}"), "local.json: 'format' is a required property"),
    (_replaced("local.json", b'{"format": 1, "skipped": []}'), "local.json: 'nodes' is a required property"),
    (_replaced("graphs/candidate.json", b"{}"), "graphs/candidate.json: 'format' is a required property"),
    (_changed("report.json", format=1), "report.json.format: 2 was expected"),
    (_changed("graphs/candidate.json", format=1), "graphs/candidate.json.format: 2 was expected"),
    (_replaced("dumps/candidate/sample0.h5", b"junk"), "dumps/candidate/sample0.h5: not a readable dump"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_a_broken_bundle_fails_in_one_line(parts, tmp_path, monkeypatch, capsys, damage, message):
    broken = repack(damage(members(make(parts, tmp_path, monkeypatch))), tmp_path / "broken.tar.gz")
    err = one_line_error(["reproduce", str(broken)], capsys)
    assert f"accubisect: {broken}: {message}" in err, err
    assert str(tmp_path / "tmp") not in err  # names the member, not where it was unpacked


def _link(kind, target):
    info = tarfile.TarInfo("val_func/link.py")
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(("name", "extra"), [
    ("../escape.json", ()),
    (None, (_link(tarfile.SYMTYPE, "/etc/passwd"),)), (None, (_link(tarfile.SYMTYPE, "../manifest.json"),)),
    (None, (_link(tarfile.LNKTYPE, "manifest.json"),)),
])
def test_traversal_and_link_members_are_refused_in_one_line(parts, tmp_path, monkeypatch, capsys, name, extra):
    files = members(make(parts, tmp_path, monkeypatch))
    if name:
        files[name] = b"{}"
    hostile = repack(files, tmp_path / "hostile.tar.gz", extra)
    err = one_line_error(["reproduce", str(hostile)], capsys)
    assert f"{hostile}: " in err and ("not a readable bundle" in err or "is a link or device" in err)
    with pytest.raises(BundleError):
        reproduce_bundle(hostile)
    assert not (tmp_path.parent / "escape.json").exists()


def reproduce(bundle, folder):
    return subprocess.run([sys.executable, "-m", "accubisect.workflow.cli", "reproduce", str(bundle)], cwd=folder,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = copy_workflow(tmp_path_factory.mktemp("made_here"))
    snakemake(folder, "bundle", *EXAMPLE)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    return Path(shutil.copy(folder / "results" / "bundle" / "compare_bundle.tar.gz", elsewhere))


@pytest.mark.e2e
def test_bundle_holds_what_the_comparison_needs(bundle):
    with tarfile.open(bundle) as archive:
        names = set(archive.getnames())
        manifest = json.load(archive.extractfile("manifest.json"))
    assert {"manifest.json", "report.json", "graphs/reference.json", "graphs/candidate.json"} <= names
    assert {f"dumps/{side}/sample{i}.h5" for side in ("reference", "candidate") for i in range(4)} <= names
    assert {f"golden/sample{i}_outputs.npz" for i in range(4)} <= names
    assert set(manifest["versions"]) == {"accubisect", "onnxruntime", "onnx", "numpy", "h5py"}
    assert len(manifest["model_sha256"]) == 64 and manifest["config"]["accuracy"]["rtol"] == 1e-3
    assert manifest["model_data_sha256"] == []  # the example is saved whole
    assert not any(member.startswith("/") or ".." in member for member in names)


@pytest.mark.e2e
def test_reproduce_in_a_fresh_folder_matches_bit_for_bit(bundle):
    run = reproduce(bundle, bundle.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "reproduced bit for bit" in run.stdout and "rule GeluApproximation" in run.stdout


@pytest.mark.e2e
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
