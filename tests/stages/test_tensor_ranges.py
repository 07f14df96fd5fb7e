"""The deploy job's reference ranges (stages/tensor_ranges.py) on a model whose tensors outweigh its batch: the
ranges measured batch by batch are those of one run exposing every tensor, on real ORT sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from conftest import save_model
from onnx import TensorProto, helper, numpy_helper

from accubisect.core.tensor_sizes import tensor_bytes
from accubisect.formats.model import model_bytes
from accubisect.runtime import ort_exposed
from accubisect.runtime.backends import backend_named
from accubisect.stages.dump import BATCH_BYTES, tensor_batches
from accubisect.stages.tensor_ranges import batch_limit, reference_ranges

WIDTH = 4096  # 16 KiB per tensor against a model of about 1 KB: the batch holds about 7 of the 40


def chain_model(path: Path, length: int = 40) -> Path:
    """x ─ Mul(s0) ─ Mul(s1) ─ ... ─ y, every scale above 1, so every tensor has its own range."""
    nodes = [helper.make_node("Mul", ["x" if i == 0 else f"t{i - 1}", f"s{i}"], [f"t{i}" if i < length - 1 else "y"],
                              name=f"mul{i}") for i in range(length)]
    scales = [numpy_helper.from_array(np.float32(1 + (i + 1) / 100), f"s{i}") for i in range(length)]
    return save_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], scales, path)


def test_ranges_of_a_model_larger_than_its_batch_match_one_run_of_every_tensor(tmp_path: Path, monkeypatch):
    path = chain_model(tmp_path / "chain.onnx")
    model = onnx.load(path)
    names = ["x", *(node.output[0] for node in model.graph.node)]  # an input too: read from the sample
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.normal(0, scale, (1, WIDTH)).astype(np.float32)} for scale in (1.0, 30.0)]
    sizes = tensor_bytes(model, {"x": (1, WIDTH)})
    batches = tensor_batches(names, ["y"], sizes, batch_limit(model, sizes))
    assert len(batches) >= 4  # the tensors, cut

    built, real = [], ort_exposed._session  # the sessions ORT builds, with the outputs each exposes
    monkeypatch.setattr(ort_exposed, "_session", lambda *args: built.append(args) or real(*args))
    ranges = reference_ranges(model, names, feeds, backend_named("ort-cpu"), 1, tmp_path)
    # a session per batch, run on every sample, exposing that batch alone: ORT holds every output a session
    # exposes until its run ends, so one session exposing every tensor held them all whatever a run asked for
    assert [{value.name for value in args[0].graph.output} for args in built] == [
        {name for name in batch if name != "x"} | {"y"} for batch in batches]

    whole = onnx.load(path)
    whole.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names[1:-1])
    session = ort.InferenceSession(whole.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = [{**dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True)), **feed}
            for feed in feeds]
    assert ranges == {name: [float(np.abs(run[name]).max()) for run in runs] for name in names}
    assert len({values[0] for values in ranges.values()}) == len(names)  # each tensor's own, none swapped


def test_a_batch_held_twice_beside_the_weights_fills_the_memory_target_and_no_more(tmp_path: Path):
    """Issue 22's target beyond the job's imports is 1.5 x the model + 7 x its largest tensor pair; ORT holds
    the weights (1 x the model, its external data counted, read or not) and a batch is held twice (ORT's output
    values, then the arrays measured): the batch is the largest that fits, at most a dump's BATCH_BYTES."""
    model = onnx.load(chain_model(tmp_path / "chain.onnx", length=3))
    external = onnx.load(chain_model(tmp_path / "chain.onnx", length=3))
    external.graph.initializer[0].data_location = TensorProto.EXTERNAL
    external.graph.initializer[0].external_data.add(key="length", value=str(10**6))
    for graph, largest in ((model, 1000), (model, 10**5), (external, 1000)):
        weights, limit = model_bytes(graph), batch_limit(graph, {"t0": largest, "t1": largest // 2})
        target = 1.5 * weights + 7 * 2 * largest
        assert weights + 2 * limit <= target < weights + 2 * (limit + 2)
    assert model_bytes(external) > 10**6  # the external tensor weighs
    assert batch_limit(model, {"t0": 10**9}) == BATCH_BYTES  # at most a dump's batch
