"""The backend contract: what a runtime that compiles and runs the model implements, and the runtimes that do.

Every backend compiles a variant and saves the graph it really executes as an ONNX graph (`compile`), so
the graph, dump and compare stages read every runtime's executed graph the same way, and runs a compiled
variant with chosen tensors exposed (`run_exposed`), saying which of them are not what the undumped
program computes. It says whether it is installed and whether this machine runs a reduced type
(`check_installed`, `check_dtype`: the plan's preflight), and which of the optional capabilities it has
(`capabilities`): a stage needing one it lacks stops in one line (`require`). docs/backends.md, "Adding a
backend", says what a third runtime implements.

`ort-cpu` runs ONNX Runtime's CPU provider. Its fp16 path computes almost every op in fp32 behind Casts
and never materialises the fp16 tensors between them, so it hides overflow: reduced nodes are modelled
by storage emulation there (`emulate.py`). `ort-cuda` runs onnxruntime-gpu's CUDA provider, whose fp16
and bf16 kernels are what a GPU deployment runs: reduced nodes run natively, as the finalized model
(`finalize.py`) with real low-precision tensors and kernels. `openvino-cpu` (`openvino_backend.py`) runs
OpenVINO's CPU plugin, whose bf16 and f16 kernels are the CPU's own.

ONNX Runtime falls back to the CPU without raising when the CUDA provider cannot load (missing CUDA or
cuDNN libraries, no device), even when it is the only provider asked for. A CPU run would then be
reported as the GPU's, so every session is checked for the provider it was asked to use.
"""

from __future__ import annotations

import abc
import functools
import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx

from accubisect.core.emulate import emulate
from accubisect.core.errors import BackendError, ConfigError
from accubisect.runtime.finalize import finalize

if TYPE_CHECKING:
    from accubisect.runtime.ort_compile import CompileOptions

# The optional capabilities of the contract: what a stage may ask of a backend beyond compiling a variant,
# mapping its executed graph to the original nodes and running it with tensors exposed.
FUSION_RULES = "fusion rules switched off by name"  # fusion_bisect, fusion instances, reduce
LOCAL_ERRORS = "compiled nodes run alone"  # each node's local error in a comparison
KEEP_FP32 = "nodes kept in fp32 in a reduced variant"  # precision_bisect
PRECISION_MODES = "precision assigned by mode on the compiled graph"  # precision (and ORT's precision_bisect)
DEPLOYABLE = "a deployable answer, verified"  # precision_bisect's model.onnx
CUDA_INSTALL = "pip install 'onnxruntime-gpu[cuda,cudnn]~=1.31.0'"  # CUDA 13 and cuDNN 9 from pip
_LOAD_FAILURE = re.compile(r"Failed to load library \S+ with error: ([^\n\x1b]+)")
_ORT_ERROR = re.compile(r"\[E:onnxruntime[^\]]*\]\s*([^\n\x1b]+)")


@dataclass(frozen=True)
class ExposedRun:
    """One run with chosen tensors exposed: {name: array}; the tensors read widened, {name: their element
    type} (bfloat16 stored as float32, exactly); the tensors not faithful to the undumped program, {name:
    why}."""

    tensors: dict[str, np.ndarray]
    widened: dict[str, str] = field(default_factory=dict)
    unfaithful: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VariantPair:
    """The first comparison's two variants on a backend: each one's (level, session config entries), what
    the report calls them, and the reduced type the candidate computes in (None: it computes in fp32)."""

    reference: tuple[str, Mapping[str, str]]
    candidate: tuple[str, Mapping[str, str]]
    labels: tuple[str, str]
    reduced: str | None = None


@dataclass(frozen=True)
class Backend(abc.ABC):
    """The contract. `gpus`: what one run of the model asks a cluster for."""

    name: str
    gpus: int
    capabilities: ClassVar[frozenset[str]]

    @abc.abstractmethod
    def check_installed(self) -> None:
        """Refuses, in one line naming the install command, a backend whose runtime is not installed."""

    def check_dtype(self, dtype: str) -> None:  # noqa: B027 (refusing none is the default)
        """Refuses, in one line naming the capability, a reduced type this machine cannot run as the backend
        says it does; a backend that emulates or runs on a device checked per session refuses none."""

    def require(self, capability: str, needed_by: str) -> None:
        """Stops a stage that needs `capability` on a backend that lacks it, in one line."""
        if capability not in self.capabilities:
            raise ConfigError(f"backend: {self.name} has no {capability}, which {needed_by} needs; "
                              f"run it with backend: ort-cpu")

    @abc.abstractmethod
    def version(self) -> str:
        """The runtime's version, recorded in every file it made."""

    @abc.abstractmethod
    def variant_pair(self, level: str, dtype: str) -> VariantPair:
        """How the reference and the candidate of the first comparison compile, for the configured level and
        reduced type (`compile.level`, `precision.dtype`)."""

    @abc.abstractmethod
    def compile(self, model: Path | bytes, options: CompileOptions, save_to: Path | None,
                threads: int | None = None, own_weights: bool = False) -> tuple[str, ...]:
        """Compiles `model` as `options` say, with at most `threads` threads, and saves the graph it
        executes to `save_to` as ONNX (with `own_weights`, its weights to `<save_to name>.data` beside it).
        Returns the compiler passes that changed the graph, in order (none where the runtime names none)."""

    @abc.abstractmethod
    def run_exposed(self, model: Path, compiled: Path, options: CompileOptions, names: Iterable[str],
                    feeds: Mapping[str, np.ndarray], threads: int | None = None) -> ExposedRun:
        """Runs the variant of `model` that `compile` saved to `compiled` on `feeds`, with the tensors
        `names` (and the model outputs) exposed."""


@dataclass(frozen=True)
class OrtBackend(Backend):
    """ONNX Runtime with these execution providers: what differs between them is how a reduced node runs
    (`reduced_model`) and what must happen in a process before its first session (`prepare`). The saved
    optimized graph is the executed graph; a dump runs it with optimizations off and every exposed tensor
    made a graph output."""

    providers: tuple[str, ...] = ()  # ONNX Runtime execution providers, preferred first
    capabilities: ClassVar[frozenset[str]] = frozenset({FUSION_RULES, LOCAL_ERRORS, KEEP_FP32, PRECISION_MODES,
                                                        DEPLOYABLE})

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

    def version(self) -> str:
        from accubisect.runtime.ort_compile import ort_version

        return ort_version()

    def variant_pair(self, level: str, dtype: str) -> VariantPair:
        """Fusion off (nothing optimized) against fusion on at `level`, both fp32: the reduced type is the
        precision stage's."""
        return VariantPair(("off", {}), (level, {}), ("fusion_off", "fusion_on"))

    def compile(self, model: Path | bytes, options: CompileOptions, save_to: Path | None,
                threads: int | None = None, own_weights: bool = False) -> tuple[str, ...]:
        from accubisect.runtime.ort_compile import compile_model

        return compile_model(model, options, self, save_to, threads, own_weights).modified

    def run_exposed(self, model: Path, compiled: Path, options: CompileOptions, names: Iterable[str],
                    feeds: Mapping[str, np.ndarray], threads: int | None = None) -> ExposedRun:
        """The saved graph runs as it is: every tensor exposed is one it computes (`options` made it)."""
        from accubisect.runtime.ort_exposed import run_exposed

        stat = compiled.stat()
        graph = _saved_graph(compiled, stat.st_mtime_ns, stat.st_size)
        tensors, widened = run_exposed(graph, names, dict(feeds), self, threads, compiled.parent)
        return ExposedRun(tensors, widened)

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


class CpuBackend(OrtBackend):
    """ORT's CPU provider: reduced nodes through storage emulation, which shows the overflow its fp16 path
    hides."""

    def reduced_model(self, model: onnx.ModelProto, reduced: set[str], dtype: str,
                      dtypes: Mapping[str, str], weights: Path | None = None) -> onnx.ModelProto:
        return emulate(model, reduced, dtype, dtypes)  # rounds by Casts: reads no weight

    def prepare(self) -> None:
        return None


class CudaBackend(OrtBackend):
    """onnxruntime-gpu's CUDA provider: reduced nodes native, as the finalized model."""

    def reduced_model(self, model: onnx.ModelProto, reduced: set[str], dtype: str,
                      dtypes: Mapping[str, str], weights: Path | None = None) -> onnx.ModelProto:
        return finalize(model, reduced, dtype, dtypes, weights)

    def prepare(self) -> None:
        """Loads the CUDA and cuDNN libraries that pip installed beside onnxruntime-gpu, once per process."""
        _preload_cuda()


CPU = CpuBackend("ort-cpu", gpus=0, providers=("CPUExecutionProvider",))
CUDA = CudaBackend("ort-cuda", gpus=1, providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
# name -> "module:attribute" of the backend: importing accubisect imports no runtime it does not use
BACKENDS = {"ort-cpu": f"{__name__}:CPU", "ort-cuda": f"{__name__}:CUDA",
            "openvino-cpu": "accubisect.runtime.openvino_backend:OPENVINO_CPU"}


def backend_named(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"backend: unknown backend '{name}'; choose one of {', '.join(BACKENDS)}")
    module, attribute = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), attribute)


@functools.lru_cache(maxsize=1)
def _saved_graph(path: Path, modified_ns: int, size: int) -> onnx.ModelProto:
    """The compiled graph at `path` (as of `modified_ns` and `size`), read once for a dump's batches: a model
    saved whole holds its weights inline, and reading it is parsing them. ORT reads the weights from beside
    it. `run_exposed` changes only copies of it."""
    from accubisect.formats.model import load_compiled

    return load_compiled(path, load_weights=False)


@functools.cache
def _preload_cuda() -> None:
    import onnxruntime as ort

    ort.preload_dlls()
