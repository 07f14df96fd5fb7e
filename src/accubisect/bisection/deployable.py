"""The deployable precision answer: the user's original model converted to mixed precision.

The search decides per node of the graph precision was assigned on (ORT's compiled graph, or the original
graph). A compiled graph is no deployment format: at level `all` it holds layout ops for this CPU
(NCHWc `ReorderInput`, `*_nchwc` Conv) and ORT-internal ops in the default domain. So the answer is carried
back to the original nodes each compiled node absorbed, and the original model is finalized: portable,
loadable by ORT at any level, checked by `onnx.checker`, and judged by the same accuracy check.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from accubisect.bisection.judging import SampleJudge
from accubisect.core.errors import FinalizeError, ModelError
from accubisect.core.onnx_graph import name_nodes_uniquely, nodes_with_protos, subgraph_reads
from accubisect.formats.assignment import Assignment
from accubisect.formats.files import atomic_path, read_json, write_atomic, write_json
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.model import load_model
from accubisect.formats.step import Step
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend, backend_named
from accubisect.runtime.catalogue import installed_catalogue
from accubisect.runtime.finalize import finalize, lowered_nodes
from accubisect.stages.compile_stage import Variant
from accubisect.stages.precision_stage import tensor_dtypes

log = logging.getLogger(__name__)
_NODE_IN_MESSAGE = re.compile(r"node name: ([^)\s,]+)|in node \(([^)]+)\)|Node \(([^)]+)\)")


def original_low_nodes(graph: GraphRecord, reduced: set[str]) -> set[str]:
    """Original nodes whose computation runs reduced: absorbed by a reduced compiled node and by no
    compiled node that stays fp32 (fp32 wins where a layout or glue node shares an original node)."""
    low: set[str] = set()
    fp32: set[str] = set()
    for node in graph.nodes:
        (low if node.name in reduced else fp32).update(node.original_nodes)
    return low - fp32


@dataclass(frozen=True)
class FinalizeStep(Step):
    """The finalize job's files and params (rule `finalize_precision`)."""

    model: Path  # the user's model
    result_json: Path  # the published answer
    assignment: Path
    graph_json: Path  # the graph precision was assigned on
    sample_inputs: tuple[Path, ...]
    references: tuple[Path, ...]
    output_names: tuple[str, ...]
    accuracy: Mapping[str, Any]
    backend: str
    variant: Mapping[str, Any]  # the variant precision was assigned on: how the model is verified
    finalized_model: Path
    finalize_json: Path
    finalize_summary: Path


def finalize_answer(step: FinalizeStep) -> None:
    """Finalize job: the original model with the answer's nodes in fp32 and the rest reduced, checked and
    judged, with a record of how it was verified."""
    assignment, result = Assignment.read(step.assignment), read_json(step.result_json)
    reduced = set(assignment.reduced) - set(result["culprits"])  # the culprits are kept in fp32
    original = load_model(step.model)
    name_nodes_uniquely(original.graph)  # the deployable model must load: ORT refuses repeated node names
    runtime = backend_named(step.backend)
    dtypes = tensor_dtypes(original, step.sample_inputs[0], runtime)
    control_flow = {node.name for node, proto in nodes_with_protos(original.graph) if subgraph_reads(proto)}
    low = original_low_nodes(GraphRecord.read(step.graph_json), reduced) - control_flow
    dtype = assignment.dtype
    final = finalize(original, low, dtype, dtypes)
    _check(final, original, step.model)
    with atomic_path(step.finalized_model) as temporary:
        onnx.save(final, temporary)
    record = {"model": step.model.name, "dtype": dtype, "graph": assignment.graph,
              "reduced_original_nodes": len(lowered_nodes(original, low, dtype, dtypes)),
              "original_nodes": len(original.graph.node),
              **verify(final, dtype, Variant.from_json(step.variant), step.sample_inputs, step.references,
                        step.output_names, step.accuracy, runtime)}
    write_json(step.finalize_json, record)
    write_atomic(step.finalize_summary, render_summary(record))


def _check(final: onnx.ModelProto, original: onnx.ModelProto, path: Path) -> None:
    """`onnx.checker`, with full type and shape inference where the user's model itself passes it
    (exporters write models that do not)."""
    try:
        onnx.checker.check_model(final, full_check=_passes_full_check(original))
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise FinalizeError(_failure(f"{path}: the mixed-precision model fails onnx.checker", error, final)) from None


def _passes_full_check(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def verify(final: onnx.ModelProto, dtype: str, variant: Variant, sample_inputs: Sequence[str | Path],
            references: Sequence[str | Path], output_names: Sequence[str], accuracy: Mapping[str, Any],
            backend: Backend) -> dict[str, Any]:
    """Loaded and run by ORT compiled as the variant precision was assigned on; ORT's CPU provider has no
    bf16 kernels, so there a bf16 model is only checked."""
    if dtype == "bf16" and backend.provider == "CPUExecutionProvider":
        return {"checked": "onnx.checker only: ONNX Runtime's CPU provider has no bf16 kernels"}
    options = variant.options(installed_catalogue())
    try:
        runner = ort_compile.Runner(final.SerializeToString(), options, backend).activate()
        judged = SampleJudge.load(sample_inputs, references, output_names, accuracy).judge(runner, stop_early=False)
    except ModelError as error:  # ORT refused to load or to run it
        raise FinalizeError(_failure("the mixed-precision model fails in ONNX Runtime", error, final)) from None
    return {"checked": f"loaded and run by ONNX Runtime on {backend.provider} at level {variant.level}",
            "passed": judged["passed"], "worst": judged["worst"]}


def _failure(what: str, error: Exception, model: onnx.ModelProto) -> str:
    """One line: what failed, the node and op type the message names, and what to do."""
    text = " ".join(str(error).split())
    found = _NODE_IN_MESSAGE.search(text)
    node = next((group for group in found.groups() if group), None) if found else None
    op_types = {proto.name: proto.op_type for proto in model.graph.node}
    where = f" at node '{node}' ({op_types[node]})" if node in op_types else ""
    return (f"{what}{where}: {text[:300]}. keep_dtype.txt and result.json are published; add the node to "
            "precision.keep_dtype, or report it, then rerun only this step: snakemake precision_finalize")


def render_summary(record: Mapping[str, Any]) -> str:
    verdict = f", {'passes' if record['passed'] else 'FAILS'} the check" if "passed" in record else ""
    return (f"model.onnx: your model with {record['reduced_original_nodes']} of {record['original_nodes']} nodes "
            f"in {record['dtype']}, {record['checked']}{verdict}\n")
