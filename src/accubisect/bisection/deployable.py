"""The deployable precision answer: the user's original model converted to mixed precision, and the answer
settled in its terms (job `precision_deploy`, between the search and the result job).

The search decides per node of the graph precision was assigned on (ORT's compiled graph, or the original
graph). A compiled graph is no deployment format: at level `all` it holds layout ops for this CPU
(NCHWc `ReorderInput`, `*_nchwc` Conv) and ORT-internal ops in the default domain. So the answer is carried
back to the original nodes each compiled node absorbed, and the original model is finalized: portable,
loadable by ORT at any level, checked by `onnx.checker`, and judged by the same accuracy check.

What passes on the compiled graph need not pass, nor be minimal, in the user's graph: a fusion can hide a
node that fails in the low type (ConvBNFusion folds a BatchNorm whose variance overflows fp16 into its Conv's
weights), or make two original nodes one compiled node. So the deployable model's verdict is the answer's:
this job judges the carried answer as model.onnx, converted and run, and as keep_dtype.txt handed to a
compiler that fuses first (`BothRoutes`), after checking that every activation model.onnx stores in the low
type fits the type's range on every sample by its fp32 value (`LowRange`: ORT's CPU kernels compute fp16 in
fp32 behind Casts and never store such a tensor, so neither run shows the inf a device that stores it makes).
When all three pass, it drops each kept node they do not need (1-minimal there); when one fails, it searches
again over the user's nodes with the same strategy. Probes keep their verdicts on disk as the search's do.
The result job then writes result.json, keep_dtype.txt, the page and the summary from this record
(`formats/deployed.py`), so they always describe the published model.

This module is the job; its parts are modules of their own: the probes (`deploy_probes.py`), settling the
answer, 1-minimal or searched again (`deploy_settle.py`), and model.onnx published and verified
(`deploy_publish.py`).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from accubisect.bisection.deploy_probes import BothRoutes, Deployable, low_range, original_low_nodes
from accubisect.bisection.deploy_publish import publish_model
from accubisect.bisection.deploy_settle import Settle, ranked
from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.precision_bisect import NOT_THE_CAUSE, PrecisionProbe
from accubisect.bisection.search import Pace, answer_status
from accubisect.core.errors import PreconditionError
from accubisect.core.onnx_graph import name_nodes_uniquely, nodes_with_protos, subgraph_reads
from accubisect.core.strategy import NOT_AMONG_CANDIDATES
from accubisect.formats.assignment import Assignment
from accubisect.formats.compile_record import Variant
from accubisect.formats.deployed import DeployedRecord
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.model import external_data_files, load_model
from accubisect.formats.search_record import SearchRecord
from accubisect.formats.step import Step
from accubisect.formats.verdict import VerdictStore
from accubisect.runtime.backends import backend_named
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.runtime.finalize import lowered_nodes, store_low_constants
from accubisect.stages.precision_stage import tensor_dtypes


@dataclass(frozen=True)
class DeployStep(Step):
    """The deploy job's files and params (rule `precision_deploy`)."""

    model: Path  # the user's model
    compiled_model: Path  # the graph precision was assigned on, as the search probed it
    search_json: Path  # the search on the graph precision was assigned on
    assignment: Path
    graph_json: Path  # the graph precision was assigned on
    sample_inputs: tuple[Path, ...]
    references: tuple[Path, ...]
    output_names: tuple[str, ...]
    accuracy: Mapping[str, Any]
    backend: str
    variant: Mapping[str, Any]  # the variant precision was assigned on: how the model is verified
    verdicts: Mapping[str, Any]  # this pass's verdict store (`VerdictStore.to_json`)
    search_verdicts: Mapping[str, Any]  # the search's: a configuration of compiled nodes it already judged
    bisect: Mapping[str, Any]  # config `bisect`: parallel and budgets
    threads: int
    deployed_json: Path
    finalized_model: Path
    finalized_data: Path  # model.onnx's weights, beside it
    finalize_json: Path


def deploy_answer(step: DeployStep) -> None:
    """Deploy job: the search's answer settled in the user's model (verified, made 1-minimal, or searched
    again there), the mixed-precision model made of it, checked and judged, and deployed.json."""
    found = SearchRecord.read(step.search_json)
    if found.status == NOT_AMONG_CANDIDATES:
        raise PreconditionError(NOT_THE_CAUSE)
    answer_status(found, "node")  # a budget that ran out before anything passed: its one line
    assignment, graph = Assignment.read(step.assignment), GraphRecord.read(step.graph_json)
    with tempfile.TemporaryDirectory(prefix=".weights.", suffix=".part", dir=step.deployed_json.parent) as folder:
        routes = both_routes(step, assignment, graph, Path(folder))
        carried = routes.carried(graph, set(assignment.reduced) - set(found.culprits), found.culprits)
        settle = Settle(routes, VerdictStore.from_json(step.verdicts), Pace.from_config(step.bisect, step.threads))
        settled = settle.run(carried, found, ranked(routes, found, graph, carried))
        model = publish_model(step, routes.deployable, settled.keep, assignment)
    op_types = {**{node.name: node.op_type for node in graph.nodes},
                **{node.name: proto.op_type for node, proto in nodes_with_protos(routes.deployable.model.graph)}}
    DeployedRecord(routes.candidates, tuple(c for c in routes.candidates if c in carried),
                   settled.carried_verdict, settled.how, settled.keep, settled.verdict, settled.probes,
                   settled.minimal, settled.stopped_by,
                   tuple(mixlist_suggestion(settled.keep, routes.candidates, op_types)), model
                   ).write(step.deployed_json)


def both_routes(step: DeployStep, assignment: Assignment, graph: GraphRecord, folder: Path) -> BothRoutes:
    """The user's model, every node named, with the nodes the converter lowers as candidates, and the search's
    probe of the compiled graph, judging on the same samples. The deployable model reads its weights from
    `folder`, the job's scratch folder: the user's data file(s) linked there, and beside them the constants
    any configuration converts, converted once."""
    original, runtime = load_model(step.model, load_weights=False), backend_named(step.backend)
    name_nodes_uniquely(original.graph)  # the deployable model must load: ORT refuses repeated node names
    dtypes = tensor_dtypes(original, step.sample_inputs[0], runtime, step.threads, step.model.parent)
    control_flow = {node.name for node, proto in nodes_with_protos(original.graph) if subgraph_reads(proto)}
    reduced = set(assignment.reduced)
    lowered = lowered_nodes(original, original_low_nodes(graph, reduced) - control_flow, assignment.dtype, dtypes)
    judge = SampleJudge.load(step.sample_inputs, step.references, step.output_names, step.accuracy)
    options = compile_options(Variant.from_json(step.variant), installed_catalogue())
    _link_data_files(original, step.model, folder)
    stored = store_low_constants(original, set(lowered), assignment.dtype, dtypes, step.model.parent,
                                 folder / f"{step.model.name}.{assignment.dtype}.data")
    deployable = Deployable(original, tuple(lowered), assignment.dtype, dtypes, judge, runtime, options,
                            step.model.parent, stored, folder)
    compiled = PrecisionProbe.of(step.compiled_model, assignment, judge, runtime)
    compiled_only = tuple(node.name for node in graph.nodes
                          if node.name in reduced and not set(lowered) & set(node.original_nodes))
    ranges = low_range(original, lowered, assignment.dtype, dtypes, judge, runtime, step.threads, step.model.parent)
    return BothRoutes(deployable, compiled, graph.nodes, VerdictStore.from_json(step.search_verdicts),
                      deployable.candidates + compiled_only, ranges)


def mixlist_suggestion(kept_fp32: Sequence[str], reduced: Sequence[str], op_types: Mapping[str, str]) -> list[str]:
    """Op types better moved to the black list as a whole: at least two reduced nodes of the type, and
    every one of them must be kept in fp32 anyway."""
    needed, present = Counter(op_types[c] for c in kept_fp32), Counter(op_types[r] for r in reduced)
    return sorted(t for t, count in needed.items() if count >= 2 and count == present[t])


def _link_data_files(model: onnx.ModelProto, path: Path, folder: Path) -> None:
    """The data files of `model`, read without its weights from `path`, linked into `folder` under the locations
    it gives them: ORT reads the external data of a graph handed over as bytes from one folder. Symbolic links:
    onnx's own reader refuses a data file with a second hard link, and ORT, which refuses links that leave the
    folder, is handed the files mapped (`ort_compile`) and never opens them."""
    for data in external_data_files(model, path):
        linked = folder / data.relative_to(path.parent)
        linked.parent.mkdir(parents=True, exist_ok=True)
        linked.symlink_to(data.resolve())
