"""Node data for Google's Model Explorer: the ids are the ones its ONNX adapter (`model-explorer-onnx`) gives the
user's own model, checked by converting real models with the adapter; the format is its node_data_builder's."""

import base64
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from dataclasses import replace

import numpy as np
import onnx
import pytest
from conftest import EXAMPLE_MODEL, compare_report, save_model, tensor_row
from corpus import CORPUS
from matplotlib import image
from model_explorer.node_data_builder import GraphNodeData, NodeDataResult, ThresholdItem
from model_explorer_onnx.main import ONNXAdapter
from onnx import TensorProto, helper
from real_reports import compare_run, example_report

from accubisect.core.onnx_graph import topological_order, unique_names
from accubisect.reports.graph_view import NOT_FINITE, node_error
from accubisect.reports.model_explorer import NOT_FINITE_VALUE, adapter_ids, node_data
from accubisect.workflow.cli import main

GELU = ("gelu/div", "gelu/erf", "gelu/add", "gelu/mul", "gelu/half")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def adapter_nodes(model_path):
    """The adapter's nodes of the main graph, by id: what Model Explorer matches node data against."""
    graph = ONNXAdapter().convert(str(model_path), {})["graphs"][0]
    return {node.id: node for node in graph.nodes}


def tensor_tags(node):
    return [item.value for metadata in node.outputsMetadata for item in metadata.attrs if item.key == "__tensor_tag"]


def check_ids(data, model_path):
    """Every key is a node the adapter shows, and that node makes the outputs of the node we meant."""
    model = onnx.load(model_path, load_external_data=False)
    protos = topological_order(model.graph)
    outputs = dict(zip(unique_names(protos), (list(p.output) for p in protos), strict=True))
    meant = {adapter_ids(model)[name]: outputs[name] for name in outputs}
    nodes = adapter_nodes(model_path)
    assert data["results"] and set(data["results"]) <= set(nodes)
    assert all(tensor_tags(nodes[key]) == meant[key] for key in data["results"])


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return example_report(tmp_path_factory.mktemp("example"))


def test_the_example_overlays_the_fused_gelus_error_on_every_node_it_absorbed(example):
    data = node_data(example, onnx.load(EXAMPLE_MODEL))
    check_ids(data, EXAMPLE_MODEL)
    fast_gelu = [row for row in example.tensors if row.node == "FastGelu"]
    value, kind = node_error(fast_gelu)
    assert kind == "local" and all(data["results"][name] == {"value": value} for name in GELU)
    assert value == max(row.local["rel_euclidean"] for row in example.tensors if row.local)  # the largest made


def test_the_file_is_model_explorers_graph_node_data(example):
    data = node_data(example)
    built = GraphNodeData(results={key: NodeDataResult(**result) for key, result in data["results"].items()},
                          name=data["name"], thresholds=[ThresholdItem(**item) for item in data["thresholds"]])
    assert json.loads(built.to_json_string()) == {**json.loads(GraphNodeData(results={}).to_json_string()), **data}
    values = [item["value"] for item in data["thresholds"]]
    assert values == sorted(values) and values[-1] == NOT_FINITE_VALUE


def test_unnamed_and_same_named_nodes_get_the_adapters_ids(tmp_path):
    """Unnamed nodes in the main graph and in an If's branches (listed first: its branch's second unnamed node
    takes "node_1" from the counter the main graph shares), two nodes of one name, listed out of order:

        x ─ Relu() ─ Neg("twin") ─ Abs("twin") ─ If("cond": then Neg() ─ Abs(), else Identity()) ─ Exp() ─ y
    """
    info = helper.make_tensor_value_info
    branch = lambda name, nodes, out: helper.make_graph(nodes, name, [], [info(out, TensorProto.FLOAT, [2])])  # noqa: E731
    then = branch("then", [helper.make_node("Neg", ["t2"], ["a"]), helper.make_node("Abs", ["a"], ["then_out"])],
                  "then_out")
    other = branch("else", [helper.make_node("Identity", ["t2"], ["else_out"])], "else_out")
    nodes = [helper.make_node("If", ["c"], ["r"], name="cond", then_branch=then, else_branch=other),
             helper.make_node("Exp", ["r"], ["y"]), helper.make_node("Relu", ["x"], ["t0"]),
             helper.make_node("Neg", ["t0"], ["t1"], name="twin"), helper.make_node("Abs", ["t1"], ["t2"], name="twin")]
    path = save_model(nodes, [info("x", TensorProto.FLOAT, [2]), info("c", TensorProto.BOOL, [])],
                      [info("y", TensorProto.FLOAT, [2])], [], tmp_path / "names.onnx")
    model = onnx.load(path)
    ids = adapter_ids(model)
    assert ids == {"t0": "node_2", "t1": "twin", "t2": "twin_1", "cond": "cond", "y": "node"}
    nodes = adapter_nodes(path)
    assert all(tensor_tags(nodes[ids[ours]]) == [ours] for ours in ("t0", "t1", "t2", "y"))
    rows = [replace(tensor_row(i, f"fused{i}", worst={"rel_euclidean": 10.0**-i}), original_nodes=(name,))
            for i, name in enumerate(["t0", "t1", "t2", "y"])]
    data = node_data(compare_report(tensors=rows), model)
    assert data["results"] == {"node_2": {"value": 1.0}, "twin": {"value": 0.1}, "twin_1": {"value": 1e-2},
                               "node": {"value": 1e-3}}


def test_nan_is_the_largest_value_in_the_not_finite_colour():
    rows = [replace(tensor_row(0, "n0", worst={"rel_euclidean": math.nan}), original_nodes=("a", "b")),
            replace(tensor_row(1, "n1", worst={"rel_euclidean": 0.5}), original_nodes=("b", "c"))]
    data = node_data(compare_report(tensors=rows))
    assert data["results"] == {"a": {"value": NOT_FINITE_VALUE, "bgColor": NOT_FINITE},
                               "b": {"value": NOT_FINITE_VALUE, "bgColor": NOT_FINITE}, "c": {"value": 0.5}}
    json.dumps(data, allow_nan=False)


def test_cli_writes_the_node_data_and_says_how_to_open_it(example, tmp_path, capsys):
    example.write(tmp_path / "report.json")
    out = tmp_path / "node_data.json"
    assert main(["explorer-data", str(tmp_path / "report.json"), "--model", str(EXAMPLE_MODEL), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == node_data(example, onnx.load(EXAMPLE_MODEL))
    said = capsys.readouterr().out
    assert f"model-explorer {EXAMPLE_MODEL} --extensions=model_explorer_onnx --node_data_paths={out}" in said
    assert main(["explorer-data", str(out), "-o", str(tmp_path / "again.json")]) == 2
    assert "not a compare report" in capsys.readouterr().err and not (tmp_path / "again.json").exists()


@pytest.mark.e2e
@pytest.mark.integration
@pytest.mark.parametrize("name", ["minilm", "yolov8n"])
def test_corpus_node_data_matches_the_adapters_ids(name, tmp_path):
    model = CORPUS[name]
    model.write_samples(tmp_path / "samples")
    outputs = [output.name for output in onnx.load(model.model_path(), load_external_data=False).graph.output]
    report = compare_run(tmp_path, model.model_path(), [tmp_path / "samples" / "sample0_inputs.npz"], outputs,
                         model.fusion_config.get("compile", {}).get("session_config"))
    original = onnx.load(model.model_path(), load_external_data=False)
    data = node_data(report, original)
    check_ids(data, model.model_path())
    ids = adapter_ids(original)  # every original node a compared tensor stands for has its value
    assert set(data["results"]) == {ids[name] for row in report.tensors for name in row.original_nodes}
    assert np.isfinite([result["value"] for result in data["results"].values()]).all()


class DevTools:
    """Headless Chromium driven over the DevTools protocol on its --remote-debugging-pipe (file descriptors 3
    and 4, messages ending in NUL): Model Explorer draws with WebGL and never goes idle, so --dump-dom and
    --screenshot fire before it has loaded anything."""

    def __init__(self, profile):
        self.to_chrome_read, self.to_chrome = os.pipe()
        self.from_chrome, self.from_chrome_write = os.pipe()
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--use-gl=swiftshader",
             "--enable-unsafe-swiftshader", "--window-size=1400,900", "--no-first-run", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "about:blank"], preexec_fn=self._pipes, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(self.to_chrome_read)
        os.close(self.from_chrome_write)
        self.received, self.sent = b"", 0

    def _pipes(self):
        os.dup2(self.to_chrome_read, 3)
        os.dup2(self.from_chrome_write, 4)

    def call(self, method, session=None, **params):
        self.sent += 1
        message = {"id": self.sent, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.received:
                chunk = os.read(self.from_chrome, 1 << 20)
                assert chunk, "chromium closed its DevTools pipe"
                self.received += chunk
            reply, self.received = self.received.split(b"\0", 1)
            reply = json.loads(reply)
            if reply.get("id") == self.sent:
                assert "error" not in reply, reply["error"]
                return reply["result"]

    def open(self, url):
        target = self.call("Target.createTarget", url=url)["targetId"]
        return self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def text(self, session):
        return self.call("Runtime.evaluate", session, expression="document.body.innerText",
                         returnByValue=True)["result"].get("value") or ""

    def close(self):
        self.process.kill()
        self.process.wait(timeout=30)
        os.close(self.to_chrome)
        os.close(self.from_chrome)


def free_port():
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (./run test installs it as root)")
def test_model_explorer_shows_the_culprits_error_over_the_users_model(example, tmp_path):
    """The documented command serves the model with the node data; headless Chromium opens it with the first
    divergence's last original node selected: the panel names that node and our value, the graph is coloured."""
    path = tmp_path / "node_data.json"
    example.write(tmp_path / "report.json")
    assert main(["explorer-data", str(tmp_path / "report.json"), "--model", str(EXAMPLE_MODEL), "-o", str(path)]) == 0
    data = json.loads(path.read_text())
    culprit = example.first_divergence.original_nodes[-1]
    graph = onnx.load(EXAMPLE_MODEL).graph.name
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("w") as output:
        server = subprocess.Popen([sys.executable, "-m", "model_explorer", str(EXAMPLE_MODEL),
                                   "--extensions=model_explorer_onnx", f"--node_data_paths={path}",
                                   "--no_open_in_browser", f"--port={port}"], stdout=output, stderr=subprocess.STDOUT)
    browser = None
    try:
        deadline = time.monotonic() + 60  # it loads every adapter first
        while "Starting Model Explorer server" not in log.read_text() and server.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert server.poll() is None, log.read_text()
        state = {"paneStates": [{"deepestExpandedGroupNodeIds": [graph], "selectedNodeId": culprit,
                                 "selectedGraphId": graph, "selectedCollectionLabel": EXAMPLE_MODEL.name,
                                 "widthFraction": 1, "selected": True}]}
        query = json.dumps({"models": [{"url": str(EXAMPLE_MODEL)}], "nodeData": [str(path)],
                            "nodeDataTargets": [""], "uiState": state})
        browser = DevTools(tmp_path / "profile")
        session = browser.open(f"http://localhost:{port}/?data={urllib.parse.quote(query)}")
        shown = f"NODE DATA PROVIDERS {data['name']} {data['results'][culprit]['value']!r}"
        deadline, panel = time.monotonic() + 60, ""
        while shown not in panel and time.monotonic() < deadline:  # the app loads the model, then the data
            time.sleep(0.5)
            text = browser.text(session)
            panel = re.sub(r"\s+", " ", text[text.find("NODE INFO"):]) if "NODE INFO" in text else ""
        assert shown in panel and re.search(rf"NODE INFO .* id {re.escape(culprit)} ", panel), panel[:800]
        shot = tmp_path / "model_explorer.png"
        shot.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", session, format="png")["data"]))
        pixels = image.imread(shot)[..., :3]
        grey = pixels.mean(axis=2)
        assert (grey < 0.9).mean() > 0.02 and np.std(grey) > 0.05
        threshold = next(item for item in data["thresholds"] if data["results"][culprit]["value"] <= item["value"])
        colour = np.array([int(threshold["bgColor"][i:i + 2], 16) / 255 for i in (1, 3, 5)])
        assert (np.abs(pixels - colour).sum(axis=2) < 0.05).mean() > 0.001  # the culprit's nodes in its colour
    finally:
        if browser:
            browser.close()
        server.terminate()
        server.wait(timeout=30)
