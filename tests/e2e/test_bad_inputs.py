"""The bad-input catalogue: what a hostile or careless user feeds the real commands, and what they must get.

Every case starts from a copy of one finished project (the bundled example's fusion_bisect and bundle, the
precision example's precision_bisect), breaks one thing, runs the real `snakemake` target or `accubisect`
command, and asserts:

- the exit status;
- no Python traceback anywhere in the output;
- exactly one distinct error line (`accubisect: ...` or a job's `ERROR accubisect: ...`) and it names the
  file or config key at fault (cases that must succeed have none);
- every file under results/ and workspace/ that existed before the command is byte-identical after it
  (a stage the user did not ask to redo is never deleted), unless the case is one that removes files.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import onnx
import pytest
import yaml
from conftest import copy_workflow, snakemake
from onnx import TensorProto, helper

from accubisect.formats.digest import DIGESTS_FORMAT
from accubisect.runtime.openvino_backend import CAPABILITY, cpu_capabilities

pytestmark = pytest.mark.e2e

EXAMPLE_CONFIG = "examples/config.yaml"
PRECISION_CONFIG = "examples/precision/config.yaml"
BUNDLE = "results/bundle/compare_bundle.tar.gz"
ACCUBISECT = str(Path(sys.executable).with_name("accubisect"))
Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    name: str
    command: tuple[str, ...]  # ("snakemake", target, ...), ("accubisect", ...) or ("sh", pipeline)
    setup: Setup = lambda folder: None
    exit: int = 1
    names: str | tuple[str, ...] | None = None  # what the one error line must contain; None: no error line
    check: Callable[[Path, subprocess.CompletedProcess], None] | None = None  # more about the outcome
    removes: bool = False  # the command is asked to delete files (prune --delete)
    redone: tuple[str, ...] = field(default=())  # globs of files the case asks to rebuild
    gap: str = ""  # why the case fails today: it is expected to, until the cause is fixed


# ---------------------------------------------------------------- building bad inputs


def chain(*setups: Setup) -> Setup:
    def run_all(folder: Path) -> None:
        for setup in setups:
            setup(folder)
    return run_all


def write(relative: str, content: bytes | str) -> Setup:
    def setup(folder: Path) -> None:
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return setup


def config_file(changes: dict, base: str = EXAMPLE_CONFIG, name: str = "my.yaml") -> Setup:
    """`name` holds the example's config with `changes` merged in (a value None deletes the key)."""
    def setup(folder: Path) -> None:
        config = yaml.safe_load((folder / base).read_text())
        _merge(config, changes)
        (folder / name).write_text(yaml.safe_dump(config))
    return setup


def _merge(config: dict, changes: dict) -> None:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            _merge(config[key], value)
        elif value is None and key in config:
            del config[key]
        else:
            config[key] = value


def copy_samples(to: str = "bad_samples", source: str = "examples/samples") -> Setup:
    def setup(folder: Path) -> None:
        shutil.copytree(folder / source, folder / to)
    return setup


def edit_npz(relative: str, edit: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]) -> Setup:
    def setup(folder: Path) -> None:
        path = folder / relative
        with np.load(path) as archive:
            arrays = {key: archive[key] for key in archive.files}
        np.savez(path, **edit(arrays))
    return setup


def tiny_model(relative: str, op: str = "Relu", domain: str = "", opset: int = 17, name: str = "y",
               samples: str = "tiny_samples") -> Setup:
    """x[1, 4] -> op -> `name`, with a matching samples folder."""
    def setup(folder: Path) -> None:
        node = helper.make_node(op, ["x"], [name], name="node", domain=domain)
        graph = helper.make_graph([node], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])])
        imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
        model = helper.make_model(graph, opset_imports=imports)
        model.ir_version = 9
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(model.SerializeToString())
        (folder / samples).mkdir(exist_ok=True)
        np.savez(folder / samples / "sample0_inputs.npz", x=np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4))
    return setup


def hostile_names_model(relative: str, samples: str) -> Setup:
    """Tensor names with slashes, dots, spaces, quotes, non-ASCII and 200 characters."""
    names = ["x/../in put", "a/b\\c.d", "ü 'quoted' \"name\"", "z" * 200]
    def setup(folder: Path) -> None:
        nodes = [helper.make_node("Relu", [names[0]], [names[1]], name="n/0"),
                 helper.make_node("Sigmoid", [names[1]], [names[2]], name="n..1"),
                 helper.make_node("Neg", [names[2]], [names[3]], name="n 2")]
        graph = helper.make_graph(nodes, "hostile",
                                  [helper.make_tensor_value_info(names[0], TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info(names[3], TensorProto.FLOAT, [1, 4])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        onnx.save(model, folder / relative)
        (folder / samples).mkdir()
        np.savez(folder / samples / "sample0_inputs.npz", **{names[0]: np.ones((1, 4), np.float32)})
    return setup


def external_data_model(relative: str) -> Setup:
    """The example model with its weights in a side file, which is then lost."""
    def setup(folder: Path) -> None:
        model = onnx.load(folder / "examples/transformer.onnx")
        onnx.save(model, folder / relative, save_as_external_data=True, location="weights.bin",
                  size_threshold=0)
        (folder / relative).with_name("weights.bin").unlink()
    return setup


def val_func(module: str, body: str) -> Setup:
    return chain(write(f"{module}.py", body), config_file({"accuracy": {"val_func": f"{module}:check"}}))


def preserving_mtime(relative_glob: str, damage: Callable[[Path], None], pick: int = 0) -> Setup:
    """Damages one workspace file as a disk error or a hand edit would, leaving its mtime as it was (so
    Snakemake has no reason to rebuild what depends on it)."""
    def setup(folder: Path) -> None:
        path = sorted(folder.glob(relative_glob))[pick]
        stat = path.stat()
        damage(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return setup


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def remove(relative_glob: str) -> Setup:
    def setup(folder: Path) -> None:
        for path in folder.glob(relative_glob):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return setup


def example_dumps(folder: Path, variant: str) -> list[Path]:
    """The bundled example's dumps of `variant` (the workspace also holds the precision example's, and which
    sorts first depends on keys that change with the ONNX Runtime version)."""
    model = hashlib.sha256((folder / "examples/transformer.onnx").read_bytes()).hexdigest()
    found = []
    for path in sorted(folder.glob("workspace/dump/*/dump.h5")):
        with h5py.File(path, "r") as dump:
            if dump.attrs["variant"] == variant and dump.attrs["model_sha256"] == model:
                found.append(path)
    return found


def remove_dump(variant: str) -> Setup:
    """Deletes one of the example's dumps of `variant`, so that the next run re-dumps it (reading its compiled
    model)."""
    def setup(folder: Path) -> None:
        shutil.rmtree(example_dumps(folder, variant)[0].parent)
    return setup


def compiled(variant: str, file: str) -> Callable[[Path], Path]:
    """A file of the bundled example's compile folder of `variant`: the one its dumps ran."""
    def find(folder: Path) -> Path:
        with h5py.File(example_dumps(folder, variant)[0], "r") as dump:
            ran = dump.attrs["compiled_sha256"]
        for record in sorted(folder.glob("workspace/compile/*/compile.json")):
            if hashlib.sha256(record.with_name("model.onnx").read_bytes()).hexdigest() == ran:
                return record.with_name(file)
        raise AssertionError(f"no compile folder of the example's {variant}")
    return find


def damage_compiled(variant: str, file: str, damage: Callable[[Path], None]) -> Setup:
    def setup(folder: Path) -> None:
        path = compiled(variant, file)(folder)
        stat = path.stat()
        damage(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return setup


def repacked_bundle(edit: Callable[[dict[str, bytes]], dict[str, bytes]], name: str = "tampered.tar.gz") -> Setup:
    """The project's real bundle with its members edited."""
    def setup(folder: Path) -> None:
        with tarfile.open(folder / BUNDLE, "r:gz") as archive:
            members = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
        with tarfile.open(folder / name, "w:gz") as archive:
            for member, data in edit(members).items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return setup


def manifest_edit(change: Callable[[dict], None]) -> Callable[[dict[str, bytes]], dict[str, bytes]]:
    def edit(members: dict[str, bytes]) -> dict[str, bytes]:
        manifest = json.loads(members["manifest.json"])
        change(manifest)
        return {**members, "manifest.json": json.dumps(manifest).encode()}
    return edit


def traversal_bundle(folder: Path) -> None:
    with tarfile.open(folder / "evil.tar.gz", "w:gz") as archive:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 4
        archive.addfile(info, io.BytesIO(b"evil"))


def code_bundle(members: dict[str, bytes]) -> dict[str, bytes]:
    """A bundle whose val_func module would leave a marker file when imported."""
    manifest = json.loads(members["manifest.json"])
    manifest["config"]["accuracy"]["val_func"] = "evil:check"
    code = b"import pathlib\npathlib.Path('CODE_RAN').write_text('x')\ndef check(r, c):\n    return True\n"
    return {**members, "manifest.json": json.dumps(manifest).encode(), "val_func/evil.py": code}


def foreign_hdf5(folder: Path) -> None:
    """An HDF5 file shaped like a dump (a `tensors` group) that another tool wrote: no attributes."""
    with h5py.File(folder / "other.h5", "w") as file:
        file.create_group("tensors").create_dataset("x", data=np.ones(3, np.float32))


def snakemake_lock(folder: Path) -> None:
    """A lock as a running `snakemake` holds it: .snakemake/locks/N.output.lock lists the files it writes."""
    locks = folder / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    written = next(folder.glob("workspace/compile/*/model.onnx")).relative_to(folder)
    (locks / "0.output.lock").write_text(f"{written}\n")


def old_part_inside(folder: Path) -> None:
    """A dump folder untouched for days, with a `.part` file a killed run left inside it."""
    stage = next(folder.glob("workspace/dump/*"))
    (stage / ".dump.h5.x.part").write_bytes(b"partial")
    for path in [stage, *stage.iterdir()]:
        os.utime(path, (1, 1))


# ---------------------------------------------------------------- outcomes beyond the exit status


# Snakemake reads --configfile before the workflow's code runs, so what it says about a config file it cannot
# read is its own (docs/troubleshooting.md); for a missing one it prints its own traceback.
SNAKEMAKE_READS_CONFIGFILES = "snakemake prints a traceback for a missing --configfile before the workflow runs"


def snakemake_says(text: str) -> Callable[[Path, subprocess.CompletedProcess], None]:
    def check(folder: Path, result: subprocess.CompletedProcess) -> None:
        assert text in result.stdout + result.stderr
    return check


def nothing_to_do(target: str, configfile: str, *arguments: str) -> Callable[[Path, subprocess.CompletedProcess], None]:
    """A dry run of `target` as the finished project ran it (`arguments`: its --config) finds nothing to do."""
    def check(folder: Path, result: subprocess.CompletedProcess) -> None:
        again = snakemake(folder, target, "-n", "--configfile", configfile, *arguments)
        assert "Nothing to be done" in again.stdout + again.stderr, again.stdout
    return check


def jobs_planned(folder: Path, result: subprocess.CompletedProcess) -> None:
    assert "Nothing to be done" not in result.stdout + result.stderr
    assert "compile_variant" in result.stdout + result.stderr


def golden_infinity_fails(folder: Path, result: subprocess.CompletedProcess) -> None:
    report = json.loads((folder / "results/compare/report.json").read_text())
    verdict = report["verdicts"][0]
    assert verdict["against"] == "golden" and not verdict["reference"]["passed"], verdict


def no_code_ran(folder: Path, result: subprocess.CompletedProcess) -> None:
    assert not (folder / "CODE_RAN").exists() and not (folder.parent / "escaped.txt").exists()


def statistics_only_dumps(folder: Path, result: subprocess.CompletedProcess) -> None:
    assert "Nothing to be done" not in result.stderr


def hostile_names_dumped(folder: Path, result: subprocess.CompletedProcess) -> None:
    report = json.loads((folder / "results/hostile/compare/report.json").read_text())
    assert {row["tensor"] for row in report["tensors"]} >= {"a/b\\c.d", "z" * 200}


def nothing_removed(folder: Path, result: subprocess.CompletedProcess) -> None:
    assert "would remove" in result.stdout


# ---------------------------------------------------------------- the catalogue


def sm(target: str, *arguments: str, configfile: str = "my.yaml") -> tuple[str, ...]:
    return ("snakemake", target, "--configfile", configfile, *arguments)


def example(target: str, *arguments: str) -> tuple[str, ...]:
    return sm(target, *arguments, configfile=EXAMPLE_CONFIG)


def cli(*arguments: str) -> tuple[str, ...]:
    return ("accubisect", *arguments)


def samples_case(name: str, edit: Setup, names: str) -> Case:
    return Case(name, sm("compare"), chain(copy_samples(), edit, config_file({"samples": "bad_samples"})), 1, names)


def model_case(name: str, setup: Setup, names: str | tuple[str, ...], samples: str = "examples/samples") -> Case:
    return Case(name, sm("compare"), chain(setup, config_file({"model": "bad.onnx", "samples": samples})), 1, names)


def first_input(change: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict], dict]:
    return lambda arrays: {"x": change(arrays["x"])}


MODELS = [
    model_case("model_missing", lambda folder: None, "bad.onnx"),
    model_case("model_zero_bytes", write("bad.onnx", b""), ("bad.onnx", "empty file")),
    model_case("model_garbage", write("bad.onnx", bytes(range(256)) * 8), "bad.onnx"),
    model_case("model_truncated", lambda f: (f / "bad.onnx").write_bytes(
        (f / "examples/transformer.onnx").read_bytes()[:5000]), "bad.onnx"),
    model_case("model_is_a_folder", lambda f: (f / "bad.onnx").mkdir(), "bad.onnx"),
    model_case("model_is_yaml_text", write("bad.onnx", "model: transformer\nlayers: 2\n"), "bad.onnx"),
    model_case("model_op_unknown_to_ort", tiny_model("bad.onnx", op="NoSuchOp"), ("bad.onnx", "NoSuchOp"),
               "tiny_samples"),
    model_case("model_custom_domain_ort_lacks", tiny_model("bad.onnx", op="Frobnicate", domain="com.example"),
               "bad.onnx", "tiny_samples"),
    model_case("model_opset_from_the_future", tiny_model("bad.onnx", opset=99), "bad.onnx", "tiny_samples"),
    model_case("model_external_data_lost", external_data_model("bad.onnx"), "bad.onnx"),
    model_case("model_nul_byte_in_tensor_name", tiny_model("bad.onnx", name="y\x00z"), "bad.onnx",
               "tiny_samples"),
]

SAMPLES = [
    Case("samples_folder_missing", sm("compare"), config_file({"samples": "no_such_folder"}), 1, "no_such_folder"),
    Case("samples_folder_empty", sm("compare"), chain(lambda f: (f / "empty").mkdir(),
                                                      config_file({"samples": "empty"})), 1, "empty"),
    Case("samples_is_a_file", sm("compare"), config_file({"samples": EXAMPLE_CONFIG}), 1, EXAMPLE_CONFIG),
    samples_case("sample_corrupt", write("bad_samples/sample0_inputs.npz", b"PK\x03\x04 not a zip"),
                 "sample0_inputs.npz"),
    samples_case("sample_zero_bytes", write("bad_samples/sample0_inputs.npz", b""), "sample0_inputs.npz"),
    samples_case("sample_pickled_object_array", lambda f: np.savez(
        f / "bad_samples/sample0_inputs.npz", x=np.array([{"a": 1}], dtype=object)), "sample0_inputs.npz"),
    samples_case("sample_missing_input", edit_npz("bad_samples/sample0_inputs.npz", lambda a: {"other": a["x"]}),
                 "sample0_inputs.npz"),
    samples_case("sample_extra_input", edit_npz("bad_samples/sample0_inputs.npz", lambda a: {**a, "extra": a["x"]}),
                 "sample0_inputs.npz"),
    samples_case("sample_wrong_dtype", edit_npz("bad_samples/sample0_inputs.npz",
                                                first_input(lambda x: x.astype(np.float64))), "sample0_inputs.npz"),
    samples_case("sample_wrong_rank", edit_npz("bad_samples/sample0_inputs.npz", first_input(lambda x: x[0])),
                 "sample0_inputs.npz"),
    samples_case("sample_wrong_size", edit_npz("bad_samples/sample0_inputs.npz", first_input(lambda x: x[:, :, :8])),
                 "sample0_inputs.npz"),
    samples_case("samples_with_identical_inputs", lambda f: shutil.copy(f / "bad_samples/sample0_inputs.npz",
                                                                        f / "bad_samples/sample1_inputs.npz"),
                 "sample1_inputs.npz"),
    Case("dump_samples_selects_none", sm("compare"), config_file({"dump": {"samples": "7-9"}}), 1, "dump.samples"),
    Case("dump_samples_malformed", sm("compare"), config_file({"dump": {"samples": "a-b"}}), 1, "dump.samples"),
]

GOLDEN = [
    Case("golden_nan", example("compare"), edit_npz("examples/samples/sample0_outputs.npz",
                                        lambda a: {"y": np.where(np.arange(a["y"].size).reshape(a["y"].shape) == 3,
                                                                 np.nan, a["y"]).astype(np.float32)}),
         1, "sample0_outputs.npz"),
    # declared shapes are hints (a warning at parse time): the compare job refuses a golden output shaped unlike
    # the one the model produces
    Case("golden_wrong_shape", example("compare"),
         edit_npz("examples/samples/sample0_outputs.npz", lambda a: {"y": a["y"][:, :8]}), 1, "sample0_outputs.npz"),
    Case("golden_wrong_rank", example("compare"),
         edit_npz("examples/samples/sample0_outputs.npz", lambda a: {"y": a["y"][0]}), 1, "sample0_outputs.npz"),
    samples_case("golden_missing_output", edit_npz("bad_samples/sample0_outputs.npz", lambda a: {"z": a["y"]}),
                 "sample0_outputs.npz"),
    samples_case("golden_wrong_dtype", edit_npz("bad_samples/sample0_outputs.npz",
                                                lambda a: {"y": a["y"].astype(np.int32)}), "sample0_outputs.npz"),
    samples_case("golden_corrupt", write("bad_samples/sample0_outputs.npz", b"garbage"), "sample0_outputs.npz"),
    Case("golden_plus_infinity_is_no_wildcard", example("compare"),
         edit_npz("examples/samples/sample0_outputs.npz",
                  lambda a: {"y": np.where(np.arange(a["y"].size).reshape(a["y"].shape) == 3, np.inf,
                                           a["y"]).astype(np.float32)}),
         0, check=golden_infinity_fails, redone=("results/compare/*",)),
]

CONFIG = [
    Case("no_config_at_all", ("snakemake", "compare"), exit=1, names="--configfile"),
    Case("configfile_missing", sm("compare", configfile="nosuch.yaml"), exit=1, check=snakemake_says("nosuch.yaml"),
         gap=SNAKEMAKE_READS_CONFIGFILES),
    Case("configfile_broken_yaml", sm("compare"), write("my.yaml", "model: [\n"), 1,
         check=snakemake_says("Config file is not valid JSON or YAML")),
    Case("configfile_a_list", sm("compare"), write("my.yaml", "- model\n- samples\n"), 1,
         check=snakemake_says("Config file must be given as JSON or YAML with keys at top level")),
    Case("unknown_top_level_key", sm("compare"), config_file({"modle": "x.onnx"}), 1, "modle"),
    Case("unknown_nested_key", sm("compare"), config_file({"accuracy": {"rtoll": 0.1}}), 1, "rtoll"),
    Case("negative_rtol", sm("compare"), config_file({"accuracy": {"rtol": -1}}), 1, "accuracy.rtol"),
    Case("rtol_text", sm("compare"), config_file({"accuracy": {"rtol": "tight"}}), 1, "accuracy.rtol"),
    Case("ntol_above_one", sm("compare"), config_file({"accuracy": {"ntol": 5}}), 1, "accuracy.ntol"),
    Case("cosine_above_one", sm("compare"), config_file({"accuracy": {"cosine": 1.5}}), 1, "accuracy.cosine"),
    Case("unknown_level", sm("compare"), config_file({"compile": {"level": "fast"}}), 1, "compile.level"),
    Case("unknown_backend", sm("compare"), config_file({"backend": "tensorrt"}), 1, "backend"),
    Case("unknown_session_config_key", sm("compare"),
         config_file({"compile": {"session_config": {"optimization.enable_gelu_aproximation": "1"}}}), 1,
         "optimization.enable_gelu_aproximation"),
    Case("session_config_not_a_mapping", sm("compare"), config_file({"compile": {"session_config": ["a"]}}), 1,
         "compile.session_config"),
    Case("fusion_switch_missing", sm("compare"), config_file({"compile": {"fusion_switch": "nosuch.cfg"}}), 1,
         "nosuch.cfg"),
    Case("fusion_switch_not_json", sm("compare"), chain(write("switch.cfg", "[GraphFusion]\nGeluApproximation=off\n"),
                                                        config_file({"compile": {"fusion_switch": "switch.cfg"}})),
         1, '{"Switch"'),
    Case("fusion_switch_wrong_structure", sm("compare"),
         chain(write("switch.cfg", '{"GraphFusion": {"GeluApproximation": "off"}}'),
               config_file({"compile": {"fusion_switch": "switch.cfg"}})), 1, '{"Switch"'),
    Case("fusion_switch_unknown_rule", sm("compare"),
         chain(write("switch.cfg", '{"Switch": {"GraphFusion": {"GeluAproximation": "off"}, "UBFusion": {}}}'),
               config_file({"compile": {"fusion_switch": "switch.cfg"}})), 1, "closest: GeluApproximation"),
    Case("fusion_switch_bad_state", sm("compare"),
         chain(write("switch.cfg", '{"Switch": {"GraphFusion": {"GeluApproximation": "disabled"}, "UBFusion": {}}}'),
               config_file({"compile": {"fusion_switch": "switch.cfg"}})), 1, "GeluApproximation"),
    Case("bisect_rules_no_such_rule", sm("fusion_bisect"), config_file({"bisect": {"rules": ["NoSuchRule"]}}), 1,
         ("bisect.rules", "NoSuchRule", "closest: ")),
    Case("precision_dtype_unknown", sm("precision_bisect", configfile="my.yaml"),
         config_file({"precision": {"dtype": "fp8"}}, base=PRECISION_CONFIG), 1, "precision.dtype"),
    Case("mixlist_missing", sm("precision_bisect"), config_file({"precision": {"modify_mixlist": "nosuch.json"}},
                                                                base=PRECISION_CONFIG), 1, "nosuch.json"),
    Case("mixlist_not_json", sm("precision_bisect"),
         chain(write("mix.json", "{black-list: "), config_file({"precision": {"modify_mixlist": "mix.json"}},
                                                                base=PRECISION_CONFIG)), 1, "mix.json"),
    Case("mixlist_a_list", sm("precision_bisect"),
         chain(write("mix.json", '["Add"]'), config_file({"precision": {"modify_mixlist": "mix.json"}},
                                                          base=PRECISION_CONFIG)), 1, "mix.json"),
    Case("mixlist_unknown_op_type", sm("precision_bisect"),
         chain(write("mix.json", '{"black-list": {"to-add": ["NoSuchOp"]}}'),
               config_file({"precision": {"modify_mixlist": "mix.json"}}, base=PRECISION_CONFIG)), 1, "NoSuchOp"),
    Case("dump_filters_exclusive", sm("compare"),
         config_file({"dump": {"op_type_filter": ["Add"], "op_type_bypass": ["Mul"]}}), 1, "dump"),
    Case("workspace_is_a_file", sm("compare"), chain(write("ws_file", "x"), config_file({"workspace": "ws_file"})), 1,
         "ws_file"),
    Case("results_is_a_file", sm("compare"), chain(write("res_file", "x"), config_file({"results": "res_file"})), 1,
         "res_file"),
    Case("nested_config_boolean_from_the_command_line", example("compare", "--config",
                                                               "dump={statistics_only: true}", "-n"), exit=0),
    Case("nested_config_null_from_the_command_line", example("compare", "--config", "compile={fusion_switch: null}"),
         exit=0),
]

VAL_FUNCS = [
    Case("val_func_module_missing", sm("compare"), config_file({"accuracy": {"val_func": "nosuch:check"}}), 1,
         "nosuch"),
    Case("val_func_function_missing", sm("compare"), val_func("vf_nofunc", "def other(r, c):\n    return True\n"), 1,
         "vf_nofunc"),
    Case("val_func_raises", sm("compare"), val_func("vf_raise", "def check(r, c):\n    raise KeyError('logits')\n"),
         1, "vf_raise"),
    Case("val_func_syntax_error", sm("compare"), val_func("vf_syntax", "def check(r, c)\n    return True\n"), 1,
         "vf_syntax"),
    Case("val_func_import_fails", sm("compare"), val_func("vf_import", "import no_such_module_here\n"), 1,
         "vf_import"),
    Case("val_func_wrong_signature", sm("compare"), val_func("vf_sig", "def check(r):\n    return True\n"), 1,
         "vf_sig"),
    Case("val_func_returns_array", sm("compare"), val_func("vf_array", "def check(r, c):\n    return r['y'] > 0\n"),
         1, "vf_array"),
    Case("val_func_returns_text_false", sm("compare"), val_func("vf_text", "def check(r, c):\n    return 'False'\n"),
         1, "vf_text"),
    Case("val_func_returns_none", sm("compare"), val_func("vf_none", "def check(r, c):\n    pass\n"), 1, "vf_none"),
]

WORKSPACE = [
    Case("compile_record_truncated", example("dump"),
         chain(damage_compiled("fusion_on", "compile.json", truncate), remove_dump("fusion_on")), 1,
         ("compile.json", "rerun to rebuild it")),
    Case("compiled_model_emptied", example("dump"),
         chain(damage_compiled("fusion_on", "model.onnx", empty), remove_dump("fusion_on")), 1,
         ("model.onnx", "rerun to rebuild it")),
    Case("search_record_truncated", example("fusion_bisect"),
         chain(preserving_mtime("workspace/fusion_bisect/*/search.json", truncate),
               remove("workspace/fusion_bisect/*/result.json"), remove("results/fusion_bisect")),
         1, ("search.json", "rerun to rebuild it"), redone=("workspace/fusion_bisect/*/*",)),
    Case("probe_verdict_truncated", example("fusion_bisect"),
         chain(preserving_mtime("workspace/probe/*/verdict.json", truncate), remove("workspace/fusion_bisect/*/*.*"),
               remove("results/fusion_bisect")), 1, "verdict.json"),
    Case("precision_verdict_truncated", sm("precision_bisect", configfile=PRECISION_CONFIG),
         chain(preserving_mtime("workspace/precision_probe/*/verdict.json", truncate),
               remove("workspace/precision_bisect/*/*.*"), remove("workspace/precision_bisect/*/final"),
               remove("results/precision_example/precision_bisect")), 1, "verdict.json"),
    Case("local_errors_truncated", example("compare", "--config", "accuracy={rtol: 0.01}"),
         preserving_mtime("workspace/local/*/local.json", truncate), 1, "local.json"),
    Case("dump_truncated", example("compare", "--config", "accuracy={rtol: 0.01}"),
         preserving_mtime("workspace/dump/*/dump.h5", truncate), 1, "dump.h5"),
    Case("digest_cache_torn", example("fusion_bisect"), write("workspace/.digests.json", '{"/x": [1, '), exit=0),
    Case("stray_part_files", example("fusion_bisect"),
         chain(write("workspace/compile/.model.onnx.abc.part", b"x"), write("results/.summary.txt.abc.part", b"x")),
         exit=0),
    Case("model_replaced_with_same_size_and_mtime", example("compare", "-n"),
         lambda f: _same_size_same_mtime(f / "examples/transformer.onnx"), exit=0, check=jobs_planned),
]


def _same_size_same_mtime(path: Path) -> None:
    """Another model of the same size and mtime: one weight's lowest bit flipped, mtime put back."""
    stat, data = path.stat(), bytearray(path.read_bytes())
    weights = next(tensor.raw_data for tensor in onnx.load(path).graph.initializer if len(tensor.raw_data) >= 64)
    data[data.find(weights) + 32] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


HOSTILE = [
    Case("hostile_tensor_names", sm("compare"),
         chain(hostile_names_model("hostile.onnx", "hostile_samples"),
               config_file({"model": "hostile.onnx", "samples": "hostile_samples", "results": "results/hostile",
                            "compile": {"session_config": {}}})), exit=0, check=hostile_names_dumped),
]

CLI = [
    Case("compare_dump_missing", cli("compare", "missing.h5", "other.h5"), exit=2, names="missing.h5"),
    Case("compare_dump_not_hdf5", cli("compare", "text.h5", "text.h5"), write("text.h5", "not hdf5"), 2, "text.h5"),
    Case("compare_graph_broken_json", ("sh", "accubisect compare $(ls workspace/dump/*/dump.h5 | head -2) "
                                             "--graph graph.json"), write("graph.json", "{"), 2, "graph.json"),
    Case("compare_graph_a_list", ("sh", "accubisect compare $(ls workspace/dump/*/dump.h5 | head -2) "
                                       "--graph graph.json"), write("graph.json", "[]"), 2, "graph.json"),
    Case("compare_graph_wrong_object", ("sh", "accubisect compare $(ls workspace/dump/*/dump.h5 | head -2) "
                                             "--graph graph.json"), write("graph.json", '{"nodes": 3}'), 2,
         "graph.json"),
    Case("judge_report_missing", cli("judge", "nosuch.json"), exit=2, names="nosuch.json"),
    Case("judge_report_not_json", cli("judge", "r.json"), write("r.json", "<html>"), 2, "r.json"),
    Case("judge_report_empty_object", cli("judge", "r.json"), write("r.json", "{}"), 2, "r.json"),
    Case("judge_report_a_list", cli("judge", "r.json"), write("r.json", "[1, 2]"), 2, "r.json"),
    Case("judge_report_without_tensors", cli("judge", "r.json"),
         write("r.json", '{"accuracy": {"rtol": 0.1, "atol": 0.1, "ntol": 0, "cosine": null}}'), 2, "r.json"),
    Case("show_dump_missing", cli("show", "missing.h5"), exit=2, names="missing.h5"),
    Case("show_not_hdf5", cli("show", "text.h5"), write("text.h5", "x"), 2, "text.h5"),
    Case("show_hdf5_of_another_tool", cli("show", "other.h5"), foreign_hdf5, 2, "other.h5"),
    Case("compare_hdf5_of_another_tool", cli("compare", "other.h5", "other.h5"), foreign_hdf5, 2, "other.h5"),
    Case("show_into_a_closed_pipe", ("sh", "accubisect show $(ls workspace/dump/*/dump.h5 | head -1) | head -1"),
         exit=0),
    Case("rules_model_missing", cli("rules", "missing.onnx"), exit=2, names="missing.onnx"),
    Case("rules_model_zero_bytes", cli("rules", "zero.onnx"), write("zero.onnx", b""), 2, "zero.onnx"),
    Case("rules_model_garbage", cli("rules", "junk.onnx"), write("junk.onnx", bytes(range(256))), 2, "junk.onnx"),
    Case("rules_session_config_without_value", cli("rules", "examples/transformer.onnx", "--session-config",
                                                   "optimization.enable_gelu_approximation"), exit=2,
         names="optimization.enable_gelu_approximation"),
    Case("rules_session_config_unknown_key", cli("rules", "examples/transformer.onnx", "--session-config",
                                                 "no.such.key=1"), exit=2, names="no.such.key"),
    Case("reproduce_bundle_missing", cli("reproduce", "nosuch.tar.gz"), exit=2, names="nosuch.tar.gz"),
    Case("reproduce_not_a_tar", cli("reproduce", "x.tar.gz"), write("x.tar.gz", "hello"), 2, "x.tar.gz"),
    Case("reproduce_manifest_broken", cli("reproduce", "tampered.tar.gz"),
         repacked_bundle(lambda m: {**m, "manifest.json": b'{"format": 1, '}), 2, "tampered.tar.gz"),
    Case("reproduce_manifest_partial", cli("reproduce", "tampered.tar.gz"),
         repacked_bundle(manifest_edit(lambda m: m.pop("samples"))), 2, "samples"),
    Case("reproduce_manifest_config_invalid", cli("reproduce", "tampered.tar.gz"),
         repacked_bundle(manifest_edit(lambda m: m["config"]["accuracy"].update(rtol="tight"))), 2, "rtol"),
    Case("reproduce_member_missing", cli("reproduce", "tampered.tar.gz"),
         repacked_bundle(lambda m: {k: v for k, v in m.items() if not k.startswith("dumps/reference/")}), 2,
         "tampered.tar.gz"),
    Case("reproduce_report_not_json", cli("reproduce", "tampered.tar.gz"),
         repacked_bundle(lambda m: {**m, "report.json": b"<"}), 2, "tampered.tar.gz"),
    Case("reproduce_path_traversal", cli("reproduce", "evil.tar.gz"), traversal_bundle, 2, "evil.tar.gz",
         check=no_code_ran),
    Case("reproduce_runs_no_bundled_code", cli("reproduce", "tampered.tar.gz"), repacked_bundle(code_bundle), 2,
         "--trust-bundle-code", check=no_code_ran),
    Case("prune_keep_config_missing", cli("workspace", "prune", "--keep-config", "nosuch.yaml"), exit=2,
         names="nosuch.yaml"),
    Case("prune_keep_config_broken_yaml", cli("workspace", "prune", "--keep-config", "my.yaml"),
         write("my.yaml", "model: [\n"), 2, "my.yaml"),
    Case("prune_keep_config_invalid", cli("workspace", "prune", "--keep-config", "my.yaml"),
         config_file({"accuracy": {"rtoll": 1}}), 2, "rtoll"),
    Case("prune_negative_age", cli("workspace", "prune", "--older-than", "-1", "--delete"), exit=2,
         names="--older-than"),
    Case("prune_while_a_run_holds_the_workspace", cli("workspace", "prune", "--older-than", "0", "--delete"),
         snakemake_lock, 2, "snakemake --unlock"),
    Case("prune_workspace_is_a_file", cli("workspace", "prune", "--older-than", "0", "--workspace", "ws_file"),
         write("ws_file", "x"), 2, "ws_file"),
    Case("prune_lists_before_it_deletes", cli("workspace", "prune", "--older-than", "0"), exit=0,
         check=nothing_removed),
    Case("prune_old_part_inside_a_removed_folder", cli("workspace", "prune", "--older-than", "0.5", "--delete"),
         old_part_inside, exit=0, removes=True),
    Case("prune_keeps_what_the_precision_config_needs", cli("workspace", "prune", "--keep-config", PRECISION_CONFIG,
                                                            "--delete"), exit=0, removes=True,
         check=nothing_to_do("precision_bisect", PRECISION_CONFIG, "--config", "reduce={bisection: precision}")),
]


# ---------------------------------------------------------------- RECORDS: files of another model or sample


def _owned_by_example(folder: Path, sha256: str) -> bool:
    return sha256 == hashlib.sha256((folder / "examples/transformer.onnx").read_bytes()).hexdigest()


def dump_of(sample: str, variant: str | None = None, example: bool = True) -> Callable[[Path], Path]:
    """A dump of `sample` (of `variant`, any if None) of the bundled example's model, or with `example`
    False of the precision example's."""
    def find(folder: Path) -> Path:
        for path in sorted(folder.glob("workspace/dump/*/dump.h5")):
            with h5py.File(path, "r") as dump:
                attrs = dict(dump.attrs)
            if (attrs["sample"] == sample and variant in (None, attrs["variant"])
                    and _owned_by_example(folder, attrs["model_sha256"]) == example):
                return path
        raise AssertionError(f"no dump of {sample} {variant} (example: {example})")
    return find


def graph_of(example: bool) -> Callable[[Path], Path]:
    """The fusion-on graph.json of the bundled example's model, or with `example` False the precision example's."""
    def find(folder: Path) -> Path:
        for path in sorted(folder.glob("workspace/graph/*/graph.json")):
            graph = json.loads(path.read_text())
            if graph["variant"] == "fusion_on" and _owned_by_example(folder, graph["model_sha256"]) == example:
                return path
        raise AssertionError(f"no fusion_on graph.json (example: {example})")
    return find


def copied(files: dict[str, Callable[[Path], Path]]) -> Setup:
    """Each found file copied into the project folder under its name, outside results/ and workspace/, so that
    a command can name it."""
    def setup(folder: Path) -> None:
        for name, find in files.items():
            shutil.copy(find(folder), folder / name)
    return setup


def as_format_1(relative: str, dropped: tuple[str, ...]) -> Setup:
    """The JSON record at `relative` rewritten as the previous format wrote it: format 1, without `dropped`."""
    def setup(folder: Path) -> None:
        data = json.loads((folder / relative).read_text())
        (folder / relative).write_text(json.dumps({**{k: v for k, v in data.items() if k not in dropped},
                                                   "format": 1}))
    return setup


def declared_shape_model(relative: str, samples: str) -> Setup:
    """As old PyTorch exports of CTC heads are: the output is declared [1, seqlen] and is [2, 1, 4]; golden
    outputs made by the model itself (ONNX Runtime warns and runs it).

        x[1, 4] ─ Concat(x, x) ─ Unsqueeze(axis 1) ─ y  (declared [1, seqlen])
    """
    def setup(folder: Path) -> None:
        nodes = [helper.make_node("Concat", ["x", "x"], ["c"], axis=0, name="concat"),
                 helper.make_node("Unsqueeze", ["c", "axes"], ["y"], name="unsqueeze")]
        graph = helper.make_graph(nodes, "declared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])],
                                  [onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        onnx.save(model, folder / relative)
        x = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)
        produced = np.concatenate([x, x])[:, None, :]
        (folder / samples).mkdir()
        np.savez(folder / samples / "sample0_inputs.npz", x=x)
        np.savez(folder / samples / "sample0_outputs.npz", y=produced)
    return setup


def not_written(relative: str) -> Callable[[Path, subprocess.CompletedProcess], None]:
    def check(folder: Path, result: subprocess.CompletedProcess) -> None:
        assert not (folder / relative).exists()
    return check


def compare_passes_on_the_real_shape(folder: Path, result: subprocess.CompletedProcess) -> None:
    report = json.loads((folder / "results/declared/compare/report.json").read_text())
    assert report["passed"] and report["verdicts"][0]["against"] == "golden", report["verdicts"]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING accubisect: ")]
    assert len(warnings) == 1 and "declared_samples/sample0_outputs.npz: output 'y' has rank 3" in warnings[0]


# ---------------------------------------------------------------- ONE_CHECK: one accuracy check, repro.py's exits


FRACTION = "accuracy={ntol: 0.03, min_pass_fraction: 0.75}"  # the example's candidate then fails 1 of 4 samples
PRECISION_REDUCE = "results/precision_example/reduce"


def one_verdict(folder: Path, result: subprocess.CompletedProcess) -> None:
    """compare, fusion_bisect's summary and result.json all say the candidate passes at 3 of 4 samples."""
    compare = json.loads((folder / "results/compare/report.json").read_text())
    verdict = json.loads((folder / "results/fusion_bisect/result.json").read_text())["fusion_on_verdict"]
    assert compare["passed"] and verdict["passed"], (compare["passed"], verdict)
    assert "PASS on 3 of 4, sample1 failing (accuracy.min_pass_fraction 0.75)" in (
        folder / "results/compare/summary.txt").read_text()
    assert "nothing to bisect: the model passes" in (folder / "results/fusion_bisect/summary.txt").read_text()


def not_said(text: str) -> Callable[[Path, subprocess.CompletedProcess], None]:
    def check(folder: Path, result: subprocess.CompletedProcess) -> None:
        assert text not in result.stdout + result.stderr
    return check


def repro(arguments: str = "", folder: str = "results/reduce", python: str = "python repro.py") -> tuple[str, ...]:
    """repro.py run as a user runs it, in the folder reduce wrote."""
    return ("sh", f"cd {folder} && {python} {arguments}")


WITHOUT_ACCUBISECT = ("python -c \"import runpy, sys; sys.modules['accubisect'] = None; sys.argv = ['repro.py']; "
                      "runpy.run_path('repro.py', run_name='__main__')\"")


# ---------------------------------------------------------------- PUBLISHED: answers whole; prune's own folders


REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def scaled_weights(relative: str) -> Setup:
    """The model replaced in place by one with the same inputs and outputs and other weights (its first large
    weight times 1.5): the golden outputs beside it no longer fit, so every run of it fails its check."""
    def setup(folder: Path) -> None:
        model = onnx.load(folder / relative)
        weight = next(tensor for tensor in model.graph.initializer if len(tensor.raw_data) >= 256)
        weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * 1.5, weight.name))
        onnx.save(model, folder / relative)
    return setup


def user_folders(root: str) -> Setup:
    """The user's own folders under stage names: one named like a key (without its stage's first file), one not,
    each with a file and an old `.part` file."""
    def setup(folder: Path) -> None:
        for name in ("compile/0123456789abcdef", "reduce/inputs"):
            write(f"{root}/{name}/model.onnx", b"the user's")(folder)
            write(f"{root}/{name}/.model.onnx.x.part", b"the user's")(folder)
            os.utime(folder / root / name / ".model.onnx.x.part", (1, 1))
    return setup


def folders_whole(folder: Path, result: subprocess.CompletedProcess) -> None:
    """Every folder under results/ holds exactly the files its manifests list, with their sha256 (one run's set,
    whatever the run that failed did), and no publish left its staging folder."""
    results = folder / "results"
    manifests: dict[Path, dict[str, str | None]] = {}
    for manifest in results.rglob("published*.json"):
        listed = manifests.setdefault(manifest.parent, {})
        listed[manifest.name] = None
        listed.update({name: entry["sha256"] for name, entry in json.loads(manifest.read_text())["files"].items()})
    assert manifests, f"no published.json under {results}: nothing to check"
    files = [path for path in results.rglob("*") if path.is_file()]
    assert all(any(path.is_relative_to(target) for target in manifests) for path in files), files
    for target, listed in manifests.items():
        present = {path.relative_to(target).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
                   for path in target.rglob("*") if path.is_file()}
        assert present.keys() == listed.keys(), target
        assert all(present[name] == digest for name, digest in listed.items() if digest), target
    assert not [path for path in results.rglob(".*") if path.suffix in (".new", ".old")]


def examples_intact(folder: Path, result: subprocess.CompletedProcess) -> None:
    assert "0 item(s)" in result.stdout, result.stdout
    for path in REPO_EXAMPLES.rglob("*"):
        if path.is_file():
            assert (folder / "examples" / path.relative_to(REPO_EXAMPLES)).read_bytes() == path.read_bytes(), path


def user_folders_intact(root: str) -> Callable[[Path, subprocess.CompletedProcess], None]:
    def check(folder: Path, result: subprocess.CompletedProcess) -> None:
        assert "0 item(s)" in result.stdout, result.stdout
        for name in ("compile/0123456789abcdef", "reduce/inputs"):
            assert all((folder / root / name / file).exists() for file in ("model.onnx", ".model.onnx.x.part"))
    return check


def every_stage_folder_listed(folder: Path, result: subprocess.CompletedProcess) -> None:
    """Prune finds every folder the runs made (each holds its stage's marker), and nothing else."""
    made = {f"workspace/{path.parent.name}/{path.name}" for path in folder.glob("workspace/*/*") if path.is_dir()}
    listed = {line.split()[2] for line in result.stdout.splitlines() if line.startswith("would remove")}
    assert made and listed == made, made ^ listed


def no_stale_samples(folder: Path, result: subprocess.CompletedProcess) -> None:
    for kind in ("inputs", "expected"):
        assert sorted(path.name for path in (folder / "results/reduce" / kind).iterdir()) == [
            "sample0.npz", "sample1.npz", "sample2.npz"]
    folders_whole(folder, result)


# Issue 21's cases ("Answers that hold where they are deployed"), one list per theme.
ONE_CHECK: list[Case] = [  # one accuracy check and one verdict everywhere; val_func in reduce; repro.py's exits
    Case("one_check_pass_fraction_one_verdict", example("fusion_bisect", "--config", FRACTION), exit=0,
         check=one_verdict, redone=("results/compare/*", "results/fusion_bisect/*")),
    Case("one_check_min_pass_fraction_zero", example("compare", "--config", "accuracy={min_pass_fraction: 0}"),
         exit=1, names="accuracy.min_pass_fraction"),
    Case("one_check_reduce_with_a_passing_val_func", sm("reduce"),
         val_func("vf_pass", "def check(r, c):\n    return True\n"), 1,
         ("the candidate passes the accuracy check", "val_func vf_pass:check"), check=not_said("still fail"),
         redone=("results/compare/*",)),
    Case("repro_input_missing", repro(), remove("results/reduce/inputs/sample0.npz"), 2, "inputs/sample0.npz"),
    Case("repro_model_missing", repro(), remove("results/reduce/model.onnx"), 2, "model.onnx"),
    Case("repro_expected_truncated", repro(), preserving_mtime("results/reduce/expected/sample1.npz", truncate), 2,
         "expected/sample1.npz"),
    Case("repro_input_wrong_key", repro(), edit_npz("results/reduce/inputs/sample0.npz",
                                                    lambda arrays: {f"{k}_renamed": v for k, v in arrays.items()}),
         2, ("inputs/sample0.npz", "_renamed")),
    Case("repro_switch_file_malformed", repro("--fusion-switch ../../switch.cfg"),
         write("switch.cfg", '{"Switch": {"GraphFusion": "off"}}'), 2, "switch.cfg"),
    Case("repro_keep_dtype_names_no_node", repro("--keep-dtype ../../../keep.txt", PRECISION_REDUCE),
         write("keep.txt", "no_such_node\n"), 2, ("keep.txt", "names none of the")),
    Case("repro_precision_without_accubisect", repro(folder=PRECISION_REDUCE, python=WITHOUT_ACCUBISECT), exit=2,
         names="accubisect, which cannot be imported"),
]
# ---------------------------------------------------------------- DEPLOYED: the precision answer in the user's graph


def deployable_project(name: str) -> Setup:
    """A model of tests/e2e/test_deployable_e2e.py whose compiled graph misleads about fp16 in the user's own graph
    (`cbn`: a Conv and a BatchNorm of variance 1e8 that ConvBNFusion folds; `shift`: a MatMul that
    MatMulAddFusion joins to an Add that must stay fp32), its samples and `name`.yaml."""
    from deploy_models import conv_batchnorm, project, shifted_sum

    build, shape = {"cbn": (conv_batchnorm, (1, 3, 8, 8)), "shift": (shifted_sum, (4, 8))}[name]
    return lambda folder: project(folder, build, name, shape)


def keeps(name: str, nodes: str, how: str) -> Callable[[Path, subprocess.CompletedProcess], None]:
    """results/`name`/precision_bisect keeps `nodes` (keep_dtype.txt), reached `how` in the user's graph, and
    removing any one of them fails there; no line says the model passes as it is."""
    def check(folder: Path, result: subprocess.CompletedProcess) -> None:
        base = folder / "results" / name / "precision_bisect"
        assert (base / "keep_dtype.txt").read_text().split() == nodes.split()
        record = json.loads((base / "result.json").read_text())
        assert record["deployed"]["how"] == how and record["final_verdict"]["passed"]
        assert json.loads((base / "finalize.json").read_text())["passed"]
        kept = set(nodes.split())
        for node in kept:
            assert any(set(p["off"]) == kept - {node} and not p["passed"] for p in record["deployed"]["probes"]), node
        assert "nothing to fix" not in result.stdout + result.stderr
    return check


# precision_result's outputs, which Snakemake deletes before it runs the job again
RESULT_JOB_FILES = ("report.html", "summary.txt", "result.log", "keep_dtype.txt", "modify_mixlist.json")
DEPLOYED: list[Case] = [  # the precision answer judged, and minimal, in the deployable model's graph
    Case("deployed_compiled_pass_that_fails_in_the_users_graph", sm("precision_bisect", configfile="cbn.yaml"),
         deployable_project("cbn"), exit=0, check=keeps("cbn", "bn", "searched again")),
    Case("deployed_answer_made_minimal_in_the_users_graph", sm("precision_bisect", configfile="shift.yaml"),
         deployable_project("shift"), exit=0, check=keeps("shift", "add sub", "minimized")),
    Case("deployed_record_damaged", sm("precision_bisect", configfile=PRECISION_CONFIG),
         chain(preserving_mtime("workspace/precision_bisect/*/deployed.json", truncate),
               remove("workspace/precision_bisect/*/result.json")), 1, "deployed.json",
         redone=tuple(f"workspace/precision_bisect/*/{name}" for name in RESULT_JOB_FILES)),
]
PUBLISHED: list[Case] = [  # answer files published together or not at all; prune removes only its own stages
    Case("published_answer_kept_whole_by_a_failed_rerun",
         example("fusion_bisect", "--config", "bisect={rules: [MatMulAddFusion]}"), exit=1, names="bisect.rules",
         check=folders_whole),
    Case("published_nothing_mixed_after_the_model_is_replaced_in_place",
         ("snakemake", "fusion_bisect", "reduce", "--configfile", EXAMPLE_CONFIG),
         scaled_weights("examples/transformer.onnx"), 1, ("fusion_off", "golden outputs"),
         redone=("results/compare/*",), check=folders_whole),
    Case("published_no_stale_files_of_a_removed_sample", example("reduce", "--config", "dump={samples: '0-2'}"),
         exit=0, redone=("results/*/*", "results/reduce/*/*"), check=no_stale_samples),
    Case("published_workspace_same_as_results", sm("compare"), config_file({"workspace": "out", "results": "out"}),
         1, ("workspace: out", "results: out", "the same folder")),
    Case("published_results_inside_workspace", cli("workspace", "prune", "--keep-config", "my.yaml", "--delete"),
         config_file({"results": "workspace/answers"}), 2, ("workspace: workspace", "results: workspace/answers")),
    Case("prune_spares_the_examples_folder", cli("workspace", "prune", "--workspace", "examples", "--older-than",
                                                 "0", "--delete"), exit=0, check=examples_intact),
    Case("prune_spares_user_folders_named_like_stages", cli("workspace", "prune", "--workspace", "mine",
                                                            "--older-than", "0", "--delete"),
         user_folders("mine"), exit=0, check=user_folders_intact("mine")),
    Case("prune_finds_every_folder_the_runs_made", cli("workspace", "prune", "--older-than", "0"), exit=0,
         check=every_stage_folder_listed),
]
RECORDS: list[Case] = [  # files of another model or run refused; declared output shapes as hints
    Case("records_compare_with_another_models_graph", cli("compare", "ref.h5", "cand.h5", "--graph", "other.json"),
         copied({"ref.h5": dump_of("sample0", "fusion_off"), "cand.h5": dump_of("sample0", "fusion_on"),
                 "other.json": graph_of(example=False)}), 2, ("other.json", "cand.h5")),
    Case("records_compare_dumps_of_two_models", cli("compare", "ref.h5", "cand.h5"),
         copied({"ref.h5": dump_of("sample0", "fusion_off"), "cand.h5": dump_of("sample0", example=False)}), 2,
         ("ref.h5", "cand.h5", "different models")),
    Case("records_compare_dumps_of_two_samples", cli("compare", "ref.h5", "cand.h5"),
         copied({"ref.h5": dump_of("sample0", "fusion_off"), "cand.h5": dump_of("sample1", "fusion_on")}), 2,
         ("ref.h5", "cand.h5", "sample0 and sample1")),
    Case("records_compare_with_a_format_1_graph", cli("compare", "ref.h5", "cand.h5", "--graph", "old.json"),
         chain(copied({"ref.h5": dump_of("sample0", "fusion_off"), "cand.h5": dump_of("sample0", "fusion_on"),
                       "old.json": graph_of(example=True)}), as_format_1("old.json", ("model_sha256", "nested"))), 2,
         ("old.json", "format: 2 was expected")),
    Case("records_judge_a_format_1_report", cli("judge", "old.json"),
         chain(copied({"old.json": lambda folder: folder / "results/compare/report.json"}),
               as_format_1("old.json", ("model_sha256",))), 2, ("old.json", "format: 2 was expected")),
    Case("records_explorer_data_with_another_model", cli("explorer-data", "results/compare/report.json", "--model",
                                                         "examples/precision/extractor.onnx", "-o", "nd.json"),
         exit=2, names=("extractor.onnx", "results/compare/report.json"),
         check=not_written("nd.json")),
    Case("records_golden_shaped_as_produced_not_as_declared", sm("compare"),
         chain(declared_shape_model("declared.onnx", "declared_samples"),
               config_file({"model": "declared.onnx", "samples": "declared_samples", "results": "results/declared",
                            "compile": {"session_config": {}}})),
         exit=0, check=compare_passes_on_the_real_shape),
]


# ---------------------------------------------------------------- FAILURES: full disks, read-only folders, budgets


def in_own_mounts(*lines: str | Callable[[Path], str]) -> Setup:
    """Writes `mounts.sh`, which runs `lines` (mount commands, each given or made from the project folder),
    then its arguments. A case runs it as `unshare --mount sh mounts.sh COMMAND` (`mounted`): the mounts exist
    in that command's own mount namespace and vanish with it, so nothing is left mounted and the files
    beneath them are what the case checks afterwards. A genuinely full disk (a small tmpfs) and a genuinely
    read-only folder (a read-only bind mount; root, as CI runs, ignores permission bits) need root: elsewhere
    the case is skipped, saying why."""
    def setup(folder: Path) -> None:
        if os.geteuid() != 0 or not shutil.which("unshare") or subprocess.run(
                ["unshare", "--mount", "true"], capture_output=True).returncode:
            pytest.skip("needs root and unshare --mount, to mount a small tmpfs or a read-only bind mount")
        made = [line(folder) if callable(line) else line for line in lines]
        (folder / "mounts.sh").write_text("set -e\n" + "".join(f"{line}\n" for line in made) + 'exec "$@"\n')
    return setup


def mounted(target: str, *arguments: str) -> tuple[str, ...]:
    """`snakemake TARGET ARGUMENTS` inside the mounts `in_own_mounts` wrote."""
    return ("sh", " ".join(("unshare --mount sh mounts.sh snakemake", target, *arguments, "--cores 2")))


def full_disk(relative: str, size: str = "16k", inodes: int | None = None) -> str:
    """A tmpfs of `size` bytes (and at most `inodes` files and folders, its own root one of them) over
    `relative`, hiding what is there: the jobs that wrote it run again and fill it."""
    return f"mount -t tmpfs -o size={size}{f',nr_inodes={inodes}' if inodes else ''} tmpfs {relative}"


def read_only(relative: str) -> str:
    return f"mount --bind {relative} {relative}; mount -o remount,bind,ro {relative}"


def example_dump_folder(folder: Path) -> str:
    return str(example_dumps(folder, "fusion_on")[0].parent.relative_to(folder))


def format_1_dump(relative: str | None = None) -> Setup:
    """A dump as format 1 left it (its `dump_format` attribute 1): the first dump of the workspace marked in
    place, mtime kept, or with `relative` a copy of it there."""
    def setup(folder: Path) -> None:
        dump = sorted(folder.glob("workspace/dump/*/dump.h5"))[0]
        if relative:
            dump = Path(shutil.copy(dump, folder / relative))
        stat = dump.stat()
        with h5py.File(dump, "r+") as file:
            file.attrs["dump_format"] = 1
        os.utime(dump, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return setup


def says_nothing_of_best_so_far(folder: Path, result: subprocess.CompletedProcess) -> None:
    assert "best so far" not in result.stdout + result.stderr


def answers_shown(folder: Path, result: subprocess.CompletedProcess) -> None:
    assert "results/fusion_bisect/fusion_switch.cfg" in result.stdout, result.stdout


FIRST_DUMP_FOLDER = "$(dirname $(ls workspace/dump/*/dump.h5 | LC_ALL=C sort | head -1))"
NO_SPACE = ("No space left on device", "free space there and rerun")
READ_ONLY = ("Read-only file system", "make it writable")

FAILURES: list[Case] = [  # disk full, read-only folders, Ctrl-C, odd budgets: one line each
    Case("failures_disk_full_during_a_dump", mounted("dump", "--configfile", EXAMPLE_CONFIG),
         in_own_mounts(lambda folder: full_disk(example_dump_folder(folder))), 1, ("workspace/dump/", *NO_SPACE)),
    Case("failures_disk_full_during_a_search", mounted("fusion_bisect", "--configfile", EXAMPLE_CONFIG),
         chain(remove("workspace/fusion_bisect"), remove("results/fusion_bisect"),
               in_own_mounts(full_disk("workspace/probe", inodes=1))), 1, ("workspace/probe", *NO_SPACE)),
    Case("failures_disk_full_while_publishing", mounted("compare", "--configfile", EXAMPLE_CONFIG),
         in_own_mounts(full_disk("results", size="4k")), 1, ("results", *NO_SPACE),
         redone=("workspace/compare/*/publish.log",)),
    Case("failures_read_only_results_with_answers_to_publish", mounted("compare", "--configfile", EXAMPLE_CONFIG),
         chain(remove("results/compare"), in_own_mounts(read_only("results"))), 1, ("results:", *READ_ONLY)),
    Case("failures_read_only_workspace_with_a_dump_to_make", mounted("dump", "--configfile", EXAMPLE_CONFIG),
         chain(remove_dump("fusion_on"), in_own_mounts(read_only("workspace"))), 1,
         ("workspace/dump:", *READ_ONLY)),
    Case("failures_read_only_project_fully_cached", mounted("fusion_bisect", "--configfile", EXAMPLE_CONFIG),
         in_own_mounts(read_only("workspace"), read_only("results")), exit=0, check=answers_shown),
    Case("failures_explorer_data_output_a_folder", cli("explorer-data", "results/compare/report.json", "-o",
                                                       "results"), exit=2, names=("-o results", "a folder")),
    Case("failures_explorer_data_output_under_a_file",
         cli("explorer-data", "results/compare/report.json", "-o", f"{EXAMPLE_CONFIG}/node_data.json"), exit=2,
         names=f"{EXAMPLE_CONFIG} is a file, not a folder"),
    Case("failures_explorer_data_output_unwritable",
         cli("explorer-data", "results/compare/report.json", "-o", "/sys/node_data.json"), exit=2,
         names=("-o /sys/node_data.json", "cannot write it")),
    Case("failures_max_minutes_infinite", sm("fusion_bisect"), config_file({"bisect": {"max_minutes": float("inf")}}),
         1, ("bisect.max_minutes: inf", "leave it null")),
    Case("failures_max_minutes_spent_before_anything_passed",
         example("fusion_bisect", "--config", "accuracy={rtol: 0.002}", "bisect={max_minutes: 1e-6}"), exit=1,
         names=("bisect.max_minutes (1e-06)", "before any configuration passed"), check=says_nothing_of_best_so_far),
    Case("failures_show_a_format_1_dump_copied_elsewhere", cli("show", "old.h5"), format_1_dump("old.h5"), 2,
         ("old.h5: dump format 1", "dump the model again", "snakemake dump")),
    Case("failures_show_a_format_1_dump_from_its_folder", ("sh", f"cd {FIRST_DUMP_FOLDER} && accubisect show dump.h5"),
         format_1_dump(), 2, ("dump.h5: dump format 1", "delete /", "/workspace/dump/", "rerun the dump stage")),
]


# ---------------------------------------------------------------- YOUR_PROJECT (issue 25): accubisect run / init


def file_kept(relative: str, content: str) -> Callable[[Path, subprocess.CompletedProcess], None]:
    def check(folder: Path, result: subprocess.CompletedProcess) -> None:
        assert (folder / relative).read_text() == content
    return check


YOUR_PROJECT = [
    Case("run_configfile_missing", cli("run", "compare", "--configfile", "nosuch.yaml"), exit=2, names="nosuch.yaml"),
    Case("run_nothing_configured", cli("run", "compare"), exit=2, names=("no model configured", "accubisect init")),
    Case("run_profile_unknown", cli("run", "compare", "--configfile", EXAMPLE_CONFIG, "--profile", "nosuch"), exit=2,
         names="--profile nosuch"),
    Case("run_model_missing", cli("run", "compare", "--model", "nosuch.onnx", "--samples", "examples/samples"),
         exit=1, names="nosuch.onnx"),
    Case("run_finds_the_finished_project_cached", cli("run", "compare", "--configfile", EXAMPLE_CONFIG, "--cores",
                                                      "2"), exit=0, check=snakemake_says("Nothing to be done")),
    Case("init_over_the_users_config", cli("init"), write("config.yaml", "model: mine.onnx\n"), 2, "config.yaml",
         check=file_kept("config.yaml", "model: mine.onnx\n")),
]

# ---------------------------------------------------------------- OPENVINO (issue 24): backend openvino-cpu
# The CPU decides which dtype runs (docs/backends.md): a case needing one this CPU lacks, or runs, is left out.
RUNS = [dtype for dtype, capability in CAPABILITY.items() if capability in cpu_capabilities()]
LACKS = [dtype for dtype in CAPABILITY if dtype not in RUNS]


def on_openvino(dtype: str, session_config: bool = False) -> Setup:
    """The example on openvino-cpu in `dtype`; with `session_config`, its ONNX Runtime session entry kept."""
    return config_file({"backend": "openvino-cpu", "precision": {"dtype": dtype},
                        **({} if session_config else {"compile": {"session_config": None}})})


OPENVINO = [
    Case("openvino_rules_listing", cli("rules", "examples/transformer.onnx", "--backend", "openvino-cpu"), exit=2,
         names=("backend: openvino-cpu", "accubisect rules")),
    *[Case("openvino_dtype_the_cpu_lacks", sm("compare"), on_openvino(dtype), 1,
           ("precision.dtype", CAPABILITY[dtype], "OPTIMIZATION_CAPABILITIES")) for dtype in LACKS[:1]],
    *[Case("openvino_with_ort_session_entries", sm("compare"), on_openvino(dtype, session_config=True), 1,
           "compile.session_config") for dtype in RUNS[:1]],
    *[Case("openvino_target_needing_fusion_rules", sm("reduce"), on_openvino(dtype), 1,
           ("backend: openvino-cpu has no fusion rules", "rule reduce_search", "fusion_bisect")) for dtype in RUNS[:1]],
]

# ---------------------------------------------------------------- PROTOCOL (issue 23, G): one bisection protocol
# Golden outputs the reference itself fails: each kind stops before its search with the one precondition line.
def golden_off(relative: str) -> Setup:
    return edit_npz(relative, lambda a: {"y": (a["y"] + 1).astype(np.float32)})


PROTOCOL = [
    Case("precondition_fusion_reference_fails", example("fusion_bisect"),
         golden_off("examples/samples/sample0_outputs.npz"), 1,
         ("the model fails even with fusion off (fusion_off fails against the golden outputs)",
          "fusion is not the cause")),
    Case("precondition_precision_reference_fails", sm("precision_bisect", configfile=PRECISION_CONFIG),
         golden_off("examples/precision/samples/sample0_outputs.npz"), 1,
         ("the model fails even in fp32 (", "fails against the golden outputs): precision is not the cause")),
]

# ---------------------------------------------------------------- WEIGHTS (issue 22, A): weights held once
def cut_data_model(relative: str) -> Setup:
    """The example model with its weights in a side file cut to half its size, as a copy stopped short
    leaves it: refused while planning, from the file's size (no weight is read)."""
    def setup(folder: Path) -> None:
        model = onnx.load(folder / "examples/transformer.onnx")
        onnx.save(model, folder / relative, save_as_external_data=True, location="weights.bin", size_threshold=0)
        data = (folder / relative).with_name("weights.bin")
        os.truncate(data, data.stat().st_size // 2)
    return setup


def hybrid_runs_from_elsewhere(folder: Path, result: subprocess.CompletedProcess) -> None:
    """The published hybrid.onnx, moved with its hybrid.onnx.data (republished) to another folder, runs there
    (graph optimization off), and every published set is whole."""
    import onnxruntime as ort

    moved = Path(shutil.copytree(folder / "results/fusion_bisect", folder.parent / "moved"))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(moved / "hybrid.onnx"), options, providers=["CPUExecutionProvider"])
    assert np.isfinite(session.run(None, dict(np.load(folder / "examples/samples/sample0_inputs.npz")))[0]).all()
    folders_whole(folder, result)


WEIGHTS = [
    model_case("model_external_data_cut_short", cut_data_model("bad.onnx"), ("bad.onnx", "weights.bin", "cut short")),
    Case("published_hybrid_data_lost", example("fusion_bisect"), remove("results/fusion_bisect/hybrid.onnx.data"),
         exit=0, check=hybrid_runs_from_elsewhere,
         redone=("results/fusion_bisect/*", "workspace/fusion_bisect/*/publish.*")),
]

# ---------------------------------------------------------------- OPENVINO PRECISION (issue 24 item 5, F2)
# precision_bisect runs on openvino-cpu (IR marks); the precision target, a mode assigned node by node on the
# compiled graph, does not: one line before any job, naming the target that does.
OPENVINO_PRECISION = [
    *[Case("openvino_precision_target", sm("precision"), on_openvino(dtype), 1,
           ("has no precision assigned by mode on the compiled graph", "rule assign_precision", "precision_bisect"))
      for dtype in RUNS[:1]],
]

# ---------------------------------------------------------------- RECORD_FORMATS (issue 23, J): typed, versioned files
def deployed_format_1(path: Path) -> None:
    """deployed.json as format 1 wrote it: finalize.json's fields in `model` without a format of their own."""
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "format": 1, "model": {k: v for k, v in data["model"].items()
                                                                if k != "format"}}))


RECORD_FORMATS = [
    Case("deployed_record_of_the_previous_format", sm("precision_bisect", configfile=PRECISION_CONFIG),
         chain(preserving_mtime("workspace/precision_bisect/*/deployed.json", deployed_format_1),
               remove("workspace/precision_bisect/*/result.json")), 1, ("deployed.json", "format 1", "delete"),
         redone=tuple(f"workspace/precision_bisect/*/{name}" for name in RESULT_JOB_FILES)),
]


# ---------------------------------------------------------------- DIGEST_CACHE (issue 23, G3): .digests.json versioned
def digests_of_the_previous_format(folder: Path) -> None:
    """.digests.json as accubisect wrote it before its format (the entries alone), its entry for the example's
    model one the cache would trust but holding another digest: read as a cache of today's format, every stage
    key would change and the whole example run again."""
    model = (folder / "examples/transformer.onnx").resolve()
    stat = model.stat()
    entry = [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ctime_ns + 10**10, "0" * 64]
    (folder / "workspace/.digests.json").write_text(json.dumps({str(model): entry}))


def digests_rebuilt(folder: Path, result: subprocess.CompletedProcess) -> None:
    assert "Nothing to be done" in result.stdout + result.stderr
    saved = json.loads((folder / "workspace/.digests.json").read_text())
    model = (folder / "examples/transformer.onnx").resolve()
    assert saved["format"] == DIGESTS_FORMAT
    assert saved["entries"][str(model)][5] == hashlib.sha256(model.read_bytes()).hexdigest()


DIGEST_CACHE = [
    Case("digest_cache_of_the_previous_format", example("fusion_bisect", "-n"), digests_of_the_previous_format,
         exit=0, check=digests_rebuilt),
]


# ---------------------------------------------------------------- REDUCE_DRIVER (issue 23, R): reduce under the driver
def damaged_everywhere(relative_glob: str) -> Setup:
    """Every file `relative_glob` matches damaged in place, mtimes kept: which of them a run reads first
    depends on keys (both examples' reduce verdicts share one store folder)."""
    def setup(folder: Path) -> None:
        for pick in range(len(list(folder.glob(relative_glob)))):
            preserving_mtime(relative_glob, truncate, pick)(folder)
    return setup


REDUCE_DRIVER = [  # the sides' verdicts, read by the driver and the known end's precondition, refused in one line
    Case("reduce_probe_verdict_truncated", example("reduce"),
         chain(damaged_everywhere("workspace/reduce_probe/*/verdict.json"), remove("workspace/reduce/*/*"),
               remove("results/reduce")), 1, "verdict.json"),
]

# ---------------------------------------------------------------- LEFTOVERS (issue 23, T): a compile names its model
def topk_beyond_its_axis(relative: str, samples: str = "tiny_samples") -> Setup:
    """x[1, 4] ─ TopK(k = 9) ─ y, with tiny_model's samples: OpenVINO reads it, its CPU plugin refuses to
    compile it (k beyond the axis)."""
    def setup(folder: Path) -> None:
        tiny_model(relative, samples=samples)(folder)
        node = helper.make_node("TopK", ["x", "k"], ["y", "indices"], name="top")
        graph = helper.make_graph([node], "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor("k", TensorProto.INT64, [1], [9])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        (folder / relative).write_bytes(model.SerializeToString())
    return setup


LEFTOVERS = [
    *[Case("openvino_compile_refused_names_the_model", sm("compare"),
           chain(topk_beyond_its_axis("bad/topk.onnx"), config_file({
               "backend": "openvino-cpu", "precision": {"dtype": dtype}, "compile": {"session_config": None},
               "model": "bad/topk.onnx", "samples": "tiny_samples"})), 1,
           ("bad/topk.onnx: OpenVINO cannot compile it for the CPU", "TopK", "backend: ort-cpu"))
      for dtype in RUNS[:1]],
]

# ---------------------------------------------------------------- DEPLOY_DRIVER (issue 23, S): the deploy pass driven
def pass_stopped(folder: Path, result: subprocess.CompletedProcess) -> None:
    """The pass in shift's own graph stopped by bisect.max_probes (3) while giving nodes back: it keeps the passing
    configuration with the fewest nodes so far, lists each verdict once, and the summary says it is not proven
    minimal."""
    base = folder / "results/shift/precision_bisect"
    record = json.loads((base / "result.json").read_text())
    deployed = record["deployed"]
    assert (deployed["how"], record["minimal"], deployed["stopped_by"]) == ("minimized", False, "bisect.max_probes (3)")
    assert record["culprits"] == ["add", "sub"] and record["final_verdict"]["passed"]
    assert [sorted(probe["off"]) for probe in deployed["probes"]] == [["add", "mm", "sub"], ["add", "sub"], ["add"]]
    assert (base / "keep_dtype.txt").read_text() == "add\nsub\n"
    assert "bisect.max_probes (3) stopped the pass: not proven minimal" in (base / "summary.txt").read_text()


DEPLOY_DRIVER = [  # precision_deploy's pass in the user's graph under the driver's budget
    Case("deployed_pass_stopped_by_the_probe_budget", sm("precision_bisect", "--config", "bisect={max_probes: 3}",
                                                           configfile="shift.yaml"),
         deployable_project("shift"), exit=0, check=pass_stopped),
]

CATALOGUE = (MODELS + SAMPLES + GOLDEN + CONFIG + VAL_FUNCS + WORKSPACE + HOSTILE + CLI + ONE_CHECK + DEPLOYED
             + PUBLISHED + RECORDS + FAILURES + YOUR_PROJECT + OPENVINO + PROTOCOL + WEIGHTS + OPENVINO_PRECISION
             + RECORD_FORMATS + DIGEST_CACHE + REDUCE_DRIVER + LEFTOVERS + DEPLOY_DRIVER)


def test_the_catalogue_is_large_and_its_names_unique():
    assert len(CATALOGUE) >= 80
    assert len({case.name for case in CATALOGUE}) == len(CATALOGUE)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A project where every kind of stage has run: fusion and precision bisections, a reduce of each (their
    repro.py), and a bundle."""
    folder = copy_workflow(tmp_path_factory.mktemp("finished"))
    snakemake(folder, "fusion_bisect", "bundle", "reduce", "--configfile", EXAMPLE_CONFIG)
    snakemake(folder, "precision_bisect", "reduce", "--configfile", PRECISION_CONFIG, "--config",
              "reduce={bisection: precision}")
    return folder


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name, marks=[pytest.mark.xfail(reason=case.gap,
                                                                                        strict=True)] * bool(case.gap))
                                  for case in CATALOGUE])
def test_bad_input(case: Case, finished: Path, tmp_path: Path):
    folder = tmp_path / "project"
    shutil.copytree(finished, folder, symlinks=True)
    case.setup(folder)
    before = _contents(folder)
    result = _run(case.command, folder)
    output = result.stdout + result.stderr
    assert result.returncode == case.exit, output
    assert "Traceback" not in output, output
    errors = sorted({_message(line) for line in output.splitlines() if _message(line)})
    if case.names is None:
        assert not errors, output
    else:
        assert len(errors) == 1, output
        assert all(name in errors[0] for name in _tuple(case.names)), errors[0]
    if not case.removes:
        after = _contents(folder)
        changed = [path for path, digest in before.items() if after.get(path) != digest
                   and not any(Path(path).match(glob) for glob in case.redone)]
        assert not changed, f"changed or lost: {changed}"
    if case.check:
        case.check(folder, result)


def _tuple(names: str | tuple[str, ...]) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else names


def _message(line: str) -> str:
    for prefix in ("accubisect: ", "ERROR accubisect: "):
        if line.startswith(prefix):
            return line.removeprefix(prefix)
    return ""


def _run(command: tuple[str, ...], folder: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    if command[0] == "snakemake":
        argv = [sys.executable, "-m", "snakemake", *command[1:], "--cores", "2"]
    elif command[0] == "accubisect":
        argv = [ACCUBISECT, *command[1:]]
    else:
        argv = ["bash", "-c", command[1]]
    return subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=300, env=environment)


def _contents(folder: Path) -> dict[str, str]:
    """Digest of every results/ and workspace/ file except the digest cache (a cache, rewritten at will)."""
    files = [path for top in ("results", "workspace") for path in (folder / top).rglob("*")
             if path.is_file() and path.name != ".digests.json"]
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}
