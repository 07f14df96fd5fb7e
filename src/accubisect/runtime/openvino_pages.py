"""The pages of the weights OpenVINO maps, handed back to the page cache while it compiles.

OpenVINO reads an ONNX model's external data and an IR's `.bin` through read-only shared mappings
(`ENABLE_MMAP`, its default), and its CPU plugin keeps those constants referenced for the compiled model's life,
while it computes from a copy of its own (each weight repacked for its kernels): it never reads the mapped
original again after compiling, yet every page the compile touched stays in the process's RSS. Measured on
bench/large_model.py's 1.07 GB transformer (openvino 2026.4.1, 1 thread): one compile 2214 MiB, 1088 of it the
mapped file. `pages_released` drops the pages of every read-only shared file mapping (madvise MADV_DONTNEED: on
such a mapping a page leaves the process, stays in the page cache and is read back if touched again, so nothing
the plugin reads can change) every 20 ms while the work runs and once when it ends: the same compile peaks at
1234-1246 MiB. The next compile reads the pages back from the page cache: five bf16 compiles of that model in one
process 4.3-5.4 s -> 5.2-5.4 s. Every 5 ms cost more than it saved (the 3.5 GB variant's f32 compile 16.4 s, at
20 ms 4.9 s, keeping every page 8.6 s). `ov.save_model` holds the GIL, so while it runs no page is dropped; they
are, once it returns. A model without external data is read into memory, not mapped: nothing to release.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

MADV_DONTNEED = 4
INTERVAL_S = 0.02


@contextmanager
def pages_released() -> Iterator[None]:
    """Drops the mapped weights' pages while the block runs (a thread) and once after it."""
    if not sys.platform.startswith("linux"):
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(target=_drop_until, args=(stop,), name="openvino-pages", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        drop_mapped_pages()


def _drop_until(stop: threading.Event) -> None:
    while not stop.wait(INTERVAL_S):
        drop_mapped_pages()


def drop_mapped_pages() -> None:
    """MADV_DONTNEED on each read-only shared file mapping of this process (`r--s` in /proc/self/maps): the
    weights OpenVINO maps. Libraries are private mappings, anything written is writable: neither is touched."""
    libc = _libc()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[1] == "r--s" and fields[5].startswith("/"):
                start, end = (int(address, 16) for address in fields[0].split("-"))
                libc.madvise(start, end - start, MADV_DONTNEED)


@cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc
