"""Small QDQ models for the emulation tests, built with onnx.helper.

``qdq_conv`` is what onnxruntime's quantize_static writes for one conv: a u8 activation fed as
the graph input ``xq`` -> DequantizeLinear, s8 weights (per output channel or per tensor) ->
DequantizeLinear(axis 0), an int32 bias at scale ``f32(s_x·s_w)`` -> DequantizeLinear, the
float Conv, an optional Relu, and QuantizeLinear to u8 ``y``. Weights are drawn from [-64, 63]
so that u8·s8 pairs never saturate int16 (the result does not depend on VNNI; see
tests/runtime/test_numerics_ort.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class ConvCase:
    cin: int
    cout: int
    k: int
    group: int = 1
    pad: int = 0
    stride: int = 1
    per_channel: bool = True
    relu: bool = False


def _init(name: str, value: object, dtype: object) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def qdq_conv(case: ConvCase, seed: int, hw: tuple[int, int] = (9, 11)
             ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-conv QDQ model and a u8 input for it."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(1, case.cin, *hw), dtype=np.uint8)
    w = rng.integers(-64, 64, size=(case.cout, case.cin // case.group, case.k, case.k))
    xs, xzp = np.float32(rng.uniform(0.005, 0.05)), np.uint8(rng.integers(0, 256))
    n_scales = case.cout if case.per_channel else 1
    ws = rng.uniform(0.001, 0.02, size=n_scales).astype(np.float32)
    bs = (xs * ws).astype(np.float32)
    # Output scale centring the real results in u8 (so both ends saturate sometimes).
    fan_in = case.cin // case.group * case.k * case.k
    spread = float(xs * ws.mean() * 64 * 40 * np.sqrt(fan_in))
    bias = rng.integers(-int(spread / bs.mean()), int(spread / bs.mean()) + 1, case.cout)
    ys = np.float32(spread / 40)
    yzp = np.uint8(0 if case.relu else rng.integers(64, 192))
    ws_value = ws if case.per_channel else ws.reshape(())
    bs_value = bs if case.per_channel else bs.reshape(())
    inits = [
        _init("xs", xs, np.float32), _init("xzp", xzp, np.uint8),
        _init("w", w, np.int8), _init("ws", ws_value, np.float32),
        _init("wzp", np.zeros_like(ws_value, np.int8), np.int8),
        _init("b", bias, np.int32), _init("bs", bs_value, np.float32),
        _init("bzp", np.zeros_like(bs_value, np.int32), np.int32),
        _init("ys", ys, np.float32), _init("yzp", yzp, np.uint8),
    ]
    conv_out = "yr" if case.relu else "yf"
    nodes = [
        helper.make_node("DequantizeLinear", ["xq", "xs", "xzp"], ["xf"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w", "ws", "wzp"], ["wf"], name="dq_w", axis=0),
        helper.make_node("DequantizeLinear", ["b", "bs", "bzp"], ["bf"], name="dq_b", axis=0),
        helper.make_node("Conv", ["xf", "wf", "bf"], [conv_out], name="conv",
                         group=case.group, pads=[case.pad] * 4, kernel_shape=[case.k] * 2,
                         strides=[case.stride] * 2),
    ]
    if case.relu:
        nodes.append(helper.make_node("Relu", ["yr"], ["yf"], name="relu"))
    nodes.append(helper.make_node("QuantizeLinear", ["yf", "ys", "yzp"], ["y"], name="q_y"))
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("xq", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model), {"xq": x}


def qdq_add(seed: int, shape: tuple[int, ...] = (1, 8, 16, 16)
            ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Q(Add(DQ(a), DQ(b))) on two u8 inputs with random scales and zero points."""
    rng = np.random.default_rng(seed)
    sa, sb, sy = rng.uniform(0.005, 0.1, 3).astype(np.float32)
    za, zb, zy = (np.uint8(v) for v in rng.integers(0, 256, 3))
    inits = [_init(n, v, t) for n, v, t in [
        ("sa", sa, np.float32), ("za", za, np.uint8), ("sb", sb, np.float32),
        ("zb", zb, np.uint8), ("sy", sy, np.float32), ("zy", zy, np.uint8)]]
    nodes = [
        helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["af"]),
        helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"]),
        helper.make_node("Add", ["af", "bf"], ["yf"], name="add"),
        helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.UINT8, list(shape)) for n in "ab"]
    graph = helper.make_graph(nodes, "add", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feeds = {n: rng.integers(0, 256, shape).astype(np.uint8) for n in "ab"}
    return onnx.shape_inference.infer_shapes(model), feeds
