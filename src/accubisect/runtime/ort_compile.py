"""Compiling a model with ONNX Runtime: optimization level, session config, disabled optimizers.

ORT reports which graph transformers changed the graph only in its verbose log, which it writes to the
process's stderr from C++. The log is captured at the file-descriptor level for the length of one
session creation.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from accubisect.core.errors import ModelError

if TYPE_CHECKING:  # the ORT backend calls this module: only its type is needed here
    from accubisect.runtime.backends import Backend

log = logging.getLogger(__name__)

COPY_OPS = ("MemcpyFromHost", "MemcpyToHost")  # what ORT inserts between host and device placements
_FIRED = re.compile(r"GraphTransformer (\S+) modified: (\d)")
_STATUS = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : ")
_SOURCE_LINE = re.compile(r"\S+\.(?:h|cc|cpp|cu|cuh):\d+ ")  # precedes a C++ signature in ORT's messages
_INVALID_NODE = re.compile(r'In Node, \("([^"]*)", ([^,]+), "([^"]*)", -?\d+\) : .*? , Error (.*)')
MESSAGE_LIMIT = 300
_STDERR_TURN = threading.Lock()
LOAD_ADVICE = "check the model's opset and custom-op domains against what this ONNX Runtime implements, or `backend`"
# ORT's session config keys for external data: the file a saved graph writes its weights to (beside it), and
# the folder the weights of a graph handed over as bytes are read from
SAVED_WEIGHTS = "session.optimized_model_external_initializers_file_name"
WEIGHTS_FOLDER = "session.model_external_initializers_file_folder_path"
NO_PREPACKING = "session.disable_prepacking"
# ORT uses the buffers handed over for external data files in place instead of copying them
DIRECT_WEIGHTS = "session.use_external_initializer_file_buffers_directly"
_MAPPED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (file, its identity) -> its mapping
_MAPPED_TURN = threading.Lock()


@dataclass(frozen=True)
class CompileOptions:
    """Everything ORT is told when it compiles a variant."""

    level: str
    session_config: Mapping[str, str] = field(default_factory=dict)
    disabled: frozenset[str] = frozenset()  # ORT optimizer names

    def session_options(self, log: bool = False, save_to: Path | None = None, threads: int | None = None,
                        build_only: bool = False):
        """ORT's options; `threads` caps its intra-op pool (None: ORT's default, one thread per core). A job
        that Snakemake gave n cores uses n: ORT's idle threads spin, so a pool larger than the job's share
        slows every other job on the machine. `build_only`: for a session built to save its graph and never
        run, so ORT skips the work that prepares a run after the graph is saved: it prepacks no weight (a
        read of every MatMul and Conv weight) and plans no memory reuse (on a 400-node CNN two thirds of a
        session's creation)."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        options.graph_optimization_level = {
            "off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.level]
        for key, value in sorted(self.session_config.items()):
            options.add_session_config_entry(key, str(value))
        if build_only:
            options.add_session_config_entry(NO_PREPACKING, "1")
            options.enable_mem_pattern = options.enable_mem_reuse = False
        if log:
            options.log_severity_level = 0
            options.log_verbosity_level = 1
        else:
            options.log_severity_level = 3  # ORT warns on every level-all save; the user cannot act on it
        if save_to is not None:
            options.optimized_model_filepath = str(save_to)
        return options

    def with_config(self, entries: Mapping[str, str]) -> CompileOptions:
        """These options with `entries` added to (or replacing those of) the session config."""
        return replace(self, session_config={**self.session_config, **entries})


def unoptimized(weights: Path | None = None) -> CompileOptions:
    """Options that run a saved graph as it is. `weights`: the folder of its external data files, for a graph
    read without its weights (`load_weights=False`) and handed over as bytes, so no copy of the weights is
    made in Python."""
    return with_weights(CompileOptions("off"), weights)


def with_weights(options: CompileOptions, weights: Path | None) -> CompileOptions:
    """`options` for a graph handed over as bytes whose external data ORT reads from the folder `weights`
    (None: the graph holds its weights)."""
    return options if weights is None else options.with_config({WEIGHTS_FOLDER: str(weights)})


def shared_weights(options: CompileOptions) -> CompileOptions:
    """`options` for a probe of a graph handed over as bytes (`with_weights`): ORT reads its weights from the one
    mapping of their files this process holds (`_shared_weights`), prepacking none. Two fusion or instance probes
    side by side otherwise each hold a packed copy of every MatMul weight: 1.7-1.9 GB against a 1.6 GB target
    on the 1.07 GB transformer. A probe is judged against the accuracy check, not compared bit for bit. Not for
    a graph whose optimization rewrites most weights (a CNN's fusion probes, `FusionProbe.shares_weights`): ORT
    holds what it makes on top of the mapping."""
    return options.with_config({DIRECT_WEIGHTS: "1"})


def ort_version() -> str:
    import onnxruntime as ort

    return ort.__version__


@dataclass(frozen=True)
class TransformerLog:
    """What ORT's verbose log says about one compilation, names in the order they first appear."""

    ran: tuple[str, ...]
    modified: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> TransformerLog:
        ran: dict[str, None] = {}
        modified: dict[str, None] = {}
        for name, flag in _FIRED.findall(text):
            ran.setdefault(name)
            if flag == "1":
                modified.setdefault(name)
        return cls(tuple(ran), tuple(modified))


def loadable(model: Path | bytes) -> str | bytes:
    """What to hand ORT for `model`. ORT refuses two nodes with one name, which real exporters write; such
    a model is handed over with those nodes named as the graph JSON and the dumps call them, so nothing
    else changes: as bytes of its graph, its weights (inline or external) read from where they are
    (`_create_session`)."""
    if isinstance(model, bytes):
        return model
    from accubisect.core.onnx_graph import name_nodes_uniquely
    from accubisect.formats.graph_only import graph_only

    header = graph_only(Path(model))  # no weight read, the model saved whole or not
    names = [node.name for node in header.graph.node if node.name]
    if len(set(names)) == len(names):
        return str(model)
    name_nodes_uniquely(header.graph)
    return header.SerializeToString()


def compile_model(model: Path | bytes, options: CompileOptions, backend: Backend,
                  save_to: Path | None = None, threads: int | None = None, own_weights: bool = False) -> TransformerLog:
    """Builds an ORT session for `model` on `backend`, saving the graph ORT runs to `save_to`. With
    `own_weights`, the saved graph writes its weights to `<save_to name>.data` beside it: ORT otherwise keeps
    the external data references of the model it read, relative, which then point nowhere."""
    if save_to is not None and own_weights:
        options = options.with_config({SAVED_WEIGHTS: f"{save_to.name}.data"})
    created = _create_session(model, options, backend, log=True, save_to=save_to, threads=threads, build_only=True)
    transformer_log = TransformerLog.parse(created[1])
    if save_to is not None and backend.gpus:  # only a device provider places copies; spare CPU runs the reload
        drop_copies(save_to)
    return transformer_log


def drop_copies(saved: Path) -> None:
    """ORT writes the host/device copies it placed for a GPU provider into the saved graph, and then refuses
    to load that graph again (no kernel for MemcpyToHost, or a duplicate name when it places them anew).
    A copy changes no value: each is removed, and what read its output reads its input."""
    import onnx

    model = onnx.load(str(saved), load_external_data=False)  # its weights stay where they are
    graphs = list(_graphs(model.graph))
    if not any(node.op_type in COPY_OPS for graph in graphs for node in graph.node):
        return
    renamed: dict[str, str] = {}
    for graph in graphs:
        renamed.update(_copy_renames(graph))
    for graph in graphs:
        for node in graph.node:
            for names in (node.input, node.output):
                for index, name in enumerate(names):
                    names[index] = renamed.get(name, name)
    for graph in graphs:
        for copy in [node for node in graph.node if node.op_type in COPY_OPS]:
            graph.node.remove(copy)
    onnx.save(model, str(saved))


def _copy_renames(graph) -> dict[str, str]:
    """Tensor renames that make `graph`'s copies redundant: a copy's output is read as its input, except
    where it writes a graph output, whose name its input then takes."""
    outputs = {value.name for value in graph.output}
    renamed: dict[str, str] = {}
    for node in graph.node:
        if node.op_type in COPY_OPS:
            source, copy = renamed.get(node.input[0], node.input[0]), node.output[0]
            if copy in outputs:
                renamed.update({source: copy, **{k: copy for k, v in renamed.items() if v == source}})
            else:
                renamed[copy] = source
    return renamed


def _graphs(graph):
    """`graph` and every subgraph inside it (If/Loop/Scan bodies)."""
    import onnx

    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for body in attribute.graphs:
                    yield from _graphs(body)


class Runner:
    """One model on one backend, as Polygraphy's runners are: made cheaply from what ORT will be told,
    `activate`d once (the session is built, and checked to run on the backend's provider), then `infer`red
    any number of times. No caller holds an onnxruntime object, so ORT's errors, providers and threads stay
    in this module; with at most `threads` intra-op threads (None: ORT's default)."""

    def __init__(self, model: Path | bytes, options: CompileOptions, backend: Backend, threads: int | None = None):
        self.model, self.options, self.backend, self.threads = model, options, backend, threads
        self._session = None
        self._weights: tuple[mmap.mmap, ...] = ()  # what the session reads its weights from

    def activate(self) -> Runner:
        """Builds the session; load errors become one-line ModelErrors. What ORT printed meanwhile (captured
        to explain a provider fallback; its verbose lines where ORT's own logger is set so) is logged, so it
        lands in the job's log as well as on stderr."""
        if self._session is None:
            self._session, log_text, self._weights = _create_session(self.model, self.options, self.backend,
                                                                     threads=self.threads)
            if log_text.strip():
                log.warning("ONNX Runtime: %s", log_text.strip())
        return self

    def infer(self, feeds: Mapping[str, np.ndarray], names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """{output name: array} for `names` (every output when None); run errors become one-line ModelErrors."""
        session = self._active()
        names = list(names or [output.name for output in session.get_outputs()])
        try:
            return dict(zip(names, session.run(names, dict(feeds)), strict=True))
        except Exception as error:  # ORT's own exception types
            raise ModelError(f"ONNX Runtime failed to run the model: {condensed(error)}") from None

    def output_types(self) -> dict[str, str]:
        """Output name -> ORT's type string (`tensor(float16)`), as ORT types them when it builds the session."""
        return {output.name: output.type for output in self._active().get_outputs()}

    def providers(self) -> list[str]:
        return list(self._active().get_providers())

    def _active(self):
        if self._session is None:
            raise RuntimeError("Runner.infer() before activate()")
        return self._session


def _create_session(model: Path | bytes, options: CompileOptions, backend: Backend, log: bool = False,
                    save_to: Path | None = None, threads: int | None = None, build_only: bool = False):
    """The session, checked to run on the backend's provider, ORT's log of its creation and the weights mapped
    for it (`_shared_weights`); `build_only` as `CompileOptions.session_options`'."""
    import onnxruntime as ort

    backend.prepare()
    source = loadable(model)
    if isinstance(source, bytes) and isinstance(model, Path):  # renamed: the weights stay in the model's folder
        options = with_weights(options, model.parent)
    session_options = options.session_options(log, save_to, threads, build_only)
    weights = _shared_weights(session_options, source, options)
    if save_to is None:  # a run: each node as soon as its inputs are ready, so a weight's emulation Casts run
        session_options.execution_order = ort.ExecutionOrder.PRIORITY_BASED  # just before its reader, not all first
    with _captured_stderr() as captured:
        try:
            session = ort.InferenceSession(source, session_options,
                                           providers=list(backend.providers),
                                           disabled_optimizers=sorted(options.disabled))
        except Exception as error:  # ORT raises its own Fail/InvalidGraph/... types
            where = "model" if isinstance(model, bytes) else model
            raise ModelError(f"{where}: ONNX Runtime {ort.__version__} cannot load it: {condensed(error)}; "
                             f"{LOAD_ADVICE}") from None
    backend.check_session(session, captured.text)
    for data in weights:  # what ORT folded into weights of its own (an fp16 weight as fp32) is read again
        data.madvise(mmap.MADV_DONTNEED)  # from the page cache only if a run reads it
    return session, captured.text, weights


def _shared_weights(session_options, source: str | bytes, options: CompileOptions) -> tuple[mmap.mmap, ...]:
    """For a graph handed over as bytes whose weights lie in the folder `WEIGHTS_FOLDER`, the data files it names
    that ORT is handed mapped, read-only and once per process, to use in place, prepacking no weight: those of
    an emulation (`core.emulate`), of a graph naming a symbolic link, which ORT would refuse to open (the deploy
    job links your data files), and of a probe that asks (`shared_weights`: instance probes, and fusion probes
    where the rules keep the weights). ORT otherwise maps a file once per session and prepacks a copy of every
    MatMul weight: two probes side by side held the 1.07 GB transformer's weights four times (4.3 GB); now they
    read one mapping, and after a session is built its pages leave the process until a run reads them. Other
    graphs (your compiled ones) keep ORT's own reading and prepacking: a packed MatMul differs in its last bits,
    and their dumps reproduce the fused run bit for bit. The mappings are returned: they must outlive the
    session."""
    folder = options.session_config.get(WEIGHTS_FOLDER)
    if not isinstance(source, bytes) or folder is None:
        return ()
    import onnx

    from accubisect.core.emulate import EMULATION
    from accubisect.formats.model import external_data_files

    graph = onnx.ModelProto.FromString(source)  # the graph: its weights are references
    emulated = any(prop.key == EMULATION for prop in graph.metadata_props)
    files = [path for path in external_data_files(graph, Path(folder) / "model.onnx") if path.stat().st_size]
    asked = options.session_config.get(DIRECT_WEIGHTS) == "1"
    if not (emulated or asked or any(path.is_symlink() for path in files)):
        return ()
    mapped = tuple(_mapping(path) for path in files)  # ORT then reads every file from these, or fails
    if mapped:  # never built only: an emulation or a deploy probe is run, not compiled
        session_options.add_external_initializers_from_files_in_memory(
            [str(path.relative_to(folder)) for path in files], list(mapped), [len(data) for data in mapped])
        if not asked:  # ORT warns when an entry is set twice
            session_options.add_session_config_entry(DIRECT_WEIGHTS, "1")
        session_options.add_session_config_entry(NO_PREPACKING, "1")
    return mapped


def _mapping(path: Path) -> mmap.mmap:
    """`path` mapped read-only: the mapping of this process's sessions that hold one, else a new one."""
    stat = path.stat()
    key = (str(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _MAPPED_TURN:
        mapped = _MAPPED.get(key)
        if mapped is None:
            with open(path, "rb") as handle:
                mapped = _MAPPED[key] = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
        return mapped


def condensed(error: Exception) -> str:
    """ORT's message on one short line: without its status prefix, the C++ file:line and function signature
    it often carries, and the node's type signature in an invalid-graph message."""
    text = _STATUS.sub("", " ".join(str(error).split()))
    while match := _SOURCE_LINE.search(text):
        text = text[:match.start()] + _after_signature(text, match.end())
    if node := _INVALID_NODE.search(text):
        text = f"node '{node[1]}' ({node[3] + ':' if node[3] else ''}{node[2]}): {node[4]}"
    text = text or type(error).__name__
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 1] + "…"


def _after_signature(text: str, start: int) -> str:
    """What follows the C++ signature that starts at `start`: up to its balanced parameter list and `const`."""
    depth = 0
    for at in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[at], 0)
        if depth == 0 and text[at] == ")":
            return text[at + 1:].removeprefix(" const").lstrip()
    return text[start:]


class _Log:
    text = ""


@contextlib.contextmanager
def _captured_stderr() -> Iterator[_Log]:
    """Redirects file descriptor 2 into a temporary file; the C++ log lands there. The descriptor belongs to
    the process: a bisection creating sessions in several threads takes turns here, or one thread's
    restore would leave stderr pointing at another's closed file (and the console silent)."""
    log = _Log()
    with _STDERR_TURN, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield log
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            log.text = sink.read().decode(errors="replace")
