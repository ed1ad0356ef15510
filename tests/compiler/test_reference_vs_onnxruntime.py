"""Issue 3's acceptance check: the reference interpreter on every zoo model equals onnxruntime.

Float models: within 1e-5 of each output's largest magnitude. QDQ models, against onnxruntime
with graph optimizations disabled (so it runs the literal DQ → op → Q): every quantized tensor
(each QuantizeLinear output, exposed as an extra graph output) within 1 LSB and at least 99.9%
of its elements identical. Both sides compute float ops in float32-vs-float64 differently
(the reference accumulates in float64 and rounds once), so a value near a rounding tie of a
later QuantizeLinear may land on the other side: that is the 1 LSB.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from compiler.api import import_graph
from examples.zoo import SMALL_ARCHITECTURES, float_model, quantized_model, sample_inputs
from runtime.reference import evaluate


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], extra: list[str]) -> dict:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    known = {o.name for o in model.graph.output}
    for name in extra:
        if name not in known:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


@pytest.mark.parametrize("name", SMALL_ARCHITECTURES)
def test_float_model_matches_onnxruntime(name: str) -> None:
    model = float_model(name)
    graph = import_graph(model)
    for feeds in sample_inputs(model, 2, seed=1):
        ref = evaluate(graph, feeds)
        got = _ort(model, feeds, [])
        for out in graph.outputs:
            scale = max(1.0, float(np.abs(got[out]).max()))
            assert np.abs(ref[out] - got[out]).max() <= 1e-5 * scale, out


@pytest.mark.parametrize("name", SMALL_ARCHITECTURES)
def test_qdq_model_quantized_tensors_match_onnxruntime(name: str) -> None:
    model = quantized_model(name)
    graph = import_graph(model)
    q_nodes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"
               and n.output[0] in graph.values]
    worst, identical = 0, 1.0
    for feeds in sample_inputs(model, 2, seed=1):
        ref = evaluate(graph, feeds, keep=True)
        got = _ort(model, feeds, [n.output[0] for n in q_nodes])
        for node in q_nodes:
            name_q = node.output[0]
            diff = np.abs(ref[name_q].astype(np.int32) - got[name_q].astype(np.int32))
            worst = max(worst, int(diff.max()))
            identical = min(identical, float(np.mean(diff == 0)))
            assert diff.max() <= 1, f"{name_q}: {diff.max()} LSB"
            assert np.mean(diff == 0) >= 0.999, f"{name_q}: {np.mean(diff == 0):.5f}"
    print(f"{name}: worst {worst} LSB, min identical {identical:.5f}")
