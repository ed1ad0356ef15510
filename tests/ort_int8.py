"""Whether onnxruntime's int8 kernels are exact on this CPU, measured, and a session that is.

ONNX Runtime's default session turns QDQ models into QLinearConv / QGemm / QLinearMatMul,
which run MLAS's u8 x s8 kernels. Without VNNI (AVX2, AVX-512 core) those multiply with
``vpmaddubsw``, which adds two adjacent u8·s8 products in int16 with saturation:
``sat16(x0·w0 + x1·w1)``, so an accumulator differs from the exact sum as soon as a pair passes
32767 (onnxruntime's quantization guide, "When and why do I need to try U8U8?",
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html). With VNNI
(``vpdpbusd``) or AMX the sums are exact int32.

Rather than guess from CPU flags, ``ort_int8_exact()`` runs two one-node probes whose every
pair saturates (x = 255, w = 127: 255·127·2 = 64770) and compares ORT's output with the exact
integer result:

    QLinearConv 1x1, 8 input channels:  acc = 8·255·127 = 259080, y = rint(acc / 4096) = 63
    QLinearMatMul, K = 8:                the same sums;  saturated pairs give 4·32767 → 32

``qdq_session(model)`` is ORT's default session where that holds, else one with graph
optimizations off (``ORT_DISABLE_ALL``): the QDQ nodes then run as written, DequantizeLinear →
float32 op → QuantizeLinear, which is the model's ONNX meaning with exact integer inputs.
Tests that hold qfuse to "what onnxruntime computes" use it, so their tolerances stay the same
on every CPU.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

_K = 8
_X, _W = 255, 127
_Y_SCALE = 4096.0
#: Why a test compares against ORT's unoptimized session (for skip / assertion messages).
INEXACT_REASON = ("onnxruntime's int8 kernels saturate u8·s8 pairs in int16 on this CPU (no "
                  "VNNI / AMX, measured by tests/ort_int8.py)")


def _probe(op: str) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "xs"),
             numpy_helper.from_array(np.array(0, np.uint8), "xzp"),
             numpy_helper.from_array(np.array(1.0, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wzp"),
             numpy_helper.from_array(np.array(_Y_SCALE, np.float32), "ys"),
             numpy_helper.from_array(np.array(0, np.uint8), "yzp")]
    if op == "QLinearConv":
        inits.append(numpy_helper.from_array(np.full((4, _K, 1, 1), _W, np.int8), "w"))
        x_shape = [1, _K, 3, 3]
    else:
        inits.append(numpy_helper.from_array(np.full((_K, 4), _W, np.int8), "w"))
        x_shape = [3, _K]
    node = helper.make_node(op, ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["y"])
    graph = helper.make_graph([node], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@functools.cache
def ort_int8_exact() -> bool:
    """True when ORT's u8 x s8 conv and matmul give the exact integer result here."""
    exact = int(np.rint(_K * _X * _W / _Y_SCALE))
    for op in ("QLinearConv", "QLinearMatMul"):
        model = _probe(op)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        y = session.run(None, {"x": np.full(shape, _X, np.uint8)})[0]
        if not np.all(y == exact):
            return False
    return True


def qdq_session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    """ORT's default session if its int8 is exact here, else its unoptimized one (docstring)."""
    options = ort.SessionOptions()
    if not ort_int8_exact():
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
