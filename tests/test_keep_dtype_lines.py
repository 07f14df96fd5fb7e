"""keep_dtype.txt through fusion: precision_bisect keeps compiled nodes in fp32, but the user's compiler is
told original node names. Each kept node is written as the original nodes it absorbed, each name once, and
the file fed back as `precision.keep_dtype` keeps every one of those compiled nodes in fp32 again. The graph
is the example's, compiled by ONNX Runtime at level `all` and mapped by the graph stage."""


import pytest
from conftest import EXAMPLE_MODEL, GELU_APPROXIMATION

from accubisect.bisection.precision_bisect import keep_dtype_lines
from accubisect.core.precision import resolve_keep_dtype
from accubisect.formats.graph_record import GraphNode, GraphRecord
from accubisect.stages.compile_stage import CompileStep, compile_variant
from accubisect.stages.graph import GraphStep, write_graph

FUSION_ON = {"name": "fusion_on", "level": "all", "session_config": GELU_APPROXIMATION, "rules_off": []}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fusion_on")
    compile_variant(CompileStep(EXAMPLE_MODEL, FUSION_ON, "ort-cpu", folder / "model.onnx", folder / "compile.json"))
    write_graph(GraphStep(EXAMPLE_MODEL, folder / "model.onnx", folder / "compile.json", folder / "graph.json"))
    return GraphRecord.read(folder / "graph.json")


def named(graph, op_type):
    return [node.name for node in graph.nodes if node.op_type == op_type]


def test_a_fused_node_is_written_as_the_original_nodes_it_absorbed(graph):
    (gelu,) = named(graph, "FastGelu")
    assert keep_dtype_lines([gelu], graph) == ["gelu/div", "gelu/erf", "gelu/add", "gelu/mul", "gelu/half"]


def test_names_come_once_in_the_order_of_the_culprits(graph):
    """The Gemm and the Reshapes ORT put around it all stand for ffn1's MatMul and Add."""
    (gelu,) = named(graph, "FastGelu")
    ffn1 = [node.name for node in graph.nodes if node.original_nodes == ("ffn1/matmul", "ffn1/bias")]
    assert len(ffn1) == 3  # gemm_input_reshape, the Gemm, gemm_output_reshape
    lines = keep_dtype_lines([*ffn1, gelu, ffn1[0]], graph)
    assert lines == ["ffn1/matmul", "ffn1/bias", "gelu/div", "gelu/erf", "gelu/add", "gelu/mul", "gelu/half"]


def test_an_unfused_node_is_written_as_itself(graph):
    assert keep_dtype_lines(["conv/to_ncl"], graph) == ["conv/to_ncl"]


def test_a_node_without_original_nodes_is_written_with_its_compiled_name():
    """A node ORT made from nothing of the model's (no original node) can only be named as compiled."""
    graph = GraphRecord("fusion_on", (), (GraphNode(0, "made_by_ort", "Cast", "ai.onnx", ("x",), ("c",), (), None, ()),
                                          GraphNode(1, "FastGelu", "FastGelu", "com.microsoft", ("c",), ("y",),
                                                    ("gelu/erf",), "GeluApproximation", ("GeluApproximation",))))
    assert keep_dtype_lines(["made_by_ort", "FastGelu"], graph) == ["made_by_ort", "gelu/erf"]
    assert resolve_keep_dtype(["made_by_ort", "gelu/erf"], graph.nodes) == {"made_by_ort", "FastGelu"}


def test_every_compiled_node_written_to_keep_dtype_is_kept_when_fed_back(graph):
    for node in graph.nodes:
        assert node.name in resolve_keep_dtype(keep_dtype_lines([node.name], graph), graph.nodes), node
    everything = [node.name for node in graph.nodes]
    assert resolve_keep_dtype(keep_dtype_lines(everything, graph), graph.nodes) == set(everything)


def test_nothing_kept_is_an_empty_file():
    assert keep_dtype_lines([], GraphRecord("fusion_on", (), ())) == []
