"""The workflow on a real single-node SLURM cluster, brought up on this machine and torn down after.

Needs root and apt (Debian's slurm-wlm and munge); skipped with the reason elsewhere. Every step has a
hard timeout so that a stuck cluster fails the test instead of hanging CI.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLE, copy_workflow, snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]  # runs the real snakemake command, minutes
CONF = Path("/etc/slurm/slurm.conf")
SLURM_OPTIONS = ["--profile", "profiles/slurm", "--jobs", "4", "--default-resources", "slurm_partition=debug",
                 "--slurm-no-account", "--slurm-status-command", "squeue",
                 "--slurm-init-seconds-before-status-checks", "2"]


def run(*command, timeout=60, check=True):
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=check)


def install_slurm():
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("a SLURM cluster needs root and apt-get to install Debian's slurm-wlm and munge")
    if shutil.which("slurmctld") and shutil.which("munged"):
        return
    try:
        run("apt-get", "update", "-qq", timeout=300)
        run("apt-get", "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm", "munge", timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"cannot install slurm-wlm and munge: {error}")


def slurm_conf(state: Path) -> str:
    return "\n".join([
        "ClusterName=accubisect", "SlurmctldHost=localhost", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "MpiDefault=none", "ReturnToService=2",
        f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=8000 State=UNKNOWN",
        "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory", "MinJobAge=600",  # squeue keeps finished jobs for the executor
        f"StateSaveLocation={state}/state", f"SlurmdSpoolDir={state}/spool",
        f"SlurmctldPidFile={state}/slurmctld.pid", f"SlurmdPidFile={state}/slurmd.pid",
        f"SlurmctldLogFile={state}/slurmctld.log", f"SlurmdLogFile={state}/slurmd.log", ""])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    install_slurm()
    state = tmp_path_factory.mktemp("slurm")
    (state / "state").mkdir()
    (state / "spool").mkdir()
    backup = CONF.read_text() if CONF.exists() else None
    CONF.parent.mkdir(parents=True, exist_ok=True)
    CONF.write_text(slurm_conf(state))
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    started_munge = run("munge", "-n", check=False).returncode != 0
    if started_munge:
        run("runuser", "-u", "munge", "--", "munged")
    try:
        run("slurmctld", "-i")
        run("slurmd", "-N", "localhost")
        deadline = time.monotonic() + 60
        while "idle" not in run("sinfo", "-h", "-o", "%T", check=False).stdout:
            if time.monotonic() > deadline:
                pytest.fail(f"SLURM did not come up:\n{(state / 'slurmctld.log').read_text()[-2000:]}")
            time.sleep(1)
        yield state
    finally:
        run("scontrol", "shutdown", check=False)
        run("pkill", "-f", "slurmd -N localhost", check=False)
        CONF.unlink()
        if backup is not None:
            CONF.write_text(backup)
        if started_munge:
            run("pkill", "-x", "munged", check=False)


def on_slurm(folder, target):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    command = ["timeout", "-k", "30", "540", sys.executable, "-m", "snakemake", target, *EXAMPLE, *SLURM_OPTIONS]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_compare_and_fusion_bisect_run_as_slurm_jobs(cluster, tmp_path):
    local = copy_workflow(tmp_path / "local")
    snakemake(local, "fusion_bisect", *EXAMPLE)
    remote = copy_workflow(tmp_path / "slurm")
    log = on_slurm(remote, "compare") + on_slurm(remote, "fusion_bisect")
    submitted = [line for line in log.splitlines() if "has been submitted with SLURM jobid" in line]
    assert any("rule_compile_variant" in line for line in submitted)
    assert any("rule_fusion_search" in line for line in submitted), log[-3000:]
    for path in ("compare/report.json", "fusion_bisect/fusion_switch.cfg"):
        assert (remote / "results" / path).read_bytes() == (local / "results" / path).read_bytes(), path
    here, there = (json.loads((f / "results/fusion_bisect/result.json").read_text()) for f in (local, remote))
    assert there["culprits"] == here["culprits"] == ["GeluApproximation"]
    assert [p["off"] for p in there["probes"]] == [p["off"] for p in here["probes"]]
