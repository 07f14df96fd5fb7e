"""Workspace keys: what makes two stage folders differ, what lets them be shared, and pruning safely."""

import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    EXAMPLE,
    EXAMPLE_MODEL,
    EXAMPLE_SAMPLES,
    copy_workflow,
    jobs_run,
    snakemake,
)

from accubisect.core.errors import DumpError, PruneError
from accubisect.formats.bisect_result import ResultVerdict
from accubisect.formats.compile_record import Variant
from accubisect.formats.config import validate_config
from accubisect.formats.deployed import DeployedRecord
from accubisect.formats.finalize_record import FinalizeRecord
from accubisect.formats.instances import InstancesRecord
from accubisect.formats.paths import STAGES, stage_dir
from accubisect.formats.reduce_record import ReduceProbe, ReduceRecord, ReproRun
from accubisect.formats.samples import Sample
from accubisect.runtime.host import cpu_signature
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.dump import check_same_cpu
from accubisect.workflow.cli import main
from accubisect.workflow.plan import Inputs, Plan, compile_key
from accubisect.workflow.workspace import MARKERS, check_unlocked, needed_keys, removals, remove

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
    compile_variant(CompileStep(ffn_model, Variant("fusion_on", "all").to_json(), "ort-cpu", tmp_path / "model.onnx",
                                record))
    assert json.loads(record.read_text())["cpu"] == cpu_signature()
    check_same_cpu(record)
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "cpu": "x86_64:sse4_1"}))
    with pytest.raises(DumpError, match="compiled on a CPU with x86_64:sse4_1"):
        check_same_cpu(record)
    record.write_text(json.dumps({**data, "cpu": "x86_64:sse4_1", "variant": {**data["variant"], "level": "basic"}}))
    check_same_cpu(record)


def make_folder(path, age_days=0.0):
    """A stage folder as the workflow makes it: its stage's marker (its first job's log, or a verdict)."""
    path.mkdir(parents=True)
    marker = path / MARKERS[path.parent.name]
    marker.write_bytes(b"x" * 1000)
    stamp = time.time() - age_days * 86400
    os.utime(marker, (stamp, stamp))
    return path


def stray(path, age_seconds=7200):
    path.write_bytes(b"torn")
    os.utime(path, (time.time() - age_seconds, time.time() - age_seconds))
    return path


def test_prune_by_age_and_by_need(tmp_path):
    old = make_folder(tmp_path / "compile" / "aaaaaaaaaaaaaaaa", age_days=10)
    new = make_folder(tmp_path / "dump" / "bbbbbbbbbbbbbbbb")
    part = stray(tmp_path / "dump" / "bbbbbbbbbbbbbbbb" / ".dump.h5.x.part")
    listed = removals(tmp_path, older_than_days=1, keep=None)
    assert {r.path for r in listed} == {old, part} and old.exists() and part.exists()
    assert [r.path for r in removals(tmp_path, older_than_days=None, keep={old.name})] == [new]  # holds the .part
    assert removals(tmp_path, older_than_days=1, keep={old.name}) == [r for r in listed if r.path == part]
    remove(listed)
    assert not old.exists() and not part.exists() and new.exists()


def test_an_old_part_inside_a_removed_folder_is_counted_and_removed_once(tmp_path):
    folder = make_folder(tmp_path / "compare" / "cccccccccccccccc", age_days=10)
    stray(folder / ".report.json.x.part", age_seconds=10 * 86400)
    found = removals(tmp_path, older_than_days=1, keep=None)
    assert [(r.path, r.bytes) for r in found] == [(folder, 1000 + 4)]
    remove(found)
    assert not folder.exists()


def test_a_killed_model_write_s_part_folder_is_counted_with_its_data_and_removed(tmp_path):
    """files.atomic_model stages a model and its external data in a `.part` folder: a killed compile of a
    large model leaves its data there, which prune counts and removes."""
    folder = make_folder(tmp_path / "compile" / ("d" * 16))
    part = folder / ".model.onnx.x.part"
    part.mkdir()
    (part / "model.onnx").write_bytes(b"m" * 10)
    (part / "model.onnx.data").write_bytes(b"w" * 5000)
    old = time.time() - 7200
    os.utime(part, (old, old))
    found = removals(tmp_path, older_than_days=1, keep=None)
    assert [(r.path, r.bytes) for r in found] == [(part, 5010)]
    remove(found)
    assert not part.exists() and (folder / MARKERS["compile"]).is_file()


def test_prune_removes_only_folders_the_workflow_made(tmp_path):
    """`--workspace examples` holds examples/precision/samples, and a results folder reduce/inputs: folders
    under a stage's name that no stage made, named like a key or not, and their old `.part` files, stay."""
    made = make_folder(tmp_path / "precision" / ("e" * 16), age_days=10)
    user = {"precision/samples": "assignment.log", "reduce/inputs": "reduce.log", f"dump/{'0' * 16}": "compile.log"}
    for name, marker in user.items():  # a stage's marker under another name, another stage's under a key's
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / marker).write_text("a file of the user's")
        stray(tmp_path / name / ".sample0_inputs.npz.x.part", age_seconds=10 * 86400)
    stray(tmp_path / "precision" / ".notes.txt.x.part")
    stray(tmp_path / ".notes.txt.x.part")
    assert [r.path for r in removals(tmp_path, older_than_days=1, keep=None)] == [made]
    assert [r.path for r in removals(tmp_path, older_than_days=None, keep=set())] == [made]
    digests = stray(tmp_path / "..digests.json.x.part")  # a killed rewrite of .digests.json (files.atomic_path)
    assert [r.path for r in removals(tmp_path, older_than_days=1, keep=None)] == [made, digests]


def test_every_stage_has_a_marker():
    assert MARKERS.keys() == set(STAGES)


@pytest.mark.parametrize("days", [-1.0, math.nan, math.inf])
def test_an_age_that_is_no_number_of_days_is_refused(tmp_path, days):
    make_folder(tmp_path / "compile" / "aaaaaaaaaaaaaaaa", age_days=10)
    with pytest.raises(PruneError, match="an age is a number of days >= 0"):
        removals(tmp_path, older_than_days=days, keep=None)


def snakemake_lock(workdir, kind, paths, number=0):
    """A lock file as Snakemake 9 writes it (persistence/file.py `_write_locks`): one path a line."""
    locks = workdir / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{number}.{kind}.lock", "w") as lock:
        print(*paths, sep="\n", file=lock)


@pytest.mark.parametrize(("kind", "listed"), [
    ("output", "workspace/compare/cccccccccccccccc/report.json"), ("input", "workspace/dump/bbbbbbbbbbbbbbbb/dump.h5"),
    ("output", "{absolute}/workspace/probe/dddddddddddddddd/verdict.json"),
])
def test_a_workspace_a_running_workflow_holds_is_not_pruned(tmp_path, monkeypatch, capsys, kind, listed):
    workspace = tmp_path / "workspace"
    old = make_folder(workspace / "compile" / "aaaaaaaaaaaaaaaa", age_days=10)
    snakemake_lock(tmp_path, "input", ["examples/transformer.onnx"], number=1)  # outside: no matter
    snakemake_lock(tmp_path, kind, ["results/report.txt", listed.format(absolute=tmp_path)])
    monkeypatch.chdir(tmp_path)
    assert main(["workspace", "prune", "--older-than", "1", "--delete"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accubisect: workspace: a workflow running in") and err.count("\n") == 1
    assert "run `snakemake --unlock`" in err and old.exists()
    assert main(["workspace", "prune", "--older-than", "1"]) == 0  # listing is harmless
    assert f"would remove {Path('workspace/compile/aaaaaaaaaaaaaaaa')}" in capsys.readouterr().out


def test_locks_on_other_paths_do_not_hold_the_workspace(tmp_path):
    (tmp_path / "workspace").mkdir()
    snakemake_lock(tmp_path, "output", ["workspace_old/compile/x/model.onnx", "results/compare/report.json"])
    check_unlocked(tmp_path / "workspace", tmp_path)


@pytest.mark.e2e
def test_a_real_running_snakemake_holds_the_workspace(tmp_path):
    """A real snakemake run that waits for a file before finishing: prune --delete is refused while it
    runs, and goes ahead after it ended."""
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    output: "workspace/compare/cccccccccccccccc/report.json"\n'
        '    shell: "while [ ! -e go ]; do sleep 0.1; done; touch {output}"\n')
    old = make_folder(tmp_path / "workspace" / "compile" / "aaaaaaaaaaaaaaaa", age_days=10)
    run = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    locks = tmp_path / ".snakemake" / "locks"
    deadline = time.time() + 120
    while not (locks.is_dir() and list(locks.glob("*.output.lock"))) and time.time() < deadline:
        time.sleep(0.2)
    prune = [sys.executable, "-m", "accubisect.workflow.cli", "workspace", "prune", "--older-than", "1", "--delete"]
    refused = subprocess.run(prune, cwd=tmp_path, capture_output=True, text=True)
    (tmp_path / "go").touch()
    assert run.wait(timeout=120) == 0, run.stdout.read()
    assert refused.returncode == 2 and "a workflow running in" in refused.stderr and old.exists()
    done = subprocess.run(prune, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and not old.exists(), done.stderr


def test_prune_lists_each_path_and_the_total_and_deletes_only_when_asked(tmp_path, monkeypatch, capsys):
    old = make_folder(tmp_path / "workspace" / "compile" / "aaaaaaaaaaaaaaaa", age_days=10)
    monkeypatch.chdir(tmp_path)
    assert main(["workspace", "prune", "--older-than", "1"]) == 0
    out = capsys.readouterr().out
    assert f"would remove {Path('workspace/compile/aaaaaaaaaaaaaaaa')} (1000 B, not touched)" in out
    assert "1 item(s), 1000 B would be freed; nothing was removed (add --delete" in out and old.exists()
    assert main(["workspace", "prune", "--older-than", "1", "--delete"]) == 0
    out = capsys.readouterr().out
    assert out.index(f"removing workspace/compile/{old.name}") < out.index("1 item(s), 1000 B freed")
    assert not old.exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--workspace", "afile", "--older-than", "1"], "afile: is not a folder; give --workspace"),
    (["--workspace", "absent", "--older-than", "1"], "absent: does not exist; give --workspace"),
    (["--older-than", "-1"], "argument --older-than: '-1' is not a number >= 0"),
    (["--older-than", "nan"], "argument --older-than: 'nan' is not a number >= 0"),
    (["--dry-run", "--older-than", "1"], "unrecognized arguments: --dry-run"),
    ([], "workspace prune: give --older-than DAYS, --keep-config CONFIG, or both"),
    (["--keep-config", "absent.yaml"], "--keep-config absent.yaml: not a readable YAML file"),
    (["--keep-config", "broken.yaml"], "--keep-config broken.yaml: not a readable YAML file"),
    (["--keep-config", "binary.yaml"], "--keep-config binary.yaml: not a readable YAML file"),
    (["--keep-config", "list.yaml"], "--keep-config list.yaml: holds list, not a mapping of config keys"),
    (["--keep-config", "typo.yaml"], "--keep-config typo.yaml: accuracy: Additional properties are not allowed"),
    (["--keep-config", "nomodel.yaml"], "--keep-config nomodel.yaml: absent.onnx: model file not found"),
    (["--keep-config", "yte.yaml"], "--keep-config yte.yaml: a YTE template (__use_yte__)"),
    (["--keep-config", "same.yaml"], "--keep-config same.yaml: workspace: out and results: out are the same folder"),
    (["--keep-config", "nested.yaml"], "--keep-config nested.yaml: workspace: out/ws and results: out are nested"),
])
def test_bad_prune_input_is_one_line(tmp_path, monkeypatch, capsys, argv, message):
    (tmp_path / "workspace").mkdir()
    (tmp_path / "afile").write_text("x")
    (tmp_path / "broken.yaml").write_text("model: [unclosed\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "list.yaml").write_text("- model\n")
    (tmp_path / "typo.yaml").write_text(f"model: {EXAMPLE_MODEL}\nsamples: {EXAMPLE_SAMPLES}\naccuracy: {{rtl: 1}}\n")
    (tmp_path / "nomodel.yaml").write_text(f"model: absent.onnx\nsamples: {EXAMPLE_SAMPLES}\n")
    (tmp_path / "yte.yaml").write_text("__use_yte__: true\nmodel: ?str(open('ran', 'w'))\n")
    (tmp_path / "out" / "ws").mkdir(parents=True)
    for name, workspace in (("same", "out"), ("nested", "out/ws")):
        (tmp_path / f"{name}.yaml").write_text(f"model: {EXAMPLE_MODEL}\nsamples: {EXAMPLE_SAMPLES}\n"
                                               f"workspace: {workspace}\nresults: out\n")
    monkeypatch.chdir(tmp_path)
    assert main(["workspace", "prune", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"accubisect: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "ran").exists()


def example_plan(tmp_path):
    sample = Sample(0, tmp_path / "sample0_inputs.npz", None)
    inputs = Inputs(tmp_path / "model.onnx", "m" * 64, 1, ("y",), (sample,), ("i" * 64,), (None,), 1, frozenset(),
                    None, None, "1.0", "x86_64")
    return Plan.build(validate_config({"model": "model.onnx", "samples": ".", "workspace": str(tmp_path)}), inputs)


def test_pruning_keeps_every_folder_the_plan_names_in_every_stage(tmp_path):
    """The plan and pruning share one path scheme (formats/paths.py): each folder a plan names is kept, and a
    folder of another key is found in every stage there is."""
    plan = example_plan(tmp_path)
    kept = [make_folder(stage_dir(tmp_path, name.split()[0], key)) for name, key in plan.keys().items()]
    other = {make_folder(stage_dir(tmp_path, stage, "f" * 16)) for stage in STAGES}
    assert {removal.path for removal in removals(tmp_path, None, needed_keys(plan))} == other
    assert all(folder.exists() for folder in kept)


def test_pruning_keeps_the_verdicts_the_last_instance_search_and_reduce_used(tmp_path):
    """instances.json lists its search's probes and reduce.json its steps, each naming a verdict: those
    verdict folders are needed; other verdicts of those stores are not."""
    plan = example_plan(tmp_path)
    kept = [make_folder(stage_dir(tmp_path, name.split()[0], key)) for name, key in plan.keys().items()]
    instance_store, reduce_store = plan.instance_store(), plan.reduce_store()
    probes = [{"round": 1, "off": off, "passed": passed} for off, passed in ((["a", "b"], True), (["b"], False))]
    InstancesRecord(("Gelu",), (), {"status": "found", "culprits": ["b"], "minimal": True, "stopped_by": None,
                                    "search": "", "ranking": [], "probes": probes},
                    {"reverted": ["b"], "passed": True, "samples_passed": [True], "worst": {}},
                    ).write(plan.bisect_dir("fusion") / "instances.json")
    steps = [ReduceProbe(phase, reduce_store.key_of(frozenset({cut})), 3, ("y",), passed, {}, 0.1, False)
             for phase, cut, passed in (("outputs", "3 node(s) #1", False), ("inputs", "2 node(s) #2", True))]
    ReduceRecord("fusion", "model.onnx", 3, ("a", "b", "c"), ("y",), ("x",), (), (), ("x",), None, tuple(steps),
                 ReproRun("python repro.py", 1, ""), ReproRun("python repro.py --fusion-switch s.cfg", 0, ""), 1.0,
                 ).write(plan.reduce_dir() / "reduce.json")
    verdicts = [make_folder(stage_dir(tmp_path, "instance_probe", instance_store.key_of(frozenset(p["off"]))))
                for p in probes]
    verdicts += [make_folder(stage_dir(tmp_path, "reduce_probe", step.key)) for step in steps]
    other = {make_folder(stage_dir(tmp_path, stage, instance_store.key_of(frozenset({"c"}))))
             for stage in ("instance_probe", "reduce_probe")}
    assert len(set(verdicts)) == 4
    assert {removal.path for removal in removals(tmp_path, None, needed_keys(plan))} == other
    assert all(folder.exists() for folder in (*kept, *verdicts))


def test_pruning_keeps_the_verdicts_the_last_deploy_pass_used(tmp_path):
    """deployed.json lists the probes of precision_bisect's pass in the user's model, kept beside the search's
    verdicts under their own keys: those are needed, another verdict of that store is not."""
    plan = example_plan(tmp_path)
    store = plan.verdict_store("deployable")
    probes = [{"round": index, "off": off, "passed": passed} for index, (off, passed) in enumerate(((["a"], True),
                                                                                                   ([], False)))]
    verdict = ResultVerdict(True, {}, ("a",), (True,))
    model = FinalizeRecord("model.onnx", "fp16", "compiled", 1, 2, "onnx.checker only", None, None)
    DeployedRecord(("a", "b"), ("a",), verdict, "verified", ("a",), verdict, tuple(probes), True, None, (), model
                   ).write(plan.bisect_dir("precision") / "deployed.json")
    verdicts = [make_folder(stage_dir(tmp_path, "precision_probe", store.key_of(frozenset(p["off"])))) for p in probes]
    other = make_folder(stage_dir(tmp_path, "precision_probe", store.key_of(frozenset({"b"}))))
    assert store.key_of(frozenset()) != plan.verdict_store("precision").key_of(frozenset())
    removed = {removal.path for removal in removals(tmp_path, None, needed_keys(plan))}
    assert other in removed and not set(verdicts) & removed


def test_a_stage_the_scheme_does_not_know_is_refused():
    with pytest.raises(ValueError, match="'dumps' is no workspace stage; the stages are compile, graph"):
        stage_dir("workspace", "dumps", "f" * 16)


def test_keep_config_plans_from_the_validated_config_with_defaults(tmp_path, monkeypatch, capsys):
    """A config naming only model and samples gets the schema's defaults, as the workflow's does, and
    relative paths resolve against the current directory."""
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLE_MODEL, tmp_path / "examples" / "model.onnx")
    shutil.copytree(EXAMPLE_SAMPLES, tmp_path / "examples" / "samples")
    (tmp_path / "my.yaml").write_text("model: examples/model.onnx\nsamples: examples/samples\n")
    monkeypatch.chdir(tmp_path)
    plan = Plan.from_config(validate_config({"model": "examples/model.onnx", "samples": "examples/samples"}))
    needed = make_folder(tmp_path / "workspace" / "compile" / plan.compile_keys["fusion_on"])
    unneeded = make_folder(tmp_path / "workspace" / "compile" / "ffffffffffffffff")
    assert main(["workspace", "prune", "--keep-config", "my.yaml", "--delete"]) == 0
    assert needed.exists() and not unneeded.exists(), capsys.readouterr()


@pytest.mark.e2e
def test_prune_keeps_what_the_config_needs(tmp_path):
    folder = copy_workflow(tmp_path)
    snakemake(folder, "fusion_bisect", *EXAMPLE)
    snakemake(folder, "compare", *EXAMPLE, "--config", "accuracy={rtol: 0.01}")  # a second configuration's folders
    run = subprocess.run([sys.executable, "-m", "accubisect.workflow.cli", "workspace", "prune", "--keep-config",
                          "examples/config.yaml", "--delete"], cwd=folder, capture_output=True, text=True)
    assert run.returncode == 0 and "removing workspace/compare/" in run.stdout
    rerun = jobs_run(snakemake(folder, "fusion_bisect", *EXAMPLE))  # republishes the first configuration's report
    assert not set(rerun) & {"compile_variant", "map_graph", "dump_sample", "compare_dumps", "fusion_search"}, rerun


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
    assert [run.returncode for run in runs] == [0, 0], "\n\n".join(outputs)  # each run's whole console
    results = [(folder / "results" / "fusion_bisect" / "fusion_switch.cfg").read_text() for folder in folders]
    assert results[0] == results[1] and "GeluApproximation" in results[0]
    assert not list(shared.rglob("*.part"))
    stage_files = [p for p in shared.rglob("*.json") if p.name != ".digests.json"]
    assert stage_files and not any(str(tmp_path) in p.read_text() for p in stage_files)  # no absolute paths
