"""Nodes kept in fp32 on OpenVINO's CPU plugin: IR `precise` marks, verified by reading back what ran.

The plugin ignores rt_info set from Python, but reads a `precise` attribute in a layer's rt_info from an IR:
so the model is serialised to IR once, into a temporary folder held as long as the IR (the xml kept as text,
the weights left in its `.bin`, which OpenVINO maps: held in memory, they were a second copy of the model
beside the compiled one), and a keep set is that xml with the marks, read back with the same `.bin` and
compiled with the reduced type's hint. The plugin drops marks on nodes its fusions rebuild (a
BatchNormalization folded into its Convolution, a MatMul made a FullyConnected), silently: every compile is
therefore checked, and a kept executed node holds only when every node the marked compile runs for its
original operations computes in f32.

A mark is not copied to a node a fusion builds (OpenVINO's `precise` attribute is not copyable), so marking an
executed node's `originalLayersNames` misses what matters: those names are the nodes the plugin built while
compiling (`Multiply_19896` for a Convolution with a BatchNormalization folded in), which no IR holds, while
the Convolution the fold started from is named nowhere. The mark therefore goes on the unit the executed node
stands for: every IR layer of every ONNX node the graph map gives it (`marked_layers`). Measured (openvino
2026.4.1, bf16): on ppocr_rec that keeps 15 depthwise Convolution groups whose marks were dropped before
(51 -> 36 not keepable); marking the executed producers or consumers as well keeps none of the rest.
"""

from __future__ import annotations

import shutil
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from accubisect.runtime.openvino_backend import compiled_on_cpu, read_openvino
from accubisect.runtime.openvino_graph import LAYOUT_TYPES, ExecutedGraph, onnx_nodes_of, rt_text
from accubisect.runtime.openvino_pages import pages_released

REDUCED_PRECISIONS = frozenset({"bf16", "f16"})
PRECISE = {"name": "precise", "version": "0"}
UNMARKED = frozenset({"Constant", "Parameter", "Result"})  # IR operations that compute nothing of a sample


@dataclass(frozen=True)
class Kept:
    """The result of compiling a keep set: the compiled model, and of the kept executed nodes those whose
    marks the plugin dropped (some node of theirs still runs in the reduced type)."""

    compiled: object
    dropped: tuple[str, ...]


class MarkedIR:
    """A model as OpenVINO IR, compiled with chosen layers marked `precise`."""

    def __init__(self, model: Path) -> None:
        import openvino as ov

        self.core, read = read_openvino(model)
        self.model = model  # what a compile that fails names
        self._folder = tempfile.TemporaryDirectory(prefix="accubisect-ir-")
        self.bin = Path(self._folder.name, "model.bin")
        with pages_released():  # serialising reads every weight through the model's mapping
            ov.save_model(read, str(self.bin.with_suffix(".xml")), compress_to_fp16=False)
        self.xml = self.bin.with_suffix(".xml").read_text()

    def read(self, layers: Iterable[str] = ()):
        """The IR as an `ov.Model`, `layers` marked, its weights mapped from the `.bin`."""
        xml = Path(self._folder.name, "marked.xml")
        xml.write_text(self.marked(layers))
        return self.core.read_model(str(xml), str(self.bin))

    def marked(self, layers: Iterable[str]) -> str:
        """The IR's xml with each layer named in `layers` marked `precise`."""
        wanted = set(layers)
        root = ET.fromstring(self.xml)
        for layer in root.iter("layer"):
            if layer.get("name") in wanted:
                info = layer.find("rt_info")
                if info is None:
                    info = ET.SubElement(layer, "rt_info")
                ET.SubElement(info, "attribute", PRECISE)
        return ET.tostring(root, encoding="unicode")

    def compile(self, kept: Mapping[str, tuple[str, ...]], hint: str, threads: int | None = None) -> Kept:
        """Compiles the model with the layers of the executed nodes `kept` ({node: its OpenVINO layers})
        marked, under `hint`, and says which of them the plugin did not keep in f32."""
        model = self.read(layer for layers in kept.values() for layer in layers)
        compiled = compiled_on_cpu(self.core, model, self.model, {"INFERENCE_PRECISION_HINT": hint}, threads)
        return Kept(compiled, dropped(compiled.get_runtime_model(), kept))

    def save(self, layers: Iterable[str], folder: Path) -> tuple[Path, Path]:
        """Writes the IR with `layers` marked: `model.xml` and its weights `model.bin`."""
        xml, weights = folder / "model.xml", folder / "model.bin"
        xml.write_text(self.marked(layers))
        shutil.copyfile(self.bin, weights)  # file to file: the weights never pass through this process's memory
        return xml, weights


def dropped(runtime, kept: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Of the executed nodes `kept` ({node: its OpenVINO layers}), those some node of `runtime` (a compiled
    model's runtime graph) still runs in a reduced type for; a node with no layer cannot be marked at all."""
    reduced_layers = {layer for op in runtime.get_ordered_ops()
                      if rt_text(op, "runtimePrecision") in REDUCED_PRECISIONS
                      and rt_text(op, "layerType") not in LAYOUT_TYPES
                      for layer in rt_text(op, "originalLayersNames").split(",")}
    return tuple(name for name, layers in kept.items() if not layers or reduced_layers & set(layers))


def marked_layers(ops: Sequence, onnx_graph, graph: ExecutedGraph,
                  mapped: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, ...]]:
    """Executed node -> the IR layers (of `ops`, the model as read) a mark must go on to keep it in f32: those
    of every ONNX node of `onnx_graph` it stands for (`mapped`, the graph map), and of its `originalLayersNames`
    those the IR holds. Constants, inputs and outputs compute nothing and are never marked."""
    computing = {op.get_friendly_name() for op in ops if op.get_type_name() not in UNMARKED}
    of_onnx: dict[str, set[str]] = {}
    for layer, onnx_node in onnx_nodes_of(ops, onnx_graph).items():
        of_onnx.setdefault(onnx_node, set()).add(layer)
    return {node.name: tuple(sorted(computing & {*node.original_layers, *(
        layer for onnx_node in mapped.get(node.name, ()) for layer in of_onnx.get(onnx_node, ()))}))
        for node in graph.nodes}


def reduced_nodes(graph: ExecutedGraph) -> list[str]:
    """The executed nodes that compute in a reduced type, in execution order: the candidates to keep."""
    return [node.name for node in graph.nodes
            if node.precision in REDUCED_PRECISIONS and node.layer_type not in LAYOUT_TYPES]
