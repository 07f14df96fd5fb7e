import json

import onnx
import pytest
from conftest import GELU_APPROXIMATION

from accubisect.core.errors import RuleError
from accubisect.core.rules import GRAPH_FUSION, UB_FUSION
from accubisect.formats.fusion_switch import load_fusion_switch, rules_switched_off, write_fusion_switch
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import CPU
from accubisect.runtime.catalogue import installed_catalogue


@pytest.fixture(scope="module")
def catalogue():
    return installed_catalogue()


def test_catalogue_reads_transformers_from_the_installed_runtime(catalogue):
    graph_rules = catalogue.rules(GRAPH_FUSION)
    for name in ("MatMulAddFusion", "GeluApproximation", "GeluFusion", "LayerNormFusion", "ConvActivationFusion"):
        assert name in graph_rules
    assert "ConvBNFusion" in catalogue.rules(UB_FUSION)
    assert not any(name.endswith("_RuleBasedTransformer") for name in graph_rules)
    assert catalogue.ort_names({"GeluFusion"}) == {"GeluFusionL1", "GeluFusionL2"}


@pytest.mark.parametrize(
    ("name", "section", "message"),
    [
        ("GeluAproximation", GRAPH_FUSION, "unknown fusion rule 'GeluAproximation' for ONNX Runtime"),
        ("GeluFusionL2", GRAPH_FUSION, "'GeluFusionL2' is one level of rule 'GeluFusion'"),
        ("ConvBNFusion", GRAPH_FUSION, "'ConvBNFusion' is a UBFusion rule; move it to that section"),
    ],
)
def test_bad_names_fail_with_what_to_write_instead(catalogue, name, section, message):
    with pytest.raises(RuleError, match=message) as caught:
        catalogue.check(name, "cfg", section)
    if name == "GeluAproximation":
        assert "closest: GeluApproximation" in str(caught.value)


def test_family_name_really_disables_every_level_copy(catalogue, ffn_model, tmp_path):
    """ORT ignores 'GeluFusion' itself: the catalogue must expand it, or the Gelu still fuses."""
    saved = tmp_path / "opt.onnx"
    options = ort_compile.CompileOptions("all", GELU_APPROXIMATION, catalogue.ort_names({"GeluFusion"}))
    ort_compile.compile_model(ffn_model, options, CPU, save_to=saved)
    op_types = {node.op_type for node in onnx.load(saved).graph.node}
    assert "Erf" in op_types and not op_types & {"Gelu", "FastGelu"}


def switch(graph=None, ub=None):
    return {"Switch": {**({"GraphFusion": graph} if graph is not None else {}), **({"UBFusion": ub} if ub else {})}}


def test_switch_names_rules_off(catalogue):
    off = rules_switched_off(switch({"MatMulAddFusion": "off", "GeluFusion": "on"}, {"ConvBNFusion": "off"}),
                             catalogue, "cfg")
    assert off == {"MatMulAddFusion", "ConvBNFusion"}


def test_all_off_keeps_the_exceptions_on(catalogue):
    off = rules_switched_off(switch({"ALL": "off", "MatMulAddFusion": "on"}), catalogue, "cfg")
    assert off == set(catalogue.rules(GRAPH_FUSION)) - {"MatMulAddFusion"}
    assert not off & set(catalogue.rules(UB_FUSION))


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"switch": {}}, 'not a fusion switch file; write it as {"Switch"'),
        ({"Switch": {"Graph": {}}}, r"unknown section\(s\) \['Graph'\]"),
        (switch({"MatMulAddFusion": "disabled"}), 'GraphFusion.MatMulAddFusion: "disabled" must be "on" or "off"'),
        (switch({"MatMulAddFusionn": "off"}), "closest: MatMulAddFusion"),
    ],
)
def test_malformed_switch_documents_fail_clearly(catalogue, document, message):
    with pytest.raises(RuleError, match=message):
        rules_switched_off(document, catalogue, "cfg")


def test_switch_file_errors_name_the_file(catalogue, tmp_path):
    with pytest.raises(RuleError, match="fusion switch file not found"):
        load_fusion_switch(tmp_path / "missing.cfg", catalogue)
    broken = tmp_path / "broken.cfg"
    broken.write_text('{"Switch": ')
    with pytest.raises(RuleError, match=f"{broken}: not valid JSON"):
        load_fusion_switch(broken, catalogue)
    good = tmp_path / "good.cfg"
    good.write_text(json.dumps(switch({"GeluApproximation": "off"})))
    assert load_fusion_switch(good, catalogue) == {"GeluApproximation"}


def test_the_answer_s_switch_file_reads_back_as_the_rules_it_switches_off(catalogue, tmp_path):
    """fusion_bisect's answer is written where the file is read (formats/fusion_switch.py), in the seeds'
    sections, and compile.fusion_switch given it switches off exactly those rules."""
    rules = {"MatMulAddFusion", "GeluApproximation", "ConvBNFusion"}
    write_fusion_switch(tmp_path / "fusion_switch.cfg", rules, catalogue)
    assert json.loads((tmp_path / "fusion_switch.cfg").read_text()) == switch(
        {"GeluApproximation": "off", "MatMulAddFusion": "off"}, {"ConvBNFusion": "off"})
    assert load_fusion_switch(tmp_path / "fusion_switch.cfg", catalogue) == rules
    write_fusion_switch(tmp_path / "none.cfg", (), catalogue)
    assert load_fusion_switch(tmp_path / "none.cfg", catalogue) == frozenset()
