"""The instruction set of the CPU this process runs on.

ONNX Runtime's level-`all` graphs are specific to the CPU they were made on (NCHWc block sizes and
kernels follow the vector width), so a compiled graph must never be dumped on another kind of CPU. The
compile stage's key includes this signature, and the dump stage checks it.
"""

from __future__ import annotations

import functools
import platform
import re
from pathlib import Path

# The x86 feature flags ORT's MLAS kernels dispatch on; other architectures are named by machine alone.
DISPATCH_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                  "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


@functools.cache
def cpu_signature(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """e.g. "x86_64:avx,avx2,avx512f,fma,sse4_1" — the machine and the dispatch-relevant flags it has."""
    machine = platform.machine() or "unknown"
    try:
        text = cpuinfo.read_text()
    except OSError:
        return machine
    match = re.search(r"^(flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    flags = set(match.group(2).split()) if match else set()
    return f"{machine}:{','.join(sorted(flags & set(DISPATCH_FLAGS)))}"
