"""What fusion OpenVINO's CPU plugin lets a user switch, and compiles with those switches.

No property of the CPU plugin turns off a named fusion. Of its documented properties (`SUPPORTED_PROPERTIES`
of openvino 2026.4), one turns a class of fusions off: `SNIPPETS_MODE: DISABLE` un-fuses the snippet
`Subgraph`s (element-wise chains, MHA); `IGNORE_CALLBACK` fuses more, the rest (threads, streams, caches,
dynamic quantization of compressed weights, denormals) fuse nothing on an f32/bf16 model. That is the rule
level. The instance level is a barrier: an extra output on a tensor inside one fused executed node makes
the plugin keep that tensor, which breaks exactly that node's fusion. Every compile is read back, so a
barrier the plugin did not honour (the group still runs as one node) is known, never assumed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from accubisect.runtime.openvino_backend import compiled_on_cpu, exposed_model, read_openvino
from accubisect.runtime.openvino_graph import ExecutedGraph, executed_graph

SWITCHES: Mapping[str, Mapping[str, str]] = {"snippets": {"SNIPPETS_MODE": "DISABLE"}}
SNIPPET_TYPE = "Subgraph"  # the executed node a snippet becomes: what `snippets` switches off


@dataclass(frozen=True)
class Instance:
    """One fused executed node: its OpenVINO layers and the tensor inside it whose exposure breaks it."""

    name: str
    layer_type: str
    layers: tuple[str, ...]
    barrier: str


class FusionCompiler:
    """The model read once, compiled with switches off and barriers added."""

    def __init__(self, model: Path, threads: int) -> None:
        self.core, self.read = read_openvino(model)
        self.model, self.threads = model, threads
        self._outputs = {name for port in self.read.outputs for name in port.get_names()}

    def compile(self, switches_off: Iterable[str] = (), barriers: Iterable[str] = ()):
        """Compiles in f32 (fusion is the question here; the reduced type is precision_bisect's) with each
        switch of `switches_off` set and `barriers` added as outputs."""
        return compiled_on_cpu(self.core, exposed_model(self.read, sorted(barriers), {}), self.model,
                               {"INFERENCE_PRECISION_HINT": "f32", **properties_of(switches_off)}, self.threads)

    def graph(self, compiled) -> ExecutedGraph:
        return executed_graph(self.read, compiled.get_runtime_model())

    def instances(self, compiled) -> list[Instance]:
        """The fused executed nodes of a compile that a barrier can break, in execution order."""
        producers = {op.get_friendly_name(): op for op in self.read.get_ordered_ops()}
        found = []
        for node in self.graph(compiled).nodes:
            barrier = self._inside(node.original_layers, set(node.outputs), producers)
            if len(node.original_layers) > 1 and barrier:
                found.append(Instance(node.name, node.layer_type, node.original_layers, barrier))
        return found

    def _inside(self, layers: tuple[str, ...], outputs: set[str], producers: Mapping[str, object]) -> str:
        """The first tensor a layer of the group writes and another reads, not the node's output: or ""."""
        members = set(layers)
        for layer in layers:
            op = producers.get(layer)
            for port in op.outputs() if op is not None else ():
                names = port.get_names()
                readers = {reader.get_node().get_friendly_name() for reader in port.get_target_inputs()}
                if names and readers & members and not (names & outputs or names & self._outputs):
                    return sorted(names)[0]
        return ""


def properties_of(switches_off: Iterable[str]) -> dict[str, str]:
    """The plugin properties that turn the named switches off."""
    return {key: value for switch in sorted(switches_off) for key, value in SWITCHES[switch].items()}


def unbroken(graph: ExecutedGraph, instances: Iterable[Instance]) -> list[str]:
    """Of `instances`, those some executed node of `graph` still holds whole (their barrier not honoured)."""
    groups = [set(node.original_layers) for node in graph.nodes]
    return [i.name for i in instances if any(set(i.layers) <= group for group in groups)]
