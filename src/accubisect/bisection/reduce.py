"""`snakemake reduce`: the smallest subgraph of the original model that still fails the check on its own.

The candidate is the fusion comparison's (the fusion-on variant) or, with `reduce.bisection: precision`,
the precision comparison's (the precision stage's nodes in fp16/bf16). A probe (`reduce_probe.py`) is a
subgraph of the original model compiled as that candidate was compiled and fed with the reference's own
tensors (fusion off, fp32); it shows the bug when it fails the run's tolerances and passes with the
bisection's answer applied: an intermediate tensor can miss a tolerance meant for the model's outputs (fp16
rounds every tensor) without being what the answer fixes. The search bisects the node order twice, each
side a search under the one driver (`reduce_search.py`, its strategy `core.shrink.next_cut`):

1. outputs side: the earliest cut whose prefix shows the bug, its outputs every tensor crossing the cut
   (the first divergence of the comparison is probed first);
2. inputs side: the failing outputs of that cut only (all of its outputs where those alone pass from the
   first node they need), and the latest start from which they still show it when what comes before is
   read from the reference (the node with the largest local error is probed first).

Each probe's verdict is a file in the workspace (`reduce_probe`, `formats.verdict.VerdictStore`), so a rerun goes
on from those on disk. The job writes the subgraph (model.onnx), its boundary per sample (inputs/), the
reference's outputs (expected/), how the candidate compiles (candidate.json) and repro.py, then runs
repro.py twice: it must fail as written and pass with the bisection's answer applied, or the job refuses.
reduce.json names the repro's reference tensors (inputs, expected outputs, constants) read from the dumps
and those computed because a dump does not hold them (filtered, statistics only).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from accubisect.bisection.deploy_probes import original_low_nodes
from accubisect.bisection.driver import drive
from accubisect.bisection.reduce_probe import Candidate, Cut, CutProber, ReferenceValues, failing_outputs
from accubisect.bisection.reduce_search import InputsSide, OutputsSide
from accubisect.bisection.repro_script import REPRO
from accubisect.bisection.search import Pace, listed
from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import PreconditionError, ReduceError
from accubisect.core.onnx_graph import nodes_with_protos, subgraph_reads
from accubisect.core.subgraph import Graph
from accubisect.formats.assignment import Assignment
from accubisect.formats.candidate_spec import CandidateSpec, LowPrecision
from accubisect.formats.compare_report import CompareReport
from accubisect.formats.compile_record import Variant
from accubisect.formats.files import atomic_path, write_atomic
from accubisect.formats.fusion_switch import load_fusion_switch
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.model import load_model
from accubisect.formats.reduce_record import ReduceProbe, ReduceRecord, ReproRun
from accubisect.formats.step import Step
from accubisect.formats.verdict import VerdictStore
from accubisect.reports.run_context import with_context
from accubisect.runtime.backends import Backend, backend_named
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.stages.precision_stage import tensor_dtypes

log = logging.getLogger("accubisect")
FLAGS = {"fusion": "--fusion-switch", "precision": "--keep-dtype"}


@dataclass(frozen=True)
class ReduceStep(Step):
    """The reduce job's files and params (rule `reduce_search`)."""

    bisection: str  # fusion | precision
    model: Path  # the user's model
    compare_report: Path  # the comparison of the candidate the repro is cut from
    sample_inputs: tuple[Path, ...]
    sample_names: tuple[str, ...]  # what inputs/ and expected/ call each sample
    reference_dumps: tuple[Path, ...]  # per sample, the fusion-off fp32 dump
    answer: Path  # fusion_switch.cfg or keep_dtype.txt: what must make the repro pass
    verdicts: Mapping[str, Any]  # the verdict store (`VerdictStore.to_json`)
    variant: Mapping[str, Any]  # how the candidate compiles (`Variant.to_json`)
    accuracy: Mapping[str, Any]
    backend: str
    repro_model: Path
    repro_inputs: tuple[Path, ...]  # per sample, inputs/<sample>.npz
    expected_outputs: tuple[Path, ...]  # per sample, expected/<sample>.npz
    candidate_json: Path
    repro: Path
    reduce_json: Path
    summary: Path
    context: Mapping[str, Any]  # the summary's first line (`run_context.LINE_FIELDS`)
    threads: int | None = None
    assignment: Path | None = None  # precision: the precision stage's assignment.json
    graph_json: Path | None = None  # precision: the graph precision was assigned on


def search(prober: CutProber, store: VerdictStore, divergence: int | None,
           local_start: Callable[[Sequence[int]], int | None], threads: int) -> tuple[Cut, list[ReduceProbe]]:
    """The two sides (the module's docstring), each a search under the one driver: the cut the inputs side
    finds, and every step of both, each cut once (an inputs side's known end can be the cut the outputs side
    found: all its outputs, from the first node they need), so that a step from disk is one a run before judged."""
    outputs_side = OutputsSide.of(prober, store, divergence, threads)
    ended = drive(outputs_side, store, Pace(1, threads))
    end = outputs_side.found(ended)
    steps = outputs_side.steps(ended)
    end_verdict = store.read(end.config(prober.graph))
    failing = failing_outputs(end, end_verdict)
    inputs_side = InputsSide.of(prober, store, failing, local_start, threads)
    if inputs_side.nothing_off_passes():  # its other outputs kept a fusion from forming: keep them all
        log.info("%s: the failing output(s) %s pass when output alone; searching with all %d output(s) of the cut "
                 "found", inputs_side.name, listed(failing), len(end.outputs))
        steps.append(inputs_side.known_step())
        inputs_side = InputsSide.of(prober, store, end.outputs, local_start, threads)
    started = drive(inputs_side, store, Pace(1, threads))
    once: dict[str, ReduceProbe] = {}
    for step in [*steps, *inputs_side.steps(started)]:
        once.setdefault(step.key, step)
    return inputs_side.found(started), list(once.values())


def divergence_position(report: CompareReport, graph: Graph) -> int | None:
    """Where the comparison's first divergence is in the original's order (its tensor survives fusion at a
    fused node's boundary); None where the original has no such tensor."""
    divergence = report.first_divergence
    return graph.producer.get(divergence.tensor) if divergence else None


def local_hint(report: CompareReport, graph: Graph) -> Callable[[Sequence[int]], int | None]:
    """Given the positions a cut's outputs need: the index of the earliest original node of the compiled
    node with the largest local error among them (the start probed first), or None."""
    position = {node.name: node.index for node in graph.nodes}

    def hint(needed: Sequence[int]) -> int | None:
        rows = [row for row in report.tensors if row.local and row.local.get("rel_euclidean") is not None]
        ranked = sorted(rows, key=lambda row: -row.local["rel_euclidean"])
        for row in ranked:
            starts = [position[name] for name in (row.original_nodes or (row.node,)) if name in position]
            inside = [needed.index(p) for p in starts if p in needed]
            if inside:
                return min(inside)
        return None

    return hint


def reduce(step: ReduceStep) -> None:
    """Reduce job: the search, the repro's files, and the repro run as written and with the answer."""
    started = time.monotonic()
    if step.bisection not in FLAGS:
        raise ReduceError(f"reduce.bisection {step.bisection!r}: choose fusion or precision")
    original = load_model(step.model)
    for node, proto in nodes_with_protos(original.graph):
        proto.name = node.name  # every node named as the graph JSON and the dumps name it
    graph = Graph(original)
    runtime = backend_named(step.backend)
    candidate = make_candidate(step, original, runtime)
    samples = list(step.sample_names)
    reference = ReferenceValues(original, step.reference_dumps, step.sample_inputs, runtime, step.threads)
    check = AccuracyCheck.from_config(step.accuracy)
    report = CompareReport.read(step.compare_report)
    if report.passed:
        raise PreconditionError(f"the candidate passes the accuracy check ({check.describe()}) in its comparison "
                                f"({step.compare_report}): nothing to reduce")
    prober = CutProber(graph, reference, candidate, check, samples)
    found, steps = search(prober, VerdictStore.from_json(step.verdicts), divergence_position(report, graph),
                          local_hint(report, graph), step.threads or 1)
    model, feeds, expected = prober.model(found)
    write_files(step, model, feeds, expected, candidate_spec(step, candidate, prober.check, model, samples))
    as_written, with_answer = verify(step)
    constants = set(graph.boundary(found.positions)) - set(feeds[0])
    repro_tensors = {*feeds[0], *found.outputs, *constants}  # not every probe's: a rerun from disk reads only these
    record = ReduceRecord(
        step.bisection, str(step.model), len(graph), tuple(graph.nodes[p].name for p in found.positions),
        found.outputs, tuple(feeds[0]), tuple(sorted(constants)),
        tuple(sorted(reference.computed & repro_tensors)), tuple(sorted(reference.from_dump & repro_tensors)),
        report.first_divergence.tensor if report.first_divergence else None, tuple(steps), as_written,
        with_answer, round(time.monotonic() - started, 3))
    record.write(step.reduce_json)
    write_atomic(step.summary, with_context(step.context, render_summary(record)))
    log.info("%s", render_summary(record).strip())


def make_candidate(step: ReduceStep, original: onnx.ModelProto, runtime: Backend) -> Candidate:
    variant = Variant.from_json(step.variant)
    if step.bisection == "fusion":
        return Candidate(variant, runtime, step.threads, load_fusion_switch(step.answer, installed_catalogue()))
    if step.assignment is None or step.graph_json is None:
        raise ReduceError("reduce.bisection precision: the rule gives no assignment.json or graph JSON")
    assignment = Assignment.read(step.assignment)
    control_flow = {proto.name for proto in original.graph.node if subgraph_reads(proto)}
    low = original_low_nodes(GraphRecord.read(step.graph_json), set(assignment.reduced)) - control_flow
    dtypes = tensor_dtypes(original, step.sample_inputs[0], runtime, step.threads)
    kept_fp32 = frozenset(line.strip() for line in step.answer.read_text().splitlines() if line.strip())
    return Candidate(variant, runtime, step.threads, low=frozenset(low), kept_fp32=kept_fp32, dtype=assignment.dtype,
                     dtypes=dtypes)


def candidate_spec(step: ReduceStep, candidate: Candidate, check: AccuracyCheck, model: onnx.ModelProto,
                   samples: Sequence[str]) -> CandidateSpec:
    """candidate.json: what repro.py needs to compile and judge the subgraph as the candidate, the probes'
    check included (`check.to_config()`), so that repro.py judges as the probes did."""
    catalogue = installed_catalogue()
    variant = candidate.variant
    rules = {rule: {"section": catalogue.section_of(rule), "optimizers": sorted(catalogue.ort_names({rule}))}
             for rule in catalogue.rules()}
    return CandidateSpec(step.bisection, variant.level, dict(sorted(variant.session_config.items())),
                         tuple(sorted(compile_options(variant, catalogue).disabled)),
                         tuple(candidate.backend.providers), tuple(samples), check.to_config(), rules,
                         None if candidate.low is None else low_precision(candidate, candidate.low, model))


def low_precision(candidate: Candidate, low: frozenset[str], model: onnx.ModelProto) -> LowPrecision:
    """A precision candidate's part of candidate.json (`low`: its low nodes), narrowed to the subgraph's nodes
    and tensors."""
    names = {proto.name for proto in model.graph.node}
    tensors = {t for proto in model.graph.node for t in (*proto.input, *proto.output) if t}
    return LowPrecision(candidate.backend.name, candidate.dtype, tuple(sorted(low & names)),
                        {name: dtype for name, dtype in sorted(candidate.dtypes.items()) if name in tensors})


def write_files(step: ReduceStep, model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
                expected: Sequence[Mapping[str, np.ndarray]], spec: CandidateSpec) -> None:
    with atomic_path(step.repro_model) as temporary:
        onnx.save(model, temporary)
    for arrays, path in (*zip(feeds, step.repro_inputs, strict=True),
                         *zip(expected, step.expected_outputs, strict=True)):
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as temporary, open(temporary, "wb") as file:
            np.savez(file, **arrays)
    spec.write(step.candidate_json)
    write_atomic(step.repro, REPRO)


def verify(step: ReduceStep) -> tuple[ReproRun, ReproRun]:
    """repro.py run as a user runs it: it must exit 1 as written and 0 with the bisection's answer."""
    flag = FLAGS[step.bisection]
    as_written, with_answer = (run_repro(step, extra) for extra in ([], [flag, str(step.answer.resolve())]))
    if as_written.exit != 1:
        raise ReduceError(f"repro.py as written exits {as_written.exit}, not 1 ({as_written.last_line}): the "
                          "repro does not reproduce the failure on its own")
    if with_answer.exit != 0:
        raise ReduceError(f"repro.py {flag} {step.answer} exits {with_answer.exit}, not 0 "
                          f"({with_answer.last_line}): the answer does not fix the repro")
    return as_written, with_answer


def run_repro(step: ReduceStep, extra: Sequence[str]) -> ReproRun:
    done = subprocess.run([sys.executable, step.repro.name, *extra], cwd=step.repro.parent, capture_output=True,
                          text=True, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return ReproRun(" ".join(["python", "repro.py", *extra]), done.returncode, lines[-1] if lines else "")


def render_summary(record: ReduceRecord) -> str:
    fresh = sum(not step.from_disk for step in record.steps)
    answer = record.with_answer.command.replace("python repro.py ", "")
    return (f"repro: {record.repro_nodes} of {record.model_nodes} nodes of the original model fail the check "
            f"on their own ({record.bisection} candidate), {len(record.outputs)} output(s), "
            f"{len(record.inputs)} input(s) from the reference; {len(record.steps)} search steps "
            f"({fresh} probed, {len(record.steps) - fresh} from disk), {record.seconds:.0f} s\n"
            f"`python repro.py` exits 1; with {answer.split(' ')[0]} (the answer) it exits 0\n")
