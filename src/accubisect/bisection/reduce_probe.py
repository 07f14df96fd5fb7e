"""What one probe of `snakemake reduce` is: a cut of the original model, judged on its own.

A probe (`Cut`) is a subgraph of the original model, node positions in the original's order, and the
tensors it outputs. `CutProber` makes it a model fed at its boundary with the reference's own tensors (fusion
off, fp32) for every sample, runs it as the candidate compiles it (`Candidate`), and judges its outputs
against the reference's with the run's check, then again with the bisection's answer applied: the cut
shows the bug when it fails as compiled and passes with the answer. The reference's tensors
(`ReferenceValues`) come from its dumps; one a dump does not hold (filtered, statistics only) is computed
by running the original model with it exposed.

Apart from the searches (`reduce_search.py`, run by the one driver, which keeps each verdict in the verdict
store so that a rerun reads it from disk) and the job (`reduce.py`) because this is all they ask of a model,
a yes or no per cut; they decide which cuts to ask about, and the job what to write for the one found.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.subgraph import Graph, varying_shape
from accubisect.formats.compile_record import Variant
from accubisect.formats.digest import stage_key
from accubisect.formats.dump_file import DumpReader
from accubisect.formats.samples import load_arrays
from accubisect.formats.verdict import VerdictRecord
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.runtime.ort_exposed import run_exposed


@dataclass(frozen=True)
class Cut:
    """A probed subgraph: node positions in the original's order and the tensors it outputs."""

    positions: tuple[int, ...]
    outputs: tuple[str, ...]

    def describe(self, graph: Graph) -> str:
        if not self.positions:
            return "no node"
        first, last = graph.nodes[self.positions[0]].name, graph.nodes[self.positions[-1]].name
        return f"{len(self.positions)} node(s) {first} .. {last} -> {len(self.outputs)} output(s)"

    def config(self, graph: Graph) -> frozenset[str]:
        """Its verdict's configuration: a readable line that names it by the hash of its nodes and outputs."""
        digest = stage_key(nodes=[graph.nodes[p].name for p in self.positions], outputs=list(self.outputs))
        return frozenset({f"{self.describe(graph)} #{digest}"})


class ReferenceValues:
    """The reference's tensors (fusion off, fp32) per sample: from its dump where the dump holds them whole,
    else computed by running the original model with them exposed; `computed` names the latter."""

    def __init__(self, model: onnx.ModelProto, dumps: Sequence[Path], inputs: Sequence[Path], backend: Backend,
                 threads: int | None) -> None:
        self.model, self.dumps, self.backend, self.threads = model, list(dumps), backend, threads
        self.feeds = [load_arrays(path) for path in inputs]
        self.cache: list[dict[str, np.ndarray]] = [dict(feeds) for feeds in self.feeds]
        self.computed: set[str] = set()
        self.from_dump: set[str] = set()

    def get(self, names: Sequence[str]) -> list[dict[str, np.ndarray]]:
        for cache, dump_path, feeds in zip(self.cache, self.dumps, self.feeds, strict=True):
            missing = [name for name in names if name not in cache]
            if not missing:
                continue
            with DumpReader(dump_path) as dump:
                held = [] if dump.statistics_only else [name for name in missing if name in dump]
                for name in held:
                    cache[name] = dump.read(name)
            self.from_dump.update(held)
            rest = [name for name in missing if name not in cache]
            if rest:
                cache.update(run_exposed(self.model, rest, feeds, self.backend, self.threads)[0])
                self.computed.update(rest)
        return [{name: cache[name] for name in names} for cache in self.cache]


@dataclass
class Candidate:
    """How the candidate compiles a subgraph: the variant's ORT options, and for precision the original
    nodes it runs reduced (`low`) in `dtype`, lowered as the backend lowers them. With the answer applied,
    the answer's rules are switched off too (`rules_off`, fusion), or its nodes kept in fp32 (`kept_fp32`)."""

    variant: Variant
    backend: Backend
    threads: int | None
    rules_off: frozenset[str] = frozenset()
    low: frozenset[str] | None = None
    kept_fp32: frozenset[str] = frozenset()
    dtype: str | None = None
    dtypes: Mapping[str, str] = field(default_factory=dict)

    def run(self, model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str],
            answer: bool = False) -> list[dict[str, Any]]:
        if self.low is not None:
            names = {proto.name for proto in model.graph.node}
            low = self.low - self.kept_fp32 if answer else self.low
            model = self.backend.reduced_model(model, set(low & names), self.dtype, self.dtypes)
        options = compile_options(self.variant, installed_catalogue(), self.rules_off if answer else frozenset())
        runner = ort_compile.Runner(model.SerializeToString(), options, self.backend, self.threads).activate()
        return [runner.infer(feed, outputs) for feed in feeds]


class CutProber:
    """What a cut shows, judged on every sample (`judge`); the verdict store and the search around it are
    `reduce_search.py`'s."""

    def __init__(self, graph: Graph, reference: ReferenceValues, candidate: Candidate, check: AccuracyCheck,
                 samples: Sequence[str]) -> None:
        self.graph, self.reference, self.candidate = graph, reference, candidate
        self.check = check.on_tensors()  # a cut's outputs are tensors, not the model's outputs a val_func judges
        self.val_func = check.val_func
        self.samples = list(samples)

    def model(self, cut: Cut) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        """The cut as a model, its boundary per sample and the reference's outputs per sample."""
        boundary = self.graph.boundary(cut.positions)
        values = self.reference.get([*boundary, *cut.outputs])
        constants = {name: values[0][name] for name in boundary if name in self.graph.constants}
        fed = [name for name in boundary if name not in constants]
        types = {name: (values[0][name].dtype, varying_shape([v[name].shape for v in values]))
                 for name in (*fed, *cut.outputs)}
        model = self.graph.extract(cut.positions, cut.outputs, types, constants, types)
        return (model, [{name: v[name] for name in fed} for v in values],
                [{name: v[name] for name in cut.outputs} for v in values])

    def judge(self, cut: Cut) -> dict[str, Any]:
        """Whether the cut shows the bug: it fails as the candidate compiles it and passes with the answer
        applied (a cut that fails both ways fails for another reason: error the answer does not remove).
        `passed` is true where it does not; `samples` are the verdicts as written, each with the answer's."""
        if not cut.outputs:
            return {"passed": True, "samples": [], "worst": {}}  # nothing crosses the cut: nothing to judge
        model, feeds, expected = self.model(cut)
        judged = self._judged(self.candidate.run(model, feeds, cut.outputs), expected)
        fails = not self.check.passes([s["passed"] for s in judged])
        if fails:
            fixed = self._judged(self.candidate.run(model, feeds, cut.outputs, answer=True), expected)
            judged = [{**sample, "answer": {"passed": row["passed"], "reasons": row["reasons"]}}
                      for sample, row in zip(judged, fixed, strict=True)]
            fails = self.check.passes([s["passed"] for s in fixed])
        return {**self.check.judge(judged), "passed": not fails}

    def _judged(self, got: Sequence[Mapping[str, np.ndarray]],
                expected: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, Any]]:
        return [{"inputs": name, **self.check.judge_outputs(ref, cand, None)}
                for name, ref, cand in zip(self.samples, expected, got, strict=True)]

    def nothing_to_reduce(self, whole: VerdictRecord) -> str:
        """Why the whole model, probed, shows no bug to reduce (`nothing_to_reduce`)."""
        why = nothing_to_reduce(whole.samples)
        if self.val_func is None:
            return why
        return (f"{why} (reduce judges tensors by rtol/atol/ntol/cosine: accuracy.val_func {self.val_func} judges "
                "the model's outputs only)")


def failing_outputs(cut: Cut, verdict: VerdictRecord) -> tuple[str, ...]:
    """The outputs of `cut` that fail on some sample of its verdict, in the cut's order."""
    bad = {name for sample in verdict.samples for name, row in sample["outputs"].items() if not row["passed"]}
    return tuple(name for name in cut.outputs if name in bad)


def describe(passed: bool, samples: Sequence[Mapping[str, Any]]) -> str:
    """A probe's verdict in a progress line."""
    if not any("answer" in sample for sample in samples):
        return "passes"
    if not passed:
        return f"fails ({first_failure(samples)}), passes with the answer"
    return (f"fails ({first_failure(samples)}), and with the answer too "
            f"({first_failure([sample['answer'] | {'inputs': sample['inputs']} for sample in samples])})")


def nothing_to_reduce(samples: Sequence[Mapping[str, Any]]) -> str:
    """Why a verdict that passes shows no bug: the candidate passes as it compiles, or the answer does not fix it
    (a sample judged with the answer too failed as written)."""
    unfixed = [{"inputs": s["inputs"], "reasons": s["answer"]["reasons"]} for s in samples
               if "answer" in s and not s["answer"]["passed"]]
    if not unfixed:
        return "the candidate passes against the reference (fusion off, fp32) on the model's outputs: nothing to reduce"
    return (f"the model's outputs still fail with the answer applied ({first_failure(unfixed)}): the answer does "
            "not fix the candidate, so no subgraph shows the bug it fixes; nothing to reduce")


def first_failure(samples: Sequence[Mapping[str, Any]]) -> str:
    for sample in samples:
        if sample["reasons"]:
            return f"{sample['inputs']}: {sample['reasons'][0]}"
    return "too few samples pass"

