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
    reduced_nodes,
    resolve_keep_dtype,
)
from accubisect.formats.assignment import Assignment
from accubisect.formats.graph_record import GraphNode
from accubisect.formats.local_errors import LocalErrors
from accubisect.formats.mixlist import load_mixlist, write_keep_dtype, write_modify_mixlist
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


def test_the_answer_s_mixlist_and_keep_dtype_read_back_as_written(tmp_path):
    """precision_bisect's modify_mixlist.json, given back as precision.modify_mixlist, moves exactly its op types
    to the black list; keep_dtype.txt is one node a line."""
    write_modify_mixlist(tmp_path / "modify_mixlist.json", ["MatMul", "Gemm"])
    read = load_mixlist(str(tmp_path / "modify_mixlist.json"), known_op_types())
    defaults = load_mixlist(None, known_op_types())
    assert read[BLACK] == defaults[BLACK] | {"MatMul", "Gemm"} and read[WHITE] == defaults[WHITE] - {"MatMul", "Gemm"}
    write_keep_dtype(tmp_path / "keep_dtype.txt", ("b4/ffn2/MatMul", "ln"))
    assert (tmp_path / "keep_dtype.txt").read_text().splitlines() == ["b4/ffn2/MatMul", "ln"]


def node(index, name, op_type, inputs, outputs, original_nodes):
    return GraphNode(index, name, op_type, "ai.onnx", tuple(inputs), tuple(outputs), tuple(original_nodes), None, ())


NODES = (  # x -> MatMul -> Add(bias) -> Exp -> Mul -> y, with a fused LayerNorm on the side
    node(0, "mm", "MatMul", ["x", "w"], ["h"], ["mm"]),
    node(1, "add", "Add", ["h", "b"], ["a"], ["add"]),
    node(2, "exp", "Exp", ["a"], ["e"], ["exp"]),
    node(3, "mul", "Mul", ["e", "a"], ["m"], ["mul"]),
    node(4, "LayerNorm", "LayerNormalization", ["m"], ["y"], ["ln/mean", "ln/sub", "ln/div"]),
    node(5, "shape", "Shape", ["y"], ["s"], ["shape"]),
)
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
    assert reduced_nodes(NODES, DTYPES, mode, LISTS, keep) == expected


def test_device_profile_reduces_ops_without_fp32_kernels():
    assert reduced_nodes(NODES, DTYPES, "allow_fp32_to_fp16", LISTS, set(), no_fp32_ops=["Exp"]) == ["exp"]


def test_keep_dtype_names_survive_fusion():
    assert resolve_keep_dtype(["ln/sub", "mm"], NODES) == {"LayerNorm", "mm"}
    with pytest.raises(PrecisionError, match="'ln/sqrt' matches no node of the model.*closest: ln/sub"):
        resolve_keep_dtype(["ln/sqrt"], NODES)


def test_assignment_and_local_error_on_a_compiled_model(ffn_model, tmp_path):
    """keep_dtype names an original node absorbed by fusion; local error is measured per reduced node."""
    from accubisect.stages.compile_stage import CompileStep, compile_variant
    from accubisect.stages.dump import DumpStep, dump_sample
    from accubisect.stages.graph import GraphStep, write_graph
    from accubisect.stages.local_error import LocalErrorsStep, local_errors
    from accubisect.stages.precision_stage import AssignStep, assign_precision

    np.savez(tmp_path / "sample0_inputs.npz", x=np.random.default_rng(0).normal(0, 2, (1, 4, 8)).astype(np.float32))
    spec = {"name": "fusion_on", "level": "all", "session_config": {}, "rules_off": []}
    compile_variant(CompileStep(ffn_model, spec, "ort-cpu", tmp_path / "model.onnx", tmp_path / "compile.json"))
    write_graph(GraphStep(ffn_model, tmp_path / "model.onnx", tmp_path / "compile.json", tmp_path / "graph.json"))
    dump_sample(DumpStep(ffn_model, tmp_path / "model.onnx", tmp_path / "sample0_inputs.npz", tmp_path / "dump.h5",
                         "fusion_on", "sample0", "ort-cpu"))
    precision = {"mode": "force_fp16", "dtype": "fp16", "graph": "compiled", "keep_dtype": ["gelu/erf"],
                 "modify_mixlist": None, "no_fp32_ops": []}
    assign_precision(AssignStep(tmp_path / "model.onnx", tmp_path / "graph.json", tmp_path / "sample0_inputs.npz",
                                precision, "ort-cpu", tmp_path / "assignment.json", tmp_path / "emulated.onnx"))
    assignment = Assignment.read(tmp_path / "assignment.json")
    assert "Gelu" in assignment.keep_dtype and "Gelu" not in assignment.reduced  # erf was fused into Gelu
    assert any(name.endswith("MatMulAddFusion") for name in assignment.reduced)
    local_errors(LocalErrorsStep(tmp_path / "model.onnx", (tmp_path / "dump.h5",), (tmp_path / "sample0_inputs.npz",),
                                 "ort-cpu", tmp_path / "local.json", assignment=tmp_path / "assignment.json"))
    local = LocalErrors.read(tmp_path / "local.json")
    assert set(local.nodes) == set(assignment.reduced) and local.skipped == ()
    gemm = next(v for k, v in local.nodes.items() if k.endswith("MatMulAddFusion"))
    assert 0 < gemm["max_abs"] < 0.05 and gemm["cosine"] > 0.999
