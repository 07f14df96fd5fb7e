"""bench/openvino_cases.py (issue 24, f16 on another machine): its cases are checked before anything runs; on
the bundled precision example, packed as bench/device_pack.sh packs it, each dtype is either run through the
precision_bisect job and its published IR judged again, or one skipped row naming the plugin's capabilities;
bench/slim_wheel.py's wheel lacks the members it leaves out and pip installs it as the device machine will."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from accubisect.runtime.openvino_backend import CAPABILITY, cpu_capabilities

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "openvino_cases.py"


def bench(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *arguments], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_an_unknown_case_is_refused_in_one_line_naming_the_choices(tmp_path):
    result = bench("--cases", "precision:int8", "--out", str(tmp_path / "out.json"))
    assert result.returncode == 1 and "Traceback" not in result.stderr and result.stdout == ""
    assert result.stderr.strip() == ("accubisect: --cases: 'precision:int8' is not MODEL:DTYPE with MODEL one of "
                                     "ppocr_det, precision, magika, yolov8n and DTYPE bf16 or fp16")
    assert not (tmp_path / "out.json").exists()


def test_cases_not_packed_are_named_with_the_command_that_packs_them(tmp_path):
    result = bench("--data", str(tmp_path), "--cases", "magika:bf16", "--out", str(tmp_path / "out.json"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"accubisect: {tmp_path}: no magika; run bench/device_pack.sh first"


@pytest.mark.e2e
def test_the_precision_example_runs_each_dtype_this_cpu_has_and_skips_the_other(tmp_path):
    cases = "precision:bf16,precision:fp16"
    packed = bench("--pack", str(tmp_path / "cases"), "--cases", cases)
    assert packed.returncode == 0, packed.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "cases" / "precision" / "samples").iterdir()) == sorted(
        p.name for p in (REPO / "examples" / "precision" / "samples").iterdir())
    out = tmp_path / "out.json"
    result = bench("--data", str(tmp_path / "cases"), "--cases", cases, "--jobs", "2", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    report = json.loads(out.read_text())
    capabilities = cpu_capabilities()
    assert report["host"]["optimization_capabilities"] == capabilities
    flags = Path("/proc/cpuinfo").read_text().split("\nflags", 1)[1].split("\n", 1)[0].split()
    assert report["host"]["cpu_flags"] == {flag: flag in flags for flag in ("avx512_bf16", "avx512_fp16", "amx_bf16")}
    rows = {row["dtype"]: row for row in report["cases"]}
    assert list(rows) == ["bf16", "fp16"]
    for dtype, row in rows.items():
        if CAPABILITY[dtype] not in capabilities:
            assert "OPTIMIZATION_CAPABILITIES include " + CAPABILITY[dtype] in row["skipped"], row
            assert f"precision | {dtype} | skipped: precision.dtype: {dtype} " in result.stdout
            continue
        assert row["kernels"] and all(name.endswith(("bf16", "f16")) for name in row["kernels"]), row
        assert row["verdict_before"].startswith(("pass (", "FAIL (")) and row["probes"] >= 1, row
        assert row["answer"].startswith(row["status"]) and row["reverified"].startswith("pass ("), row
        assert row["verdict_before"].startswith("pass") == (row["status"] == "nothing to fix"), row
        assert f"precision | {dtype} | " in result.stdout


@pytest.mark.e2e
def test_the_slimmed_wheel_leaves_out_the_gpu_and_other_frontends_and_installs(tmp_path):
    """A wheel laid out as OpenVINO's, slimmed, then installed by pip as the device machine does."""
    members = {"openvino/__init__.py": b"", "openvino/libs/libopenvino_intel_cpu_plugin.so": b"cpu",
               "openvino/libs/libopenvino_intel_gpu_plugin.so": b"gpu", "openvino/libs/cache.json": b"{}",
               "openvino/libs/libopenvino_onnx_frontend.so.2641": b"onnx",
               "openvino/libs/libopenvino_pytorch_frontend.so.2641": b"pt",
               "openvino/frontend/pytorch/__init__.py": b"", "openvino/frontend/onnx/__init__.py": b"",
               "openvino/include/openvino/core.hpp": b"",
               "openvino-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: openvino\nVersion: 1.0\n",
               "openvino-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n"}
    wheel = tmp_path / "openvino-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("openvino-1.0.dist-info/RECORD", "".join(f"{name},,\n" for name in members))
    (tmp_path / "slim").mkdir()
    made = subprocess.run([sys.executable, str(REPO / "bench" / "slim_wheel.py"), str(wheel), str(tmp_path / "slim")],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    with zipfile.ZipFile(tmp_path / "slim" / wheel.name) as slim:
        kept = set(slim.namelist())
        record = dict(line.split(",", 1) for line in slim.read("openvino-1.0.dist-info/RECORD").decode().split())
    assert kept == {"openvino/__init__.py", "openvino/libs/libopenvino_intel_cpu_plugin.so",
                    "openvino/libs/libopenvino_onnx_frontend.so.2641", "openvino/frontend/onnx/__init__.py",
                    *(name for name in members if ".dist-info/" in name), "openvino-1.0.dist-info/RECORD"}
    assert set(record) == kept
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"cpu").digest()).rstrip(b"=").decode()
    assert record["openvino/libs/libopenvino_intel_cpu_plugin.so"] == f"sha256={digest},3"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                                "--target", str(tmp_path / "site"), str(tmp_path / "slim" / wheel.name)],
                               capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / "site" / "openvino" / "libs" / "libopenvino_intel_cpu_plugin.so").read_bytes() == b"cpu"
    assert not (tmp_path / "site" / "openvino" / "libs" / "libopenvino_intel_gpu_plugin.so").exists()
