"""The compile stage: one variant of the model as ONNX Runtime really runs it, and the rules that fired.

A variant is fusion-off (no optimization at all), fusion-on (the configured level), or fusion-on with
chosen rules switched off. Transformers that fired are named by ORT's log; rewrite rules are not, so
each rewrite rule of a rule-based transformer that fired is probed by compiling once more without it.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from accubisect.core.onnx_graph import name_nodes_uniquely, signature_counts
from accubisect.core.rules import RuleCatalogue
from accubisect.formats.compile_record import CompileRecord, SignatureCounts, Variant
from accubisect.formats.files import atomic_model
from accubisect.formats.graph_only import graph_only
from accubisect.formats.model import external_bytes, external_data_files
from accubisect.formats.step import Step
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend, backend_named
from accubisect.runtime.catalogue import compile_options, installed_catalogue
from accubisect.runtime.host import cpu_signature

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileStep(Step):
    model: Path
    variant: Mapping[str, Any]  # `Variant.to_json()`
    backend: str
    compiled_model: Path
    compile_record: Path
    threads: int | None = None  # ORT's intra-op pool: the job's


def compile_variant(step: CompileStep) -> None:
    """Writes the optimized graph ORT runs and a record of how it was made and what fired; ORT uses at most
    `step.threads` threads (the job's)."""
    spec = Variant.from_json(step.variant)
    compiler = Compiler(step.model, spec, installed_catalogue(), backend_named(step.backend), step.threads)
    start = time.perf_counter()
    without: dict[str, SignatureCounts] = {}
    with atomic_model(step.compiled_model) as saved:
        fired = compiler.compile(saved, without)
    log.info("%s: %d rules fired: %s", spec.name, len(fired), ", ".join(fired) or "none")
    CompileRecord(spec, step.backend, tuple(sorted(compile_options(spec, compiler.catalogue).disabled)), tuple(fired),
                  {rule: counts for rule, counts in without.items() if rule in fired}, ort_compile.ort_version(),
                  cpu_signature(), round(time.perf_counter() - start, 3)).write(step.compile_record)


@dataclass(frozen=True)
class Compiler:
    """`model` compiled for `variant` on `backend`, with at most `threads` ORT threads (None: ORT's default):
    what the compile, the rule probe's compiles and the graph stage's differential compiles share."""

    model: Path
    variant: Variant
    catalogue: RuleCatalogue
    backend: Backend
    threads: int | None = None

    def compile(self, save_to: Path, without: dict[str, SignatureCounts] | None = None) -> list[str]:
        """Saves the optimized graph to `save_to`; returns the rules that fired. `without`, if given, gets the
        node signature counts of every graph compiled with one rule switched off along the way (the graph
        stage's differential compiles, done already). A model with external data is saved with its own data
        file beside it (`<save_to name>.data`), so the saved graph loads from where it is."""
        options = compile_options(self.variant, self.catalogue)
        modified = self.backend.compile(self.model, options, save_to, self.threads, self.external_data())
        compiled = graph_only(save_to)  # the rules are read off the graph alone, weights inline or not
        return self.fired_rules(modified, compiled, {} if without is None else without)

    def fired_rules(self, modified: Sequence[str], compiled: onnx.ModelProto,
                    without: dict[str, SignatureCounts]) -> list[str]:
        """Rules that changed the graph, in the order ORT applied them (`modified`: the passes the backend
        says changed it); `without` as `compile`'s."""
        catalogue, fired = self.catalogue, []
        for name in modified:
            if name in catalogue.rewrite_rules:
                fired += [rule for rule in self._rewrite_rules_that_fired(name, compiled, without) if rule not in fired]
            elif name in catalogue.transformers and catalogue.rule_of(name) not in fired:
                fired.append(catalogue.rule_of(name))
        return fired

    def _rewrite_rules_that_fired(self, container: str, compiled: onnx.ModelProto,
                                  without: dict[str, SignatureCounts]) -> list[str]:
        """The rules of `container` without which the graph changes, in the catalogue's order. A rule is named
        only when switching it off alone changes the graph. ORT names what a fusion makes after its rule
        (`ConvBnFusion_W_conv1`), so the rules the compiled graph names are tried first, one compile each, and
        the others are switched off together in one compile: only when that changes the graph are they halved
        while the graph still changes (a group whose removal leaves the graph as it was holds no rule that
        fired). A model whose fired rules are all named then costs one compile per fired rule and one for the
        rest, however many rules the catalogue lists (the PP-OCRv4 detector: 2 compiles, 8 when halving all
        twenty). The names only order the compiles: every rule is proven by its own."""
        probe = _RuleProbe(self, signature_counts(compiled.graph), without, rewrites_weights(self.graph, compiled))
        candidates = [rule for rule in self.catalogue.rewrite_rules[container] if rule not in self.variant.rules_off]
        hinted = named_in(compiled.graph, candidates)
        rest = [rule for rule in candidates if rule not in hinted]
        # with no hint, the rest is the container, which changed the graph: all of it off does too
        found = {rule for rule in hinted if probe.changes([rule])} | set(probe.search(rest, None if hinted else True))
        return [rule for rule in candidates if rule in found]

    def without(self, rules: str | list[str], discard_weights: bool = False) -> onnx.ModelProto:
        """The graph ORT makes with `rules` (one or several) switched off as well, for its nodes alone (the rule
        probes, the graph stage): ORT is handed the graph alone (`graph`) and reads only the weights it needs,
        where they are, on one thread (a pool of the job's threads, started for a session never run, costs more
        than the optimization of a CNN), and the graph it saves keeps its references to the weights no rule
        rewrote, so no weight is copied: a probe then costs the graph's optimization, not a load of the model.
        Saved with a data file of its own, every weight was read and written again per compile: the graph job
        on the 1.07 GB transformer took 2.6-25 s and wrote 2 GB instead of 0.1 s (a 170 MB CNN whose every
        weight a rule rewrites, serialized inline here, costs the same either way: 0.28 s against 0.24-0.34).
        `discard_weights` (`rewrites_weights`: where the rules rewrite most weights) writes the weights of the
        saved graph to the null device instead: the 170 MB CNN's every weight is new (ConvBNFusion, the NCHWc
        reorder), and serializing them took 1.7 s of a 2.3 s probe; where few are new, the references cost
        nothing and the null device would cost a read of every weight (2.4 s a probe on the 1 GB transformer)."""
        off = frozenset([rules] if isinstance(rules, str) else rules)
        options = compile_options(self.variant, self.catalogue, off)
        with tempfile.TemporaryDirectory() as folder:
            saved = Path(folder) / "model.onnx"
            probe = ort_compile.with_weights(options, self.model.parent)  # the graph's weights: in the model's folder
            if discard_weights:
                (Path(folder) / DISCARDED).symlink_to(os.devnull)
                probe = probe.with_config({ort_compile.SAVED_WEIGHTS: DISCARDED})
            ort_compile.compile_model(self.graph_bytes, probe, self.backend, saved, threads=1)
            return graph_only(saved)  # its nodes: its references point nowhere from here, and are never followed

    @functools.cached_property
    def graph(self) -> onnx.ModelProto:
        """The model without its weights, each a reference into the file holding it (its external data file, or
        the model file itself: `formats.graph_only`), its nodes named as `ort_compile.loadable` names them."""
        graph = graph_only(self.model)
        name_nodes_uniquely(graph.graph)
        return graph

    @functools.cached_property
    def graph_bytes(self) -> bytes:
        """`graph` as ORT is handed it, serialized once for all the probes."""
        return self.graph.SerializeToString()

    def external_data(self) -> bool:
        """Whether the model keeps its weights in external data files (not counting the references `graph`
        makes into the model file itself)."""
        return any(path != self.model for path in external_data_files(self.graph, self.model))


DISCARDED = "discarded.data"  # a probe's saved weights, a link to the null device (`Compiler.without`)


def rewrites_weights(model: onnx.ModelProto, compiled: onnx.ModelProto) -> bool:
    """Whether most of `compiled`'s weight bytes are new, tensors `model` does not name (a rule rewrote them),
    both read without their weights (`graph_only`): then its probes discard the weights they save."""
    ours = {tensor.name for tensor in model.graph.initializer}
    new = kept = 0
    for tensor in compiled.graph.initializer:
        size = len(tensor.raw_data) + external_bytes(tensor)
        if tensor.name in ours:
            kept += size
        else:
            new += size
    return new > kept


@dataclass(frozen=True)
class _RuleProbe:
    """Compiles of `compiler`'s model with rules switched off, each told apart from `reference` (the node
    signature counts of the graph with every rule on); a compile with one rule off leaves its counts in
    `without`. `discard_weights` as `Compiler.without`'s."""

    compiler: Compiler
    reference: SignatureCounts
    without: dict[str, SignatureCounts]
    discard_weights: bool

    def changes(self, rules: list[str]) -> bool:
        counts = signature_counts(self.compiler.without(rules, self.discard_weights).graph)
        if len(rules) == 1:
            self.without[rules[0]] = counts
        return counts != self.reference

    def search(self, rules: list[str], changed: bool | None = None) -> list[str]:
        """The rules of `rules` without which the graph changes, halving while it does; `changed`: whether
        switching all of `rules` off changes the graph, where that is known (a single rule is always
        compiled: its counts are the graph stage's)."""
        if len(rules) == 1:
            return rules if self.changes(rules) else []
        if not rules or not (self.changes(rules) if changed is None else changed):
            return []
        return self.search(rules[:len(rules) // 2]) + self.search(rules[len(rules) // 2:])


def named_in(graph: onnx.GraphProto, rules: list[str]) -> list[str]:
    """The rules whose name, in any case, is part of the name of a node, a tensor or an initializer of
    `graph`: a hint, not a proof, of the rules that made them."""
    names = "\n".join([*(node.name for node in graph.node), *(name for node in graph.node for name in node.output),
                        *(tensor.name for tensor in graph.initializer)]).casefold()
    return [rule for rule in rules if rule.casefold() in names]

