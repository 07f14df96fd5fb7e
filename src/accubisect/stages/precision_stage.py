"""The precision stage: which compiled nodes run reduced, and the reduced model.

Precision is assigned to the fusion-on compiled graph (fuse first, then lower precision, as real
compilers do). The reduced model is that graph as the backend runs reduced nodes: with their tensors
rounded on the CPU (`emulate.py`), finalized to real fp16/bf16 on a GPU (`finalize.py`). Each node's
local error, in this reduced configuration or fusion's, is the local-error stage's (`local_error.py`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from accubisect.core.onnx_graph import nodes_with_protos, subgraph_reads
from accubisect.core.precision import list_of, reduced_nodes, resolve_keep_dtype
from accubisect.formats.assignment import Assignment
from accubisect.formats.config_sections import PrecisionSection
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.mixlist import load_mixlist
from accubisect.formats.model import load_compiled, save_referencing
from accubisect.formats.samples import npz_signature
from accubisect.formats.step import Step
from accubisect.runtime.backends import Backend, backend_named
from accubisect.runtime.op_schema import known_op_types
from accubisect.runtime.ort_exposed import exposed_types

log = logging.getLogger(__name__)


def tensor_dtypes(compiled: onnx.ModelProto, sample_inputs: Path, backend: Backend,
                  threads: int | None = None, weights: Path | None = None) -> dict[str, str]:
    """The dtype of every tensor, as ONNX Runtime types the graph it builds: declared types in optimized
    graphs are incomplete, and one run exposing every tensor held them all at once (806 MiB on a 640×640
    detector, 32× its largest tensor pair). `weights`: the folder of `compiled`'s external data, when it was
    read without its weights."""
    names = [out for node in compiled.graph.node for out in node.output if out]
    inputs = {name: str(dtype) for name, (dtype, _) in npz_signature(sample_inputs).items()}
    constants = {init.name: onnx.helper.tensor_dtype_to_np_dtype(init.data_type) for init in compiled.graph.initializer}
    return {**{k: str(np.dtype(v)) for k, v in constants.items()}, **inputs,
            **exposed_types(compiled, names, backend, threads, weights)}


@dataclass(frozen=True)
class AssignStep(Step):
    compiled_model: Path  # the graph precision is assigned on
    graph_json: Path  # its graph record
    sample_inputs: Path  # one sample: ORT types the graph's tensors from its inputs
    precision: PrecisionSection
    backend: str
    assignment: Path
    reduced_model: Path
    threads: int | None = None  # ORT's intra-op pool: the job's


def assign_precision(step: AssignStep) -> None:
    """Precision stage: the reduced nodes under the configured mode, and the model as the backend runs
    them (emulated on the CPU, finalized for native fp16/bf16). The compiled graph is read without its
    weights: the reduced model references the compiled copy's data file (`save_referencing`), and the
    emulation rounds constants by Casts in the graph, so no weight is copied whatever the model's size."""
    precision = step.precision
    compiled, weights = load_compiled(step.compiled_model, load_weights=False), step.compiled_model.parent
    graph = GraphRecord.read(step.graph_json)
    runtime = backend_named(step.backend)
    dtypes = tensor_dtypes(compiled, step.sample_inputs, runtime, step.threads, weights)
    lists = load_mixlist(precision["modify_mixlist"], known_op_types())
    ignored = precision["mode"] == "must_keep_origin_dtype"  # as in the seeds, keep_dtype has no effect there
    keep = set() if ignored else resolve_keep_dtype(precision["keep_dtype"], graph.nodes)
    control_flow = {node.name for node, proto in nodes_with_protos(compiled.graph) if subgraph_reads(proto)}
    reduced = tuple(name for name in reduced_nodes(graph.nodes, dtypes, precision["mode"], lists, keep,
                                                   precision["no_fp32_ops"])
                    if name not in control_flow)  # If/Loop bodies are graphs of their own: they stay fp32
    log.info("%s in %s: %d of %d nodes reduced", precision["mode"], precision["dtype"], len(reduced),
             len(graph.nodes))
    Assignment(precision["mode"], precision["dtype"], precision["graph"], reduced, tuple(sorted(keep)),
               tuple(sorted(control_flow)), {node.name: list_of(lists, node.op_type) for node in graph.nodes},
               dtypes).write(step.assignment)
    save_referencing(runtime.reduced_model(compiled, set(reduced), precision["dtype"], dtypes, weights),
                     step.reduced_model, weights)
