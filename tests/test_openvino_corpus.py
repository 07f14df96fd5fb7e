"""openvino-cpu on the real-model corpus (tests/corpus.py): the executed graph of each model maps back to at
least 99 % of its non-Constant ONNX nodes, in the reduced type this CPU runs, and a model OpenVINO cannot
read fails in one line naming it."""

from __future__ import annotations

import onnx
import pytest
from corpus import CORPUS

from accubisect.core.errors import ModelError
from accubisect.runtime.openvino_backend import CAPABILITY, OPENVINO_CPU, cpu_capabilities
from accubisect.runtime.ort_compile import CompileOptions

pytestmark = pytest.mark.integration
RUNS = [dtype for dtype, capability in CAPABILITY.items() if capability in cpu_capabilities()]
HINT = {"bf16": "bf16", "fp16": "f16"}[RUNS[0]] if RUNS else "f32"  # the reduced type, or f32 where none runs
UNREADABLE = {"silero_vad": "rank has to be known"}  # its op15 export: a Conv inside an If, of unknown rank


@pytest.mark.parametrize("name", sorted(set(CORPUS) - set(UNREADABLE)))
def test_the_executed_graph_covers_the_onnx_model(name, tmp_path):
    model = CORPUS[name].model_path()
    OPENVINO_CPU.compile(model, CompileOptions("all", {"INFERENCE_PRECISION_HINT": HINT}), tmp_path / "g.onnx", 1)
    saved = onnx.load(str(tmp_path / "g.onnx"))
    covered = {name.decode() for node in saved.graph.node for attribute in node.attribute
               if attribute.name == "original_nodes" for name in attribute.strings}
    original = onnx.load(str(model), load_external_data=False)
    computing = [node.name for node in original.graph.node if node.op_type != "Constant"]
    missing = [node for node in computing if node not in covered]
    assert len(missing) <= 0.01 * len(computing), missing[:10]


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_a_model_openvino_cannot_read_is_one_line_naming_it(name, tmp_path):
    model = CORPUS[name].model_path()
    with pytest.raises(ModelError) as caught:
        OPENVINO_CPU.compile(model, CompileOptions("all", {"INFERENCE_PRECISION_HINT": "f32"}), tmp_path / "g.onnx")
    message = str(caught.value)
    assert message.startswith(f"{model}: OpenVINO ") and "cannot read it" in message and "\n" not in message
    assert "Conversion is failed for: Conv-15" in message and UNREADABLE[name] in message
