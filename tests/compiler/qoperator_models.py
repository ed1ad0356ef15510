"""Single-op QOperator models (onnx.helper) with random feeds, for the QOperator import tests.

Weights that an activation u8 multiplies stay within ±64 (s8) so that no pair of u8·s8
products leaves int16 (255·64·2 = 32640): onnxruntime's AVX2 kernels (vpmaddubsw) are then
exact too and every case compares against onnxruntime itself on any CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
U8, S8 = TensorProto.UINT8, TensorProto.INT8
_NP = {U8: np.uint8, S8: np.int8}

Case = tuple[onnx.ModelProto, dict[str, np.ndarray]]


def _init(name: str, value: object, dtype: object) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[list[int], int]],
           inits: list[onnx.TensorProto], out_elem: int = U8, opset: int = 17,
           ) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "qop",
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(nodes[-1].output[0], out_elem,
                                       [f"d{i}" for i in range(len(next(iter(inputs.values()))[0]))])],
        inits)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _act(rng: np.random.Generator, shape: list[int], elem: int) -> np.ndarray:
    info = np.iinfo(_NP[elem])
    return rng.integers(info.min, info.max + 1, shape).astype(_NP[elem])


def _qparams(prefix: str, scale: float, zp: int, elem: int) -> list[onnx.TensorProto]:
    return [_init(f"{prefix}_s", scale, np.float32), _init(f"{prefix}_z", zp, _NP[elem])]


def qlinear_conv(seed: int, *, per_channel: bool = True, w_elem: int = S8, w_zp: int = 0,
                 w_span: int = 64, group: int = 1, x_elem: int = U8, stride: int = 1,
                 bias: bool = True, w_range: tuple[int, int] | None = None) -> Case:
    rng = np.random.default_rng(seed)
    cin, cout, k = 8, 12 if group == 1 else 8, 3
    x = _act(rng, [1, cin, 9, 9], x_elem)
    w = rng.integers(-w_span, w_span + 1, (cout, cin // group, k, k)) + w_zp
    if w_range is not None:
        w = rng.integers(w_range[0], w_range[1] + 1, w.shape)
    w_scale = rng.uniform(0.002, 0.01, cout if per_channel else ()).astype(np.float32)
    w_zps = np.full(w_scale.shape, w_zp)
    inits = [*_qparams("x", 0.03, 7 if x_elem == S8 else 120, x_elem),
             _init("w", w, _NP[w_elem]), _init("w_s", w_scale, np.float32),
             _init("w_z", w_zps, _NP[w_elem]), *_qparams("y", 0.05, 100 if x_elem == U8 else -5,
                                                         x_elem)]
    names = ["x", "x_s", "x_z", "w", "w_s", "w_z", "y_s", "y_z"]
    if bias:
        inits.append(_init("b", rng.integers(-3000, 3000, cout), np.int32))
        names.append("b")
    node = helper.make_node("QLinearConv", names, ["y"], pads=[1, 1, 1, 1], group=group,
                            strides=[stride, stride], kernel_shape=[k, k])
    return _model([node], {"x": ([1, cin, 9, 9], x_elem)}, inits, x_elem), {"x": x}


def qlinear_matmul(seed: int, *, per_column: bool = False, b_const: bool = True) -> Case:
    rng = np.random.default_rng(seed)
    a = _act(rng, [2, 5, 16], U8)
    b_val = rng.integers(-64, 65, (16, 10)).astype(np.int8)
    scale = rng.uniform(0.002, 0.01, 10 if per_column else ()).astype(np.float32)
    inits = [*_qparams("a", 0.02, 128, U8), _init("b_s", scale, np.float32),
             _init("b_z", np.zeros(scale.shape), np.int8), *_qparams("y", 0.04, 110, U8)]
    inputs = {"a": ([2, 5, 16], U8)}
    feeds = {"a": a}
    if b_const:
        inits.append(_init("b", b_val, np.int8))
    else:
        inputs["b"] = ([16, 10], S8)
        feeds["b"] = b_val
    node = helper.make_node("QLinearMatMul", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"],
                            ["y"])
    return _model([node], inputs, inits), feeds


def qgemm(seed: int, *, trans_b: int = 1, alpha: float = 1.0, quantized: bool = True,
          per_column: bool = True) -> Case:
    rng = np.random.default_rng(seed)
    a = _act(rng, [4, 24], U8)
    b_val = rng.integers(-64, 65, (10, 24) if trans_b else (24, 10)).astype(np.int8)
    scale = rng.uniform(0.002, 0.01, 10 if per_column else ()).astype(np.float32)
    inits = [*_qparams("a", 0.02, 128, U8), _init("b", b_val, np.int8),
             _init("b_s", scale, np.float32), _init("b_z", np.zeros(scale.shape), np.int8),
             _init("c", rng.integers(-3000, 3000, 10), np.int32)]
    names = ["a", "a_s", "a_z", "b", "b_s", "b_z", "c"]
    if quantized:
        inits += _qparams("y", 0.06, 120, U8)
        names += ["y_s", "y_z"]
    node = helper.make_node("QGemm", names, ["y"], domain=MS, transB=trans_b, alpha=alpha)
    out = U8 if quantized else TensorProto.FLOAT
    return _model([node], {"a": ([4, 24], U8)}, inits, out), {"a": a}


def conv_integer(seed: int, *, w_elem: int = S8, w_zp: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    x = _act(rng, [1, 4, 7, 7], U8)
    w = rng.integers(-60, 61, (6, 4, 3, 3)) + w_zp
    inits = [_init("w", w, _NP[w_elem]), _init("x_z", 131, np.uint8),
             _init("w_z", w_zp, _NP[w_elem])]
    node = helper.make_node("ConvInteger", ["x", "w", "x_z", "w_z"], ["y"], pads=[1, 1, 1, 1])
    return _model([node], {"x": ([1, 4, 7, 7], U8)}, inits, TensorProto.INT32), {"x": x}


def matmul_integer(seed: int, *, per_column_zp: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    a = _act(rng, [3, 32], U8)
    zp = rng.integers(100, 156, 10) if per_column_zp else np.array(128)
    b = rng.integers(-60, 61, (32, 10)) + zp
    inits = [_init("b", b, np.uint8), _init("a_z", 12, np.uint8), _init("b_z", zp, np.uint8)]
    node = helper.make_node("MatMulInteger", ["a", "b", "a_z", "b_z"], ["y"])
    return _model([node], {"a": ([3, 32], U8)}, inits, TensorProto.INT32), {"a": a}


def binary(seed: int, op: str, *, elem: int = U8, broadcast: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    shape_b = [1, 6, 1, 1] if broadcast else [1, 6, 5, 5]
    zp = (110, 140, 128) if elem == U8 else (-10, 12, 0)
    inits = [*_qparams("a", 0.04, zp[0], elem), *_qparams("b", 0.03, zp[1], elem),
             *_qparams("c", 0.05 if op == "QLinearAdd" else 0.4, zp[2], elem)]
    node = helper.make_node(op, ["a", "a_s", "a_z", "b", "b_s", "b_z", "c_s", "c_z"], ["y"],
                            domain=MS)
    inputs = {"a": ([1, 6, 5, 5], elem), "b": (shape_b, elem)}
    feeds = {"a": _act(rng, [1, 6, 5, 5], elem), "b": _act(rng, shape_b, elem)}
    return _model([node], inputs, inits, elem), feeds


def concat(seed: int) -> Case:
    rng = np.random.default_rng(seed)
    inits = [*_qparams("y", 0.05, 120, U8), *_qparams("a", 0.04, 110, U8),
             *_qparams("b", 0.07, 90, U8)]
    node = helper.make_node("QLinearConcat", ["y_s", "y_z", "a", "a_s", "a_z", "b", "b_s", "b_z"],
                            ["y"], domain=MS, axis=1)
    inputs = {"a": ([1, 3, 4, 4], U8), "b": ([1, 5, 4, 4], U8)}
    feeds = {"a": _act(rng, [1, 3, 4, 4], U8), "b": _act(rng, [1, 5, 4, 4], U8)}
    return _model([node], inputs, inits), feeds


def unary(seed: int, op: str, *, elem: int = U8, channels_last: int = 0,
          **attrs: object) -> Case:
    rng = np.random.default_rng(seed)
    shape = [1, 6, 7, 7] if not channels_last else [1, 7, 7, 6]
    zp_in, zp_out = (120, 128) if elem == U8 else (-8, 0)
    out_scale = 1 / 256 if op == "QLinearSoftmax" else 0.03
    if op == "QLinearSoftmax":
        zp_out = 0 if elem == U8 else -128
    inits = [*_qparams("x", 0.04, zp_in, elem), *_qparams("y", out_scale, zp_out, elem)]
    if channels_last:
        attrs["channels_last"] = channels_last
    node = helper.make_node(op, ["x", "x_s", "x_z", "y_s", "y_z"], ["y"], domain=MS, **attrs)
    return _model([node], {"x": (shape, elem)}, inits, elem), {"x": _act(rng, shape, elem)}


def dequantized(case: Case) -> Case:
    """The case with a DequantizeLinear appended to its quantized output (the way quantize_static
    ends a QOperator model), so the output quantization can fuse into the kernel."""
    model, feeds = case
    out = model.graph.output[0]
    node = model.graph.node[-1]
    scale, zp = _output_qparams(node)
    if not scale:
        return case
    dq = helper.make_node("DequantizeLinear", [out.name, scale, zp], ["y_float"])
    graph = helper.make_graph([*model.graph.node, dq], "qop", list(model.graph.input),
                              [helper.make_tensor_value_info(
                                  "y_float", TensorProto.FLOAT,
                                  [d.dim_param for d in out.type.tensor_type.shape.dim])],
                              list(model.graph.initializer))
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=8), feeds


def _output_qparams(node: onnx.NodeProto) -> tuple[str, str]:
    """Names of the output scale and zero point of a QOperator node ("" for none)."""
    ports = {"QLinearConv": (6, 7), "QLinearMatMul": (6, 7), "QGemm": (7, 8),
             "QLinearAdd": (6, 7), "QLinearMul": (6, 7), "QLinearConcat": (0, 1)}
    s, z = ports.get(node.op_type, (3, 4))
    if node.op_type in ("ConvInteger", "MatMulInteger") or len(node.input) <= s:
        return "", ""
    return node.input[s], node.input[z] if len(node.input) > z else ""


CASES: dict[str, Callable[[int], Case]] = {
    "QLinearConv_s8_per_channel": lambda s: qlinear_conv(s),
    "QLinearConv_s8_per_tensor": lambda s: qlinear_conv(s, per_channel=False),
    "QLinearConv_u8w_zp": lambda s: qlinear_conv(s, w_elem=U8, w_zp=128),
    "QLinearConv_u8w_zp_wide": lambda s: qlinear_conv(s, w_elem=U8, w_zp=20, w_range=(0, 200)),
    "QLinearConv_depthwise": lambda s: qlinear_conv(s, group=8),
    "QLinearConv_strided_nobias": lambda s: qlinear_conv(s, stride=2, bias=False),
    "QLinearConv_s8_activations": lambda s: qlinear_conv(s, x_elem=S8),
    "QLinearMatMul_per_tensor": lambda s: qlinear_matmul(s),
    "QLinearMatMul_per_column": lambda s: qlinear_matmul(s, per_column=True),
    "QLinearMatMul_two_inputs": lambda s: qlinear_matmul(s, b_const=False),
    "QGemm_transB": lambda s: qgemm(s),
    "QGemm_per_tensor_B": lambda s: qgemm(s, trans_b=0, per_column=False),
    "QGemm_alpha": lambda s: qgemm(s, alpha=0.5),
    "QGemm_float_output": lambda s: qgemm(s, quantized=False),
    "ConvInteger_s8": lambda s: conv_integer(s),
    "ConvInteger_u8_zp": lambda s: conv_integer(s, w_elem=U8, w_zp=100),
    "MatMulInteger": lambda s: matmul_integer(s),
    "MatMulInteger_per_column_zp": lambda s: matmul_integer(s, per_column_zp=True),
    "QLinearAdd": lambda s: binary(s, "QLinearAdd"),
    "QLinearAdd_s8_broadcast": lambda s: binary(s, "QLinearAdd", elem=S8, broadcast=True),
    "QLinearMul": lambda s: binary(s, "QLinearMul"),
    "QLinearMul_broadcast": lambda s: binary(s, "QLinearMul", broadcast=True),
    "QLinearConcat": concat,
    "QLinearAveragePool": lambda s: unary(s, "QLinearAveragePool", kernel_shape=[3, 3],
                                          pads=[1, 1, 1, 1]),
    "QLinearAveragePool_count_pad": lambda s: unary(s, "QLinearAveragePool", kernel_shape=[3, 3],
                                                    strides=[2, 2], pads=[1, 1, 1, 1],
                                                    count_include_pad=1),
    "QLinearGlobalAveragePool": lambda s: unary(s, "QLinearGlobalAveragePool"),
    "QLinearGlobalAveragePool_nhwc": lambda s: unary(s, "QLinearGlobalAveragePool",
                                                     channels_last=1),
    "QLinearSigmoid": lambda s: unary(s, "QLinearSigmoid"),
    "QLinearSigmoid_s8": lambda s: unary(s, "QLinearSigmoid", elem=S8),
    "QLinearLeakyRelu": lambda s: unary(s, "QLinearLeakyRelu", alpha=0.1),
    "QLinearSoftmax": lambda s: unary(s, "QLinearSoftmax", opset=13, axis=-1),
    "QLinearSoftmax_s8": lambda s: unary(s, "QLinearSoftmax", elem=S8, opset=13, axis=-1),
}
