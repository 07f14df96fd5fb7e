"""The cache contract: which change re-keys which stage folder, as a table.

Each row changes one config key (or one input file, or the host) and names exactly the stage folders whose key
changes; every other folder is reused. The keys come from `Plan.build`, the pure step of planning, over
made-up digests: no model, sample or ORT session is needed. A stage folder is named
`<stage> <variant or comparison>[ <sample>]` (`Plan.keys`), plus each bisection's probes (a verdict's key).
docs/caching.md shows the same table; change both together, and only on purpose: a re-keyed
folder is work done again for every user.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from accubisect.formats.config import load_schema, validate_config
from accubisect.formats.paths import stage_dir
from accubisect.formats.samples import Sample
from accubisect.workflow.plan import Inputs, Plan

SAMPLES = (Sample(0, Path("samples/sample0_inputs.npz"), None),  # judged against its fusion-off dump
           Sample(1, Path("samples/sample1_inputs.npz"), Path("samples/sample1_outputs.npz")))  # golden outputs
INPUTS = Inputs(model=Path("model.onnx"), model_sha256="m" * 64, model_bytes=1 << 20, output_names=("y",),
                samples=SAMPLES, inputs_sha256=("i0" * 32, "i1" * 32), golden_sha256=(None, "g1" * 32),
                largest_sample_bytes=1 << 10, rules_off=frozenset(), mixlist_sha256=None, val_func_sha256=None,
                onnxruntime="1.99.0", cpu="x86_64:avx,avx2")
CONFIG = {"model": "model.onnx", "samples": "samples"}  # the schema's defaults for everything else
PROBE = frozenset({"some_rule_or_node"})  # a configuration a bisection probes: its verdict's key

# the stage folders of the base plan: 2 variants, 2 samples
OFF = {"compile fusion_off", "graph fusion_off", "dump fusion_off sample0", "dump fusion_off sample1"}
ON = {"compile fusion_on", "graph fusion_on", "dump fusion_on sample0", "dump fusion_on sample1"}
REDUCED = {"precision", "dump reduced sample0", "dump reduced sample1"}
REDUCE = {"reduce", "reduce_probe"}  # the repro (`reduce.bisection: fusion`, the default) and its probes
FUSION = {"compare fusion", "bundle", "local fusion", "fusion_bisect", "probe", "instance_probe"} | REDUCE
PRECISION = {"compare precision", "precision_bisect", "precision_probe"}
EVERYTHING = OFF | ON | REDUCED | FUSION | PRECISION
JUDGED = {"compare fusion", "bundle", "compare precision", "fusion_bisect", "precision_bisect", "probe",
          "precision_probe", "instance_probe"} | REDUCE  # what a check of accuracy decides
# a search record, and the repro judged with fusion_bisect's answer; the probes' verdicts are reused
SEARCHES = {"fusion_bisect", "precision_bisect"} | REDUCE


@dataclasses.dataclass(frozen=True)
class Row:
    what: str
    config: Mapping[str, Any]  # merged into the config
    re_keyed: set[str]
    inputs: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # replaced in the inputs
    given: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # config both sides share
    given_inputs: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # inputs both sides share


ROWS = [
    # top level
    Row("model: another path to the same bytes", {"model": "elsewhere/model.onnx"}, set()),
    Row("the model file's bytes", {}, EVERYTHING, inputs={"model_sha256": "n" * 64}),
    Row("the model's external data file's bytes", {}, EVERYTHING, inputs={"data_sha256": ("d" * 64,)}),
    Row("samples: another folder of the same files", {"samples": "elsewhere"}, set()),
    Row("workspace (paths move, keys stay)", {"workspace": "elsewhere"}, set()),
    Row("results", {"results": "elsewhere"}, set()),
    Row("backend", {"backend": "ort-cuda"}, EVERYTHING),
    # compile
    Row("compile.level", {"compile": {"level": "extended"}}, EVERYTHING - OFF),
    Row("compile.level, precision on the original graph", {"compile": {"level": "extended"}},
        ON | {"compare fusion", "bundle", "local fusion", "fusion_bisect", "probe", "instance_probe",
              "compare precision", "precision_bisect"} | REDUCE, given={"precision": {"graph": "original"}}),
    Row("compile.session_config", {"compile": {"session_config": {"session.disable_prepacking": "1"}}}, EVERYTHING),
    Row("compile.fusion_switch: a switch file turning a rule off", {"compile": {"fusion_switch": "switch.cfg"}},
        EVERYTHING - OFF, inputs={"rules_off": frozenset({"GeluFusion"})}),
    Row("compile.fusion_switch: another file setting the same rules", {"compile": {"fusion_switch": "other.cfg"}},
        set(), given={"compile": {"fusion_switch": "switch.cfg"}}),
    # accuracy
    *[Row(f"accuracy.{key}", {"accuracy": {key: value}}, JUDGED)
      for key, value in (("rtol", 0.1), ("atol", 0.1), ("ntol", 0.1), ("cosine", 0.99), ("min_pass_fraction", 0.5))],
    Row("accuracy.val_func", {"accuracy": {"val_func": "check:outputs"}}, JUDGED, inputs={"val_func_sha256": "v" * 64}),
    Row("the val_func's source file edited", {}, JUDGED, inputs={"val_func_sha256": "w" * 64},
        given={"accuracy": {"val_func": "check:outputs"}}),
    # bisect
    Row("bisect.rules", {"bisect": {"rules": ["GeluFusion"]}}, {"fusion_bisect"} | REDUCE),
    Row("bisect.parallel", {"bisect": {"parallel": 4}}, SEARCHES),
    Row("bisect.max_probes", {"bisect": {"max_probes": 5}}, SEARCHES),
    Row("bisect.max_minutes", {"bisect": {"max_minutes": 5}}, SEARCHES),
    # dump
    *[Row(f"dump.{key}", {"dump": {key: value}}, EVERYTHING - {"compile fusion_off", "graph fusion_off",
                                                                "compile fusion_on", "graph fusion_on", "precision"})
      for key, value in (("mode", "all"), ("op_type_filter", ["MatMul"]), ("op_type_bypass", ["Add"]),
                         ("op_name_filter", ["mm*"]), ("op_name_bypass", ["add*"]), ("statistics_only", True))],
    Row("dump.mode, every sample with golden outputs", {"dump": {"mode": "all"}},
        {"dump fusion_off sample0", "dump fusion_off sample1", "dump fusion_on sample0", "dump fusion_on sample1",
         "dump reduced sample0", "dump reduced sample1", "compare fusion", "bundle", "local fusion",
         "compare precision", "fusion_bisect", "precision_bisect"} | REDUCE,
        given_inputs={"golden_sha256": ("g0" * 32, "g1" * 32)}),
    Row("dump.samples: a selection leaving sample1 out", {"dump": {"samples": "0"}},
        {"dump fusion_off sample1", "dump fusion_on sample1", "dump reduced sample1"} | FUSION | PRECISION,
        inputs={"samples": SAMPLES[:1], "inputs_sha256": INPUTS.inputs_sha256[:1],
                "golden_sha256": INPUTS.golden_sha256[:1]}),
    # compare
    Row("compare.low_precision", {"compare": {"low_precision": "bf16"}},
        {"compare fusion", "bundle", "fusion_bisect"} | REDUCE),
    # reduce
    Row("reduce.bisection", {"reduce": {"bisection": "precision"}}, REDUCE),
    Row("precision.mode, reducing the precision candidate", {"precision": {"mode": "allow_mix_precision"}},
        REDUCED | PRECISION | REDUCE, given={"reduce": {"bisection": "precision"}}),
    # precision
    *[Row(f"precision.{key}", {"precision": {key: value}}, REDUCED | PRECISION)
      for key, value in (("mode", "allow_mix_precision"), ("graph", "original"), ("dtype", "bf16"),
                         ("keep_dtype", ["mm0"]), ("no_fp32_ops", ["Softmax"]))],
    Row("precision.modify_mixlist", {"precision": {"modify_mixlist": "mixlist.json"}}, REDUCED | PRECISION,
        inputs={"mixlist_sha256": "x" * 64}),
    Row("the mixlist file edited", {}, REDUCED | PRECISION, inputs={"mixlist_sha256": "y" * 64},
        given={"precision": {"modify_mixlist": "mixlist.json"}}),
    # input files and the host
    Row("sample0's inputs (the sample precision is assigned on)", {},
        {"dump fusion_off sample0", "dump fusion_on sample0"} | REDUCED | FUSION | PRECISION,
        inputs={"inputs_sha256": ("j0" * 32, INPUTS.inputs_sha256[1])}),
    Row("sample1's inputs", {},
        {"dump fusion_off sample1", "dump fusion_on sample1", "dump reduced sample1"} | FUSION | PRECISION,
        inputs={"inputs_sha256": (INPUTS.inputs_sha256[0], "j1" * 32)}),
    Row("sample1's golden outputs", {}, JUDGED, inputs={"golden_sha256": (None, "h1" * 32)}),
    Row("golden outputs added for sample0", {}, JUDGED, inputs={"golden_sha256": ("g0" * 32, "g1" * 32)}),
    Row("the ONNX Runtime version", {}, EVERYTHING, inputs={"onnxruntime": "2.0.0"}),
    Row("the CPU's instruction set (fusion-on at level all: its compile and the probes that compile like it)", {},
        EVERYTHING - OFF, inputs={"cpu": "x86_64:avx512f"}),
    Row("the CPU's instruction set, fusion-on at level extended", {}, set(), inputs={"cpu": "x86_64:avx512f"},
        given={"compile": {"level": "extended"}}),
    Row("sizes and output names (cluster resources, reports)", {}, set(),
        inputs={"model_bytes": 1 << 30, "largest_sample_bytes": 1 << 20, "output_names": ("z",)}),
]


def merged(base: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `change` merged in, key group by key group."""
    out = dict(base)
    for key, value in change.items():
        out[key] = {**out[key], **value} if isinstance(value, Mapping) and key in out else value
    return out


def stage_keys(config: Mapping[str, Any], inputs: Inputs) -> dict[str, str]:
    plan = Plan.build(validate_config(dict(config)), inputs)
    return {**plan.keys(), "probe": plan.verdict_store("fusion").key_of(PROBE),
            "precision_probe": plan.verdict_store("precision").key_of(PROBE),
            "instance_probe": plan.instance_store().key_of(PROBE), "reduce_probe": plan.reduce_store().key_of(PROBE)}


def re_keyed(row: Row) -> set[str]:
    config, inputs = merged(CONFIG, row.given), dataclasses.replace(INPUTS, **row.given_inputs)
    before = stage_keys(config, inputs)
    after = stage_keys(merged(config, row.config), dataclasses.replace(inputs, **row.inputs))
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.what)
def test_a_change_re_keys_exactly_these_stages(row):
    assert re_keyed(row) == row.re_keyed


def config_keys(config: Mapping[str, Any], prefix: str = "") -> set[str]:
    """The dotted keys a change sets: `compile.level`; a free-form mapping (`session_config`) counts whole."""
    keys = set()
    for key, value in config.items():
        if isinstance(value, Mapping) and value and key != "session_config":
            keys |= config_keys(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def schema_keys(schema: Mapping[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, sub in schema.get("properties", {}).items():
        keys |= schema_keys(sub, f"{prefix}{key}.") if "properties" in sub else {f"{prefix}{key}"}
    return keys


def test_every_config_key_has_a_row():
    """A key added to the schema needs its row: what re-runs when a user changes it is part of its meaning."""
    covered = set().union(*(config_keys(row.config) for row in ROWS))
    assert schema_keys(load_schema()) - covered == set()


def test_the_keys_themselves_are_stable():
    """A change to how keys are computed re-keys every folder of every user's workspace even where no row
    moves: the base plan's keys, pinned. Update them only on purpose, saying why in the commit message."""
    assert stage_keys(CONFIG, INPUTS) == {
        "compile fusion_off": "164572fea0cda93f", "compile fusion_on": "079d060e98ba3a0c",
        "graph fusion_off": "8245b3a16c058552", "graph fusion_on": "dec4440942991eeb",
        "dump fusion_off sample0": "6d523ced3ea01f87", "dump fusion_off sample1": "ed1cc8392c3d5634",
        "dump fusion_on sample0": "96eb2476cffce153", "dump fusion_on sample1": "13d0c01400b86b1f",
        "dump reduced sample0": "b542791520413bf4", "dump reduced sample1": "d989b9628c717684",
        "compare fusion": "269f2261b5142057", "compare precision": "ac5c6f5ea155d375",
        "local fusion": "bd750a29284ffe06", "precision": "cc36c0c691626bc1", "bundle": "269f2261b5142057",
        "fusion_bisect": "ca97c5c192cd9688", "precision_bisect": "976d38bc613cbb1f",
        "probe": "1c567f25d40192b0", "precision_probe": "6c83b6e2fa9376af", "instance_probe": "4233d97eb35e2c78",
        "reduce": "60dd4aeeda686964", "reduce_probe": "678a2d46b6de7143",
    }


def test_planning_reads_no_file_and_every_path_follows_from_its_key(tmp_path):
    """The made-up inputs name files that do not exist: building the plan touches none of them. Every folder
    the plan hands the rules is `<workspace>/<stage>/<key>` for a key it lists."""
    plan = Plan.build(validate_config({**CONFIG, "workspace": str(tmp_path / "ws")}), INPUTS)
    keys = plan.keys()
    folder = {name: stage_dir(tmp_path / "ws", name.split()[0], key) for name, key in keys.items()}
    assert plan.compile_dir("fusion_on") == folder["compile fusion_on"]
    assert plan.graph_json("fusion_off").parent == folder["graph fusion_off"]
    assert plan.dump_path("reduced", SAMPLES[1]).parent == folder["dump reduced sample1"]
    assert [path.parent for path in plan.dumps_of("fusion_on")] == [folder["dump fusion_on sample0"],
                                                                     folder["dump fusion_on sample1"]]
    assert plan.compare_dir("precision") == folder["compare precision"]
    assert plan.local_errors_json("fusion").parent == folder["local fusion"]
    assert plan.local_errors_json("precision").parent == plan.precision_dir() == folder["precision"]
    assert plan.bundle_dir() == folder["bundle"]
    assert plan.bisect_dir("fusion") == folder["fusion_bisect"]
    assert plan.bisect_dir("precision") == folder["precision_bisect"]
    assert plan.verdict_store("precision").path(PROBE).parent.parent == tmp_path / "ws" / "precision_probe"
    assert plan.references() == [plan.dump_path("fusion_off", SAMPLES[0]), SAMPLES[1].outputs]
    assert not (tmp_path / "ws").exists()


def test_inputs_carry_one_digest_of_each_kind_per_sample():
    with pytest.raises(ValueError, match="2 samples, 1 input digests and 2 golden digests"):
        dataclasses.replace(INPUTS, inputs_sha256=INPUTS.inputs_sha256[:1])


def openvino_key(level: str = "precision", config: Mapping[str, Any] | None = None, **inputs: Any) -> str:
    """The verdict key of `PROBE` in an OpenVINO search's store (`Plan.openvino_store`)."""
    merged_config = merged({**CONFIG, "backend": "openvino-cpu", "precision": {"dtype": "bf16"}}, config or {})
    plan = Plan.build(validate_config(merged_config),
                      dataclasses.replace(INPUTS, **{"runtime": "openvino 2026.4.1", **inputs}))
    return plan.openvino_store(level).key_of(PROBE)


def test_an_openvino_verdict_is_reused_only_for_the_same_model_samples_check_dtype_version_and_cpu():
    """The OpenVINO searches keep their verdicts beside the ORT searches': a rerun of the same configuration
    finds them (the budget is no part of a verdict), and another model, sample, accuracy check, reduced type,
    OpenVINO version or CPU (the plugin picks its kernels for it) never reads them; the levels never share."""
    first = openvino_key()
    assert openvino_key() == first == openvino_key(config={"bisect": {"max_probes": 5}})
    others = [openvino_key(config={"precision": {"dtype": "fp16"}}), openvino_key(config={"accuracy": {"rtol": 0.5}}),
              openvino_key(model_sha256="n" * 64), openvino_key(inputs_sha256=("j0" * 32, "i1" * 32)),
              openvino_key(runtime="openvino 2026.5.0"), openvino_key(cpu="x86_64:avx512_bf16")]
    assert len({first, *others}) == len(others) + 1
    assert len({first, openvino_key("rule"), openvino_key("instance")}) == 3
    assert openvino_key("rule") == openvino_key("rule", config={"precision": {"dtype": "fp16"}})
