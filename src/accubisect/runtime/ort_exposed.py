"""Running an ONNX Runtime graph with chosen tensors exposed as graph outputs (the dump's run, the probes'
tensor reads): the ORT half of the backend contract's `run_exposed`.

A graph output added to an optimized graph run with optimizations off exposes exactly the tensor the
compiled program computes. ONNX Runtime's Python API returns no tensor of a type numpy lacks; such a
tensor is read through a widening Cast.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from accubisect.runtime import ort_compile

if TYPE_CHECKING:  # OrtBackend.run_exposed calls this module: only its type is needed here
    from accubisect.runtime.backends import OrtBackend


def expose_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs are exactly `names` (plus its own outputs)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {value.name for value in exposed.graph.output}
    for name in names:
        if name not in present:
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return exposed


def run_exposed(compiled: onnx.ModelProto, names: Iterable[str], feeds: dict[str, np.ndarray], backend: OrtBackend,
                threads: int | None = None,
                weights: Path | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Runs `compiled` with `names` (and its own outputs) as outputs: {name: array}, and {name: element type}
    for every tensor read widened. ONNX Runtime's Python API returns no tensor of a type numpy lacks
    (bfloat16, float8, int4: "No corresponding Numpy type"); such a tensor is read through an added Cast to
    a type that holds each of its values exactly (float32, int8, uint8). ORT runs at most `threads`
    threads (None: its default); `weights` is the folder of `compiled`'s external data, when it was read
    without its weights (`ort_compile.unoptimized`)."""
    names = list(dict.fromkeys(names))
    exposed = ExposedSession(compiled, [name for name in names if name not in feeds], backend, threads, weights)
    tensors = exposed.infer(feeds)
    tensors.update({k: v for k, v in feeds.items() if k in names})
    return tensors, exposed.widened


class ExposedSession:
    """One session of `compiled` with `names` (and its own outputs) as outputs, widened as `run_exposed` says,
    built once and run on as many samples as a caller has. A run returns only the outputs asked for, but ORT
    holds every output the session exposes until the run ends: a caller that reads the tensors batch by batch
    builds a session per batch (`tensor_ranges`), not one exposing them all."""

    def __init__(self, compiled: onnx.ModelProto, names: Iterable[str], backend: OrtBackend,
                 threads: int | None = None, weights: Path | None = None):
        exposed = expose_outputs(compiled, names)
        self._session = _session(exposed, backend, threads, weights)
        narrow = {name: held for name, held in self._session.output_types().items() if held in WIDENED}
        self._aliases: dict[str, str] = {}
        if narrow:  # a second session: ORT types the exposed tensors only when it builds one
            exposed, self._aliases = widen_outputs(exposed, narrow)
            self._session = _session(exposed, backend, threads, weights)
        self.widened = {name: _element_type(held) for name, held in narrow.items()}  # name -> its own type

    def infer(self, feeds: Mapping[str, np.ndarray], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """{name: array} of `names` (every output when None), each under its own name, widened ones too."""
        asked = None if names is None else [self._aliases.get(name, name) for name in dict.fromkeys(names)]
        own = {alias: name for name, alias in self._aliases.items()}
        return {own.get(k, k): v for k, v in self._session.infer(dict(feeds), asked).items()}


def exposed_types(compiled: onnx.ModelProto, names: Iterable[str], backend: OrtBackend,
                  threads: int | None = None, weights: Path | None = None) -> dict[str, str]:
    """The element type of each named tensor as ONNX Runtime types it when it builds a session exposing
    them all (`bfloat16` and the like by name). Nothing runs: a run would hold every tensor at once.
    `weights`: the folder of `compiled`'s external data, when it was read without its weights."""
    session = _session(expose_outputs(compiled, list(dict.fromkeys(names))), backend, threads, weights)
    return {name: _element_type(held) for name, held in session.output_types().items()}


# ONNX Runtime's names of the element types numpy lacks -> the type a Cast widens them to, exactly
WIDENED = {
    **{f"tensor({name})": onnx.TensorProto.FLOAT for name in (
        "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0", "float4e2m1")},
    "tensor(int4)": onnx.TensorProto.INT8, "tensor(uint4)": onnx.TensorProto.UINT8,
}


def widen_outputs(exposed: onnx.ModelProto, narrow: Mapping[str, str]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of `exposed` whose outputs named in `narrow` (name -> ONNX Runtime type) are replaced by
    widening Casts of them, and {name: the Cast's output}."""
    widened = onnx.ModelProto()
    widened.CopyFrom(exposed)
    graph = widened.graph
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    taken |= {value.name for value in (*graph.input, *graph.output)} | {init.name for init in graph.initializer}
    aliases: dict[str, str] = {}
    for name, held in narrow.items():
        alias = f"{name}/widened"
        while alias in taken:
            alias += "_"
        taken.add(alias)
        aliases[name] = alias
        graph.node.append(onnx.helper.make_node("Cast", [name], [alias], to=WIDENED[held], name=f"{alias}/cast"))
    outputs = [onnx.ValueInfoProto(name=aliases[value.name]) if value.name in aliases else value
               for value in graph.output]
    del graph.output[:]
    graph.output.extend(outputs)
    return widened, aliases


def _element_type(held: str) -> str:
    """ONNX Runtime's `tensor(bfloat16)` as the numpy name the rest of accubisect uses (`bfloat16`)."""
    enum = onnx.TensorProto.DataType.Value(held.removeprefix("tensor(").removesuffix(")").upper())
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(enum)))


def _session(model: onnx.ModelProto, backend: OrtBackend, threads: int | None,
             weights: Path | None = None) -> ort_compile.Runner:
    return ort_compile.Runner(model.SerializeToString(), ort_compile.unoptimized(weights), backend, threads).activate()
