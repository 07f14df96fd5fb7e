"""`backend: openvino-cpu`: OpenVINO's CPU plugin, whose bf16 and f16 kernels are the CPU's own.

A variant is the ONNX model compiled with an `INFERENCE_PRECISION_HINT` (its session config): the reference
with `f32`, set explicitly since the plugin's default on a CPU with bf16 kernels is bf16; the candidate with
the reduced type. What the plugin runs is read from the compiled model's runtime graph
(`openvino_graph`) and saved as the variant's compiled graph. A dump compiles the model once more with the
chosen tensors added as outputs, each in the precision its executed node writes it (an f32 output would keep
the tail of a bf16 graph in f32), checks the runtime graph of that compile against the saved one and the
model outputs bit for bit against an undumped run, and marks what differs as unfaithful.

openvino is an optional extra: it is imported only here, inside the methods.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx

from accubisect.core.errors import ConfigError, ModelError
from accubisect.core.onnx_graph import name_nodes_uniquely
from accubisect.runtime.backends import DEPLOYABLE, KEEP_FP32, Backend, ExposedRun, VariantPair
from accubisect.runtime.openvino_graph import ExecutedGraph, executed_graph, original_nodes

if TYPE_CHECKING:
    from accubisect.runtime.ort_compile import CompileOptions

log = logging.getLogger(__name__)
INSTALL = "pip install .[openvino]"
COMPILE_ADVICE = "check its ops against what OpenVINO's CPU plugin implements, or set backend: ort-cpu"
HINT = "INFERENCE_PRECISION_HINT"
# precision.dtype -> the hint that asks for it and the OPTIMIZATION_CAPABILITIES entry that runs it
HINTS = {"bf16": "bf16", "fp16": "f16"}
CAPABILITY = {"bf16": "BF16", "fp16": "FP16"}
ISA_OF = {"bf16": "AVX512_BF16 or AMX-BF16", "fp16": "AVX512-FP16 or AMX-FP16"}
_REDUCED = ("bf16", "f16")  # runtime precisions an exposed output keeps (an f32 one would change the graph)


@dataclass(frozen=True)
class OpenVinoBackend(Backend):
    """OpenVINO on the CPU. No switch names a fusion and no node runs alone; nodes are kept in fp32 by IR
    `precise` marks, each compile read back (`openvino_keep.py`), and the answer is that IR, judged again."""

    capabilities: ClassVar[frozenset[str]] = frozenset({KEEP_FP32, DEPLOYABLE})

    def check_installed(self) -> None:
        if importlib.util.find_spec("openvino") is None:
            raise ConfigError(f"backend: {self.name} needs OpenVINO, which is not installed: {INSTALL}")

    def check_dtype(self, dtype: str) -> None:
        """A reduced type runs only on a CPU whose plugin lists its capability; elsewhere the plugin would
        quietly run f32 and the verdict would be reported as the reduced type's."""
        has = cpu_capabilities()
        if CAPABILITY[dtype] not in has:
            runs = [other for other, capability in CAPABILITY.items() if capability in has]
            advice = f"set precision.dtype: {runs[0]}, or run" if runs else "run"
            raise ConfigError(f"precision.dtype: {dtype} on backend {self.name} needs a CPU whose OpenVINO "
                              f"OPTIMIZATION_CAPABILITIES include {CAPABILITY[dtype]} ({ISA_OF[dtype]}); this "
                              f"CPU's are {', '.join(has)}: {advice} on a CPU that has it")

    def version(self) -> str:
        import openvino

        return f"openvino {openvino.get_version()}"

    def variant_pair(self, level: str, dtype: str) -> VariantPair:
        """f32, set explicitly, against the hint asking for `dtype`; both compiled for this CPU (level `all`
        keys them by its instruction set)."""
        return VariantPair(("all", {HINT: "f32"}), ("all", {HINT: HINTS[dtype]}), ("f32", f"{dtype} (OpenVINO)"),
                           dtype)

    def compile(self, model: Path | bytes, options: CompileOptions, save_to: Path | None,
                threads: int | None = None, own_weights: bool = False) -> tuple[str, ...]:
        """Saves the executed graph, each node carrying the ONNX nodes it stands for; no pass is named."""
        if not isinstance(model, Path):
            raise ModelError("backend openvino-cpu compiles a model file, not a model handed over as bytes")
        core, read = read_openvino(model)
        compiled = compiled_on_cpu(core, read, model, options.session_config, threads)
        graph = executed_graph(read, compiled.get_runtime_model())
        if save_to is not None:
            onnx.save(with_original_nodes(graph, onnx_graph_of(model), read), str(save_to))
        return ()

    def run_exposed(self, model: Path, compiled: Path, options: CompileOptions, names: Iterable[str],
                    feeds: Mapping[str, np.ndarray], threads: int | None = None) -> ExposedRun:
        names = list(dict.fromkeys(names))
        saved = ExecutedGraph.from_onnx(onnx.load(str(compiled)))
        precision = saved.output_precisions()
        core, read = read_openvino(model)
        present = {name for op in read.get_ordered_ops() for output in op.outputs() for name in output.get_names()}
        own = {name for output in read.outputs for name in output.get_names()}
        wanted = [name for name in names if name in present and name not in own and name not in feeds]
        # the undumped run first, its compile released before the dumping one: one compiled at a time
        undumped = run_outputs(compiled_on_cpu(core, read, model, options.session_config, threads), feeds)
        exposed = exposed_model(read, wanted, precision)
        dumping = compiled_on_cpu(core, exposed, model, options.session_config, threads)
        tensors = {name: array for name, array in run_outputs(dumping, feeds).items() if name in wanted or name in own}
        tensors.update({name: array for name, array in feeds.items() if name in names})
        unfaithful = _unfaithful(executed_graph(exposed, dumping.get_runtime_model()), saved, present, tensors,
                                 undumped)
        widened = {name: "bfloat16" for port in dumping.outputs for name in port.get_names()
                   if name in tensors and port.get_element_type().get_type_name() == "bf16"}
        return ExposedRun(tensors, widened, unfaithful)


OPENVINO_CPU = OpenVinoBackend("openvino-cpu", gpus=0)


def cpu_capabilities() -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def read_openvino(model: Path):
    import openvino as ov

    core = ov.Core()
    try:
        return core, core.read_model(str(model))
    except RuntimeError as error:
        release = ov.get_version().split("-")[0]
        raise ModelError(f"{model}: OpenVINO {release} cannot read it: {_first_line(error)}") from None


def compiled_on_cpu(core, model, source: Path, properties: Mapping[str, str], threads: int | None):
    """`model` (read from the file `source`, which a failure names) compiled by the CPU plugin, the pages of
    its mapped weights released as it goes (`openvino_pages`): the compiled model holds its own copy of each
    weight."""
    from accubisect.runtime.openvino_pages import pages_released

    properties = {**properties, **({"INFERENCE_NUM_THREADS": threads} if threads else {})}
    try:
        with pages_released():
            return core.compile_model(model, "CPU", properties)
    except RuntimeError as error:
        raise ModelError(f"{source}: OpenVINO cannot compile it for the CPU: {_first_line(error)}; {COMPILE_ADVICE}"
                         ) from None


def run_outputs(compiled, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output by each of its tensor names, bf16 widened (`_array`)."""
    request = compiled.create_infer_request()
    try:
        request.infer(dict(feeds))
    except RuntimeError as error:
        raise ModelError(f"OpenVINO failed to run the model: {_first_line(error)}") from None
    arrays = {}
    for index, port in enumerate(compiled.outputs):
        array = _array(request.get_output_tensor(index).data.copy(), port)
        arrays.update({name: array for name in port.get_names()})
    return arrays


@dataclass(frozen=True)
class CompiledRunner:
    """A compiled model as `SampleJudge.judge` runs it: the named outputs of one inference (any others, a
    fusion search's barrier outputs, are left out)."""

    compiled: object

    def infer(self, inputs: Mapping[str, np.ndarray], names: Iterable[str]) -> dict[str, np.ndarray]:
        outputs = run_outputs(self.compiled, inputs)
        return {name: outputs[name] for name in names}


def exposed_model(model, names: list[str], precision: Mapping[str, str]):
    """A copy of `model` with `names` added as outputs, each of the element type its executed node writes
    it in where that is reduced (bf16, f16)."""
    import openvino as ov
    from openvino.preprocess import PrePostProcessor

    exposed = model.clone()
    if not names:
        return exposed
    exposed.add_outputs(names)
    reduced = {index: precision[name] for index, port in enumerate(exposed.outputs) for name in port.get_names()
               if name in names and precision.get(name) in _REDUCED}
    if reduced:
        steps = PrePostProcessor(exposed)
        for index, kind in reduced.items():
            steps.output(index).tensor().set_element_type(getattr(ov.Type, kind))
        exposed = steps.build()
    return exposed


def _array(value: np.ndarray, port) -> np.ndarray:
    """The output as numpy holds it: bf16 reaches numpy as float16 holding raw bf16 bits, widened here to
    float32 from those bits (exactly)."""
    if port.get_element_type().get_type_name() == "bf16":
        return (value.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return value


def _unfaithful(dumping: ExecutedGraph, saved: ExecutedGraph, onnx_names: set[str], tensors: Mapping[str, np.ndarray],
                undumped: Mapping[str, np.ndarray]) -> dict[str, str]:
    """The exposed tensors the dump holds otherwise than the undumped program computes them: those written
    by executed nodes the dumping compile runs otherwise, and model outputs not equal bit for bit."""
    found: dict[str, str] = {}
    for node in dumping.differences(saved, onnx_names):
        for name in node.outputs:
            if name in tensors:
                found[name] = (f"node {node.name} ran as {node.layer_type} in {node.precision} "
                               f"({node.primitive}) only when dumped")
    for name, expected in undumped.items():
        if name in tensors and tensors[name].tobytes() != expected.tobytes():
            found[name] = "model output differs bit for bit from the undumped run"
    return found


def with_original_nodes(graph: ExecutedGraph, onnx_model: onnx.ModelProto, read) -> onnx.ModelProto:
    """The executed graph as ONNX, each node with an `original_nodes` attribute: the ONNX nodes it stands
    for (`openvino_graph.original_nodes`)."""
    mapped = original_nodes(onnx_model.graph, read.get_ordered_ops(), graph)
    saved = graph.to_onnx()
    for node in saved.graph.node:
        node.attribute.append(onnx.helper.make_attribute("original_nodes", mapped.get(node.name, []),
                                                         attr_type=onnx.AttributeProto.STRINGS))
    return saved


def onnx_graph_of(model: Path) -> onnx.ModelProto:
    """The user's graph (no weight read), its nodes named as the rest of accubisect names them."""
    from accubisect.formats.graph_only import graph_only

    graph = graph_only(model)
    name_nodes_uniquely(graph.graph)
    return graph


def _first_line(error: Exception) -> str:
    """OpenVINO's message on one line: which operations failed to convert and the first reason given,
    without the C++ source locations and checks around them."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    failed = [line.removeprefix("-- ") for line in lines if line.startswith("-- Conversion is failed for:")]
    reasons = [line for line in lines if not line.startswith(_FRAMING)]
    text = "; ".join([*failed[:1], *reasons[:1]]) or (lines or [type(error).__name__])[0]
    return text[:300]


_FRAMING = ("Exception from", "Check '", "While validating", "FrontEnd API failed", "Model wasn't", "Summary", "--")
