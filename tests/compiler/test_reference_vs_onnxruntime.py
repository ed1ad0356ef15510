"""Issue 3's acceptance check: the reference interpreter on every zoo model equals onnxruntime.

Float models: within 1e-5 of each output's largest magnitude.

QDQ models, against onnxruntime with graph optimizations disabled (so it runs the literal
DQ → op → Q), on every quantized tensor q (each QuantizeLinear output, exposed as an extra graph
output). q's *segment* is the float ops between the quantized tensors it reads and q.

1. Op by op: the reference computes q from onnxruntime's own values of the quantized tensors
   q's segment reads (the model is cut there and fed them). q must be bit-identical, except when
   the segment holds a float Conv / ConvTranspose / Gemm / MatMul: onnxruntime sums those in
   float32 (MLAS SGEMM: an FMA chain along k, cut into k-blocks whose length depends on the
   share of the product each thread gets), the reference in float64 (runtime/reference/
   ops_nn.py). The two sums differ by a few float32 ulps, which moves a value across a rounding
   tie of the QuantizeLinear only rarely: at most 1 LSB, on at most 0.1% of the elements.
   Every other op the zoo uses is computed in onnxruntime's float32 order
   (ops_pool.py, ops_shape.py Resize, ops_mlas.py) and must match exactly; Gelu and Softmax
   take other MLAS kernels on CPUs without AVX-512F, where they get the GEMM bound instead.
2. Whole model: the reference on its own (end to end). A flip of one element changes the next
   segment's input by one LSB, which the next op can turn into more than one LSB (the
   transformer's GELU maps one LSB of its input to 2.2 LSB of its output: slope 1.13 times the
   scale ratio 1.91) and which spreads (onnxruntime itself, fed resnet50's stem output with 5 of
   its 802816 elements moved by one LSB, ends with 10 LSB and 62% identical in layer4): no fixed
   bound holds downstream. What must hold: every difference starts at a GEMM segment — a tensor
   whose segment has no float GEMM op and reads only identical quantized tensors is identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qfuse.compiler.api import import_graph
from qfuse.examples.zoo import SMALL_ARCHITECTURES, float_model, quantized_model, sample_inputs
from qfuse.runtime.reference import evaluate

FLOAT_SUMS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
_CPUINFO = Path("/proc/cpuinfo")
AVX512F = _CPUINFO.exists() and " avx512f" in _CPUINFO.read_text()
APPROXIMATE = FLOAT_SUMS if AVX512F else FLOAT_SUMS | {"Gelu", "Softmax"}
CUT = "__ort"


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


def _segments(model: onnx.ModelProto, quantized: list[str]) -> dict[str, tuple[set, set]]:
    """Per quantized tensor: its segment's op types and the quantized tensors it reads."""
    producer = {out: node for node in model.graph.node for out in node.output}
    segments = {}
    for name in quantized:
        ops, sources, seen = set(), set(), set()
        stack = list(producer[name].input[:1])
        while stack:
            value = stack.pop()
            node = producer.get(value)
            if node is None or value in seen:
                continue
            seen.add(value)
            if node.op_type == "QuantizeLinear":
                sources.add(value)
                continue
            ops.add(node.op_type)
            stack.extend(i for i in node.input if i)
        segments[name] = (ops, sources)
    return segments


def _cut(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with every reader of a quantized tensor q reading a new input ``q + CUT``."""
    cut = onnx.ModelProto.FromString(model.SerializeToString())
    for node in cut.graph.node:
        if node.op_type != "QuantizeLinear":
            for i, name in enumerate(node.input):
                if name in values:
                    node.input[i] = name + CUT
    known = {o.name for o in cut.graph.output}
    for name, array in values.items():
        elem = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        cut.graph.input.append(onnx.helper.make_tensor_value_info(name + CUT, elem, array.shape))
        if name not in known:
            cut.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, array.shape))
    return cut


def _diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.int32) - b.astype(np.int32))


ALL = [*SMALL_ARCHITECTURES, pytest.param("resnet50", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", ALL)
def test_float_model_matches_onnxruntime(name: str) -> None:
    model = float_model(name)
    graph = import_graph(model)
    for feeds in sample_inputs(model, 1 if name == "resnet50" else 2, seed=1):
        ref = evaluate(graph, feeds)
        got = _ort(model, feeds, [])
        for out in graph.outputs:
            scale = max(1.0, float(np.abs(got[out]).max()))
            assert np.abs(ref[out] - got[out]).max() <= 1e-5 * scale, out


@pytest.mark.parametrize("name", ALL)
def test_qdq_model_quantized_tensors_match_onnxruntime(name: str) -> None:
    model = quantized_model(name)
    check_qdq_model(model, sample_inputs(model, 1 if name == "resnet50" else 2, seed=1), name)


def check_qdq_model(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
                    name: str) -> None:
    """Both checks of the module docstring on ``samples``; prints the figures."""
    graph = import_graph(model)
    quantized = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"
                 and n.output[0] in graph.values]
    segments = _segments(model, quantized)
    figures = {"op by op": [0, 1.0], "end to end": [0, 1.0]}
    for feeds in samples:
        got = _ort(model, feeds, quantized)
        values = {q: got[q] for q in quantized}
        isolated = evaluate(import_graph(_cut(model, values)),
                            feeds | {q + CUT: v for q, v in values.items()}, keep=True)
        whole = evaluate(graph, feeds, keep=True)
        differs: set[str] = set()
        for q in quantized:
            ops, sources = segments[q]
            diff = _diff(isolated[q], got[q])
            _record(figures["op by op"], diff)
            if ops & APPROXIMATE:
                assert diff.max() <= 1, f"{q} ({sorted(ops)}): {diff.max()} LSB"
                assert np.mean(diff == 0) >= 0.999, f"{q}: {np.mean(diff == 0):.5f} identical"
            else:
                assert diff.max() == 0, f"{q} ({sorted(ops)}): {diff.max()} LSB from one segment"
            diff = _diff(whole[q], got[q])
            _record(figures["end to end"], diff)
            if diff.any():
                differs.add(q)
                assert ops & APPROXIMATE or sources & differs, (
                    f"{q} ({sorted(ops)}) differs end to end, but its segment has no float "
                    f"GEMM op and its inputs {sorted(sources)} are identical")
    print(name, ", ".join(f"{k}: worst {w} LSB, min identical {i:.5f}"
                          for k, (w, i) in figures.items()))


def _record(figure: list, diff: np.ndarray) -> None:
    figure[0] = max(figure[0], int(diff.max()))
    figure[1] = min(figure[1], float(np.mean(diff == 0)))
