"""Copies OpenVINO's wheel without what a CPU-only run of ONNX models never loads, so that it travels in the
device carry (bench/device_pack.sh: 64 MiB in all; the wheel is 56 MiB, slimmed about 30).

    python bench/slim_wheel.py WHEEL OUT_FOLDER

Left out: the GPU and NPU plugins and the GPU's kernel cache (`libs/cache.json`), the frontends of other
formats (TensorFlow, TFLite, PyTorch, Paddle, JAX, GGUF: their libraries and Python packages) and the C++
headers and CMake files. Kept: the core, the CPU plugin, the ONNX and IR frontends (a model is read from
ONNX, a keep set is an IR read back), TBB and the Python API. The wheel keeps its name and metadata, and its
RECORD lists exactly the members it holds, so pip installs it as it would the original.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import zipfile
from pathlib import Path

LEFT_OUT = re.compile(r"^openvino/(libs/(libopenvino_intel_(gpu|npu)_plugin\.so|cache\.json"
                      r"|libopenvino_(tensorflow|tensorflow_lite|pytorch|paddle|jax|gguf)_frontend\.so[.\d]*)"
                      r"|frontend/(tensorflow|pytorch|paddle|jax)/|include/|cmake/)")


def slim(wheel: Path, folder: Path) -> Path:
    """Writes the slimmed copy of `wheel` into `folder` under the same name; returns its path."""
    out = folder / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as kept:
        record = next(name for name in source.namelist() if name.endswith(".dist-info/RECORD"))
        lines = []
        for info in source.infolist():
            if LEFT_OUT.match(info.filename) or info.filename == record:
                continue
            data = source.read(info)
            kept.writestr(info, data, zipfile.ZIP_DEFLATED, 9)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{info.filename},sha256={digest},{len(data)}")
        kept.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    out = slim(args.wheel, args.folder)
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB (was {args.wheel.stat().st_size / 2**20:.1f})")


if __name__ == "__main__":
    main()
