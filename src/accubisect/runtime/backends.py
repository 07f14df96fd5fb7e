"""The runtimes a variant is compiled and run on, and how each runs a node in reduced precision.

`ort-cpu` runs ONNX Runtime's CPU provider. Its fp16 path computes almost every op in fp32 behind Casts
and never materialises the fp16 tensors between them, so it hides overflow: reduced nodes are modelled
by storage emulation there (`emulate.py`). `ort-cuda` runs onnxruntime-gpu's CUDA provider, whose fp16
and bf16 kernels are what a GPU deployment runs: reduced nodes run natively, as the finalized model
(`finalize.py`) with real low-precision tensors and kernels.

ONNX Runtime falls back to the CPU without raising when the CUDA provider cannot load (missing CUDA or
cuDNN libraries, no device), even when it is the only provider asked for. A CPU run would then be
reported as the GPU's, so every session is checked for the provider it was asked to use.
"""

from __future__ import annotations

import abc
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx

from accubisect.core.emulate import emulate
from accubisect.core.errors import BackendError, ConfigError
from accubisect.runtime.finalize import finalize

CUDA_INSTALL = "pip install 'onnxruntime-gpu[cuda,cudnn]~=1.31.0'"  # CUDA 13 and cuDNN 9 from pip
_LOAD_FAILURE = re.compile(r"Failed to load library \S+ with error: ([^\n\x1b]+)")
_ORT_ERROR = re.compile(r"\[E:onnxruntime[^\]]*\]\s*([^\n\x1b]+)")


@dataclass(frozen=True)
class Backend(abc.ABC):
    """What differs between runtimes is how a reduced node runs (`reduced_model`) and what must happen in a
    process before its first session (`prepare`); everything else is ONNX Runtime's, with these providers."""

    name: str
    providers: tuple[str, ...]  # ONNX Runtime execution providers, preferred first
    gpus: int  # what one run of the model asks a cluster for

    @property
    def provider(self) -> str:
        return self.providers[0]

    @abc.abstractmethod
    def reduced_model(self, model: onnx.ModelProto, reduced: set[str], dtype: str,
                      dtypes: Mapping[str, str], weights: Path | None = None) -> onnx.ModelProto:
        """`model` with the nodes in `reduced` in `dtype`, as this backend runs them; `weights`: the folder of
        `model`'s external data, when it was read without its weights."""

    @abc.abstractmethod
    def prepare(self) -> None:
        """Whatever the provider needs loaded in this process before its first session."""

    def check_installed(self) -> None:
        """The installed onnxruntime has this backend's provider (the device itself is checked per session:
        a cluster's submit host may have none)."""
        import onnxruntime as ort

        available = ort.get_available_providers()
        if self.provider not in available:
            raise ConfigError(f"backend: {self.name} needs ONNX Runtime's {self.provider}, and the installed "
                              f"onnxruntime {ort.__version__} has only {', '.join(available)}: "
                              f"pip uninstall -y onnxruntime && {CUDA_INSTALL}")

    def check_session(self, session, log_text: str) -> None:
        """Refuses a session ONNX Runtime quietly built on another provider; `log_text` is its captured log."""
        used = session.get_providers()
        if self.provider in used:
            return
        reasons = _LOAD_FAILURE.findall(log_text) or _ORT_ERROR.findall(log_text)
        why = reasons[-1].strip() if reasons else "no reason logged"
        raise BackendError(f"backend {self.name}: ONNX Runtime could not use {self.provider} and fell back to "
                           f"{', '.join(used)} ({why}); nvidia-smi must see a GPU, and CUDA 13 / cuDNN 9 "
                           f"must load: {CUDA_INSTALL}")


class CpuBackend(Backend):
    """ORT's CPU provider: reduced nodes through storage emulation, which shows the overflow its fp16 path
    hides."""

    def reduced_model(self, model: onnx.ModelProto, reduced: set[str], dtype: str,
                      dtypes: Mapping[str, str], weights: Path | None = None) -> onnx.ModelProto:
        return emulate(model, reduced, dtype, dtypes)  # rounds by Casts: reads no weight

    def prepare(self) -> None:
        return None


class CudaBackend(Backend):
    """onnxruntime-gpu's CUDA provider: reduced nodes native, as the finalized model."""

    def reduced_model(self, model: onnx.ModelProto, reduced: set[str], dtype: str,
                      dtypes: Mapping[str, str], weights: Path | None = None) -> onnx.ModelProto:
        return finalize(model, reduced, dtype, dtypes, weights)

    def prepare(self) -> None:
        """Loads the CUDA and cuDNN libraries that pip installed beside onnxruntime-gpu, once per process."""
        _preload_cuda()


CPU = CpuBackend("ort-cpu", ("CPUExecutionProvider",), gpus=0)
CUDA = CudaBackend("ort-cuda", ("CUDAExecutionProvider", "CPUExecutionProvider"), gpus=1)
BACKENDS = {backend.name: backend for backend in (CPU, CUDA)}


def backend_named(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ConfigError(f"backend: unknown backend '{name}'; choose one of {', '.join(BACKENDS)}") from None


@functools.cache
def _preload_cuda() -> None:
    import onnxruntime as ort

    ort.preload_dlls()
