"""Precision assignment: the seeds' mixlist semantics, modes, and keep_dtype through fusion."""

import json

import numpy as np
import pytest

from accubisect.core.precision import (
    BLACK,
    GRAY,
    WHITE,
    PrecisionError,
    apply_modify_mixlist,
    list_of,
    load_mixlist,
    reduced_nodes,
    resolve_keep_dtype,
)
from accubisect.runtime.op_schema import known_op_types

LISTS = {WHITE: {"MatMul", "Conv"}, BLACK: {"Exp", "Softmax"}}


@pytest.mark.parametrize(
    ("document", "op_type", "expected"),
    [
        ({"black-list": {"to-add": ["MatMul"]}}, "MatMul", BLACK),  # seed: A in white, added to black -> black
        ({"black-list": {"to-add": ["MatMul"]}, "white-list": {"to-remove": ["MatMul"]}}, "MatMul", BLACK),
        ({"white-list": {"to-remove": ["MatMul"]}}, "MatMul", GRAY),  # seed: removed from white only -> gray
        ({"black-list": {"to-remove": ["Exp"]}}, "Exp", GRAY),
        ({"white-list": {"to-add": ["Add"]}}, "Add", WHITE),  # gray -> white
        ({"white-list": {"to-add": ["Exp"]}}, "Exp", WHITE),  # black -> white
        ({"black-list": {"to-remove": ["MatMul"]}}, "MatMul", WHITE),  # not in black: stays where it was
    ],
)
def test_modify_mixlist_as_the_seed_manual(document, op_type, expected):
    assert list_of(apply_modify_mixlist(LISTS, document, "mix.json", known_op_types()), op_type) == expected


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"black-list": {"to-add": ["MatMull"]}}, "mix.json: black-list.to-add: unknown op type 'MatMull'; closest"),
        ({"grey-list": {}}, "mix.json: expected"),
        ({"black-list": {"add": ["Exp"]}}, "mix.json: black-list: expected"),
        ({"black-list": {"to-add": "Exp"}}, "expected a list of op type names"),
        ({"black-list": {"to-add": ["Add"]}, "white-list": {"to-add": ["Add"]}}, "added to both"),
    ],
)
def test_bad_mixlists_fail_in_one_line(document, message):
    with pytest.raises(PrecisionError, match=message.replace("(", r"\(")):
        apply_modify_mixlist(LISTS, document, "mix.json", known_op_types())


def test_mixlist_files(tmp_path):
    defaults = load_mixlist(None, known_op_types())
    assert list_of(defaults, "MatMul") == WHITE and list_of(defaults, "ReduceMean") == BLACK
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PrecisionError, match="bad.json: not valid JSON"):
        load_mixlist(str(tmp_path / "bad.json"), known_op_types())
    (tmp_path / "mix.json").write_text(json.dumps({"black-list": {"to-add": ["MatMul"]}}))
    assert list_of(load_mixlist(str(tmp_path / "mix.json"), known_op_types()), "MatMul") == BLACK


GRAPH = {"nodes": [  # x -> MatMul -> Add(bias) -> Exp -> Mul -> y, with a fused LayerNorm on the side
    {"name": "mm", "op_type": "MatMul", "inputs": ["x", "w"], "outputs": ["h"], "original_nodes": ["mm"]},
    {"name": "add", "op_type": "Add", "inputs": ["h", "b"], "outputs": ["a"], "original_nodes": ["add"]},
    {"name": "exp", "op_type": "Exp", "inputs": ["a"], "outputs": ["e"], "original_nodes": ["exp"]},
    {"name": "mul", "op_type": "Mul", "inputs": ["e", "a"], "outputs": ["m"], "original_nodes": ["mul"]},
    {"name": "LayerNorm", "op_type": "LayerNormalization", "inputs": ["m"], "outputs": ["y"],
     "original_nodes": ["ln/mean", "ln/sub", "ln/div"]},
    {"name": "shape", "op_type": "Shape", "inputs": ["y"], "outputs": ["s"], "original_nodes": ["shape"]},
]}
DTYPES = {**{t: "float32" for t in "xwhbaemy"}, "s": "int64"}


@pytest.mark.parametrize(
    ("mode", "keep", "expected"),
    [
        ("force_fp32", set(), []),
        ("must_keep_origin_dtype", {"mm"}, []),
        ("force_fp16", set(), ["mm", "add", "exp", "mul", "LayerNorm"]),  # Shape has no float output
        ("force_fp16", {"exp"}, ["mm", "add", "mul", "LayerNorm"]),
        ("allow_fp32_to_fp16", set(), []),  # no device profile: equals fp32 on ORT
        ("allow_mix_precision", set(), ["mm", "add"]),  # Exp black; Mul follows Exp (fp32)
        ("allow_mix_precision", {"mm"}, []),  # Add then follows an fp32 MatMul
    ],
)
def test_modes(mode, keep, expected):
    assert reduced_nodes(GRAPH, DTYPES, mode, LISTS, keep) == expected


def test_device_profile_reduces_ops_without_fp32_kernels():
    assert reduced_nodes(GRAPH, DTYPES, "allow_fp32_to_fp16", LISTS, set(), no_fp32_ops=["Exp"]) == ["exp"]


def test_keep_dtype_names_survive_fusion():
    assert resolve_keep_dtype(["ln/sub", "mm"], GRAPH) == {"LayerNorm", "mm"}
    with pytest.raises(PrecisionError, match="'ln/sqrt' matches no node of the model.*closest: ln/sub"):
        resolve_keep_dtype(["ln/sqrt"], GRAPH)


def test_assignment_and_local_error_on_a_compiled_model(ffn_model, tmp_path):
    """keep_dtype names an original node absorbed by fusion; local error is measured per reduced node."""
    from accubisect.stages.compile_stage import compile_variant
    from accubisect.stages.dump import dump_sample
    from accubisect.stages.graph import write_graph
    from accubisect.stages.precision_stage import assign_precision, local_errors

    np.savez(tmp_path / "sample0_inputs.npz", x=np.random.default_rng(0).normal(0, 2, (1, 4, 8)).astype(np.float32))
    spec = {"name": "fusion_on", "level": "all", "session_config": {}, "rules_off": []}
    compile_variant(ffn_model, spec, "ort-cpu", tmp_path / "model.onnx", tmp_path / "compile.json")
    write_graph(ffn_model, tmp_path / "model.onnx", tmp_path / "compile.json", tmp_path / "graph.json")
    dump_sample(ffn_model, tmp_path / "model.onnx", tmp_path / "sample0_inputs.npz", tmp_path / "dump.h5",
                "fusion_on", "sample0", "ort-cpu")
    precision = {"mode": "force_fp16", "dtype": "fp16", "graph": "compiled", "keep_dtype": ["gelu/erf"],
                 "modify_mixlist": None, "no_fp32_ops": []}
    assign_precision(str(tmp_path / "model.onnx"), str(tmp_path / "graph.json"), str(tmp_path / "sample0_inputs.npz"),
                     precision, "ort-cpu", str(tmp_path / "assignment.json"), str(tmp_path / "emulated.onnx"))
    assignment = json.loads((tmp_path / "assignment.json").read_text())
    assert "Gelu" in assignment["keep_dtype"] and "Gelu" not in assignment["reduced"]  # erf was fused into Gelu
    assert any(name.endswith("MatMulAddFusion") for name in assignment["reduced"])
    local_errors(str(tmp_path / "model.onnx"), str(tmp_path / "assignment.json"), [str(tmp_path / "dump.h5")],
                 [str(tmp_path / "sample0_inputs.npz")], "ort-cpu", str(tmp_path / "local.json"))
    local = json.loads((tmp_path / "local.json").read_text())
    assert set(local["nodes"]) == set(assignment["reduced"]) and local["skipped"] == []
    gemm = next(v for k, v in local["nodes"].items() if k.endswith("MatMulAddFusion"))
    assert 0 < gemm["max_abs"] < 0.05 and gemm["cosine"] > 0.999
