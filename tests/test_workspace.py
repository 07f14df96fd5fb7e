"""Workspace keys: what makes two stage folders differ, and what lets them be shared."""

import json
import os
import platform
import subprocess
import sys
import time

import pytest

from accubisect.compile_stage import Variant, compile_variant
from accubisect.dump import check_same_cpu
from accubisect.errors import DumpError
from accubisect.host import cpu_signature
from accubisect.plan import compile_key
from accubisect.workspace import prune
from conftest import EXAMPLE, copy_workflow, jobs_run, snakemake

BASE = {"model": "0" * 64, "backend": "ort-cpu", "onnxruntime": "1.31.1"}


def test_level_all_compile_key_follows_the_instruction_set():
    variant = Variant("fusion_on", "all")
    assert compile_key(variant, BASE, "x86_64:avx,avx2") != compile_key(variant, BASE, "x86_64:avx,avx2,avx512f")
    portable = Variant("fusion_on", "extended")
    assert compile_key(portable, BASE, "x86_64:avx,avx2") == compile_key(portable, BASE, "x86_64:avx,avx2,avx512f")


def test_cpu_signature_reads_the_dispatch_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu sse4_1 avx avx2 fma ht avx512f\n")
    assert cpu_signature.__wrapped__(cpuinfo).endswith(":avx,avx2,avx512f,fma,sse4_1")
    assert cpu_signature.__wrapped__(tmp_path / "absent") == platform.machine()  # no cpuinfo: the machine alone


def test_a_level_all_graph_is_not_dumped_on_another_cpu(ffn_model, tmp_path):
    record = tmp_path / "compile.json"
    compile_variant(ffn_model, Variant("fusion_on", "all").to_json(), "ort-cpu", tmp_path / "model.onnx", record)
    assert json.loads(record.read_text())["cpu"] == cpu_signature()
    check_same_cpu(record)
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "cpu": "x86_64:sse4_1"}))
    with pytest.raises(DumpError, match="compiled on a CPU with x86_64:sse4_1"):
        check_same_cpu(record)
    record.write_text(json.dumps({**data, "cpu": "x86_64:sse4_1", "variant": {**data["variant"], "level": "basic"}}))
    check_same_cpu(record)


def make_folder(path, age_days=0.0):
    path.mkdir(parents=True)
    (path / "file").write_bytes(b"x" * 1000)
    stamp = time.time() - age_days * 86400
    os.utime(path / "file", (stamp, stamp))
    return path


def test_prune_by_age_and_by_need_with_a_dry_run(tmp_path):
    old = make_folder(tmp_path / "compile" / "aaaa", age_days=10)
    new = make_folder(tmp_path / "dump" / "bbbb")
    stray = tmp_path / "dump" / "bbbb" / ".dump.h5.x.part"
    stray.write_bytes(b"torn")
    os.utime(stray, (time.time() - 7200, time.time() - 7200))
    listed = prune(tmp_path, older_than_days=1, keep=None, dry_run=True)
    assert {r.path for r in listed} == {old, stray} and old.exists() and stray.exists()
    assert prune(tmp_path, older_than_days=None, keep={"aaaa"}, dry_run=True)[0].path == new
    assert prune(tmp_path, older_than_days=1, keep={"aaaa"}, dry_run=True) == [
        r for r in listed if r.path == stray]  # old but needed: kept
    prune(tmp_path, older_than_days=1, keep=None, dry_run=False)
    assert not old.exists() and not stray.exists() and new.exists()


@pytest.mark.e2e
def test_prune_keeps_what_the_config_needs(tmp_path):
    folder = copy_workflow(tmp_path)
    snakemake(folder, "fusion_bisect", *EXAMPLE)
    snakemake(folder, "compare", *EXAMPLE, "--config", "accuracy={rtol: 0.01}")  # a second configuration's folders
    run = subprocess.run([sys.executable, "-m", "accubisect.cli", "workspace", "prune", "--keep-config",
                          "examples/config.yaml"], cwd=folder, capture_output=True, text=True)
    assert run.returncode == 0 and "removed workspace/compare/" in run.stdout
    rerun = jobs_run(snakemake(folder, "fusion_bisect", *EXAMPLE))  # republishes the first configuration's report
    assert not set(rerun) & {"compile_variant", "map_graph", "dump_sample", "compare_dumps", "fusion_probe"}, rerun


@pytest.mark.e2e
def test_two_runs_on_one_shared_workspace_at_once(tmp_path):
    """Two users' workflows, started together on one workspace, both finish with the same answer."""
    shared = tmp_path / "shared_workspace"
    folders = [copy_workflow(tmp_path / name) for name in ("alice", "bob")]
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    runs = [subprocess.Popen([sys.executable, "-m", "snakemake", "fusion_bisect", *EXAMPLE, "--cores", "1", "--config",
                              f"workspace={shared}"], cwd=folder, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for folder in folders]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    results = [(folder / "results" / "fusion_bisect" / "fusion_switch.cfg").read_text() for folder in folders]
    assert results[0] == results[1] and "GeluApproximation" in results[0]
    assert not list(shared.rglob("*.part"))
    stage_files = [p for p in shared.rglob("*.json") if p.name != ".digests.json"]
    assert stage_files and not any(str(tmp_path) in p.read_text() for p in stage_files)  # no absolute paths
