"""The fusion rules of the installed ONNX Runtime, and the names a user may switch.

ORT's `disabled_optimizers` takes graph-transformer names and the names of rewrite rules inside its
rule-based transformers, and silently ignores any other name. So every name a user writes is checked here.

Graph transformers are read from the installed ORT itself: its verbose log names every transformer it
runs. Some come in per-level copies (`GeluFusionL1`, `GeluFusionL2`); the rule a user switches is the
family (`GeluFusion`), which stands for all its copies. Rewrite rules are never logged, so their names
come from ORT's sources for the installed version (`data/ort_rewrite_rules.yaml`).
"""

from __future__ import annotations

import functools
import logging
import re
from importlib import resources

import onnx
import yaml

from accubisect.core.rules import RuleCatalogue
from accubisect.formats.compile_record import Variant
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU

log = logging.getLogger(__name__)

_CONTAINER = re.compile(r"^Level\d+_RuleBasedTransformer$")


@functools.cache
def installed_catalogue() -> RuleCatalogue:
    """The catalogue of the ONNX Runtime this process imports."""
    probe = _probe_model()
    everything = ort_compile.compile_model(probe, _all_options(), CPU).ran
    required = set(ort_compile.compile_model(probe, ort_compile.CompileOptions("off"), CPU).ran)
    transformers = tuple(n for n in everything if n not in required and not _CONTAINER.match(n))
    version = ort_compile.ort_version()
    return RuleCatalogue(transformers, _rewrite_rules(version), version)


def compile_options(variant: Variant, catalogue: RuleCatalogue,
                    extra_off: frozenset[str] = frozenset()) -> ort_compile.CompileOptions:
    """ORT's options for `variant` with `extra_off` switched off too: its rule names become the ORT names
    `disabled_optimizers` takes (a family stands for all its per-level copies)."""
    disabled = catalogue.ort_names(variant.rules_off | extra_off)
    return ort_compile.CompileOptions(variant.level, dict(variant.session_config), disabled)


def _all_options() -> ort_compile.CompileOptions:
    """Level `all` with every config entry that registers an extra transformer."""
    return ort_compile.CompileOptions("all", {"optimization.enable_gelu_approximation": "1"})


def _probe_model() -> bytes:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def _rewrite_rules(version: str) -> dict[str, tuple[str, ...]]:
    table = yaml.safe_load(resources.files("accubisect").joinpath("data/ort_rewrite_rules.yaml").read_text())
    minor = ".".join(version.split(".")[:2])
    if minor not in table:
        newest = max(table, key=lambda v: tuple(int(p) for p in v.split(".")))
        log.warning("no rewrite-rule list for ONNX Runtime %s; using the one of %s", version, newest)
        minor = newest
    return {container: tuple(rules) for container, rules in table[minor].items()}
