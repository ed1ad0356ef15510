"""MatMulInteger / ConvInteger reading a zero point computed at run time: dynamic quantization.

onnxruntime's ``quantize_dynamic`` (https://onnxruntime.ai/docs/performance/model-optimizations/
quantization.html, "Dynamic quantization") writes, for each MatMul / Conv with a constant weight:

    x_q, s_x, z_x = DynamicQuantizeLinear(x)            scale and zero point of x, per run
    acc = MatMulInteger(x_q, w_q, z_x, z_w)             Σ (x_q - z_x)·(w_q - z_w), int32
    y = Cast_f32(acc) · (s_x · s_w) [+ bias]            Cast, Mul of the two scales, Mul, Add

The importer rewrites QOperator ops with constant zero points into DequantizeLinear pairs
(qoperator.py); a zero point known only at run time has no such form. This converter writes
the integer op as what the passes make of a quantized MatMul / Conv: an int8 compute node
(``ir.chain.Fused``) with an empty chain and an int32 output, its src zero point read at run
time from the input after the op's own ones (``Fused.src_zero_point_port``: 2 for MatMul, 3
for Conv, whose bias port stays empty). oneDNN takes zero points as run-time
arguments of the primitive anyway, so the kernel is the same int8 primitive as for a QDQ
model: ``acc`` exact in int32, as ONNX defines it. The passes then fold the Cast, the Mul by
the scales and the bias into that node (fuse_post_ops).

Weights: ``w_q - z_w`` stored as s8 with zero point 0 when it fits (always with the
quantizer's symmetric s8 weights), else — a MatMul with one weight zero point — the weights
and their zero point as they are (oneDNN's matmul takes it); a ConvInteger's
(``weight_type=QUInt8``: asymmetric u8 weights) and a MatMulInteger's with zero points per
column (``per_channel=True``) as ``w_q - z_w`` in int16, which passes/weight_zero_point.py
splits into a main and a box-sum node, as it splits a QDQ convolution's (the fp32 mode's
strip_quantization reads the same node as the float op). Refused, so the node runs as a float
island with the reason: run-time weights, a per-row src zero point.
"""

from __future__ import annotations

import numpy as np

from qfuse.compiler.onnx_import import convert_math, convert_spatial
from qfuse.compiler.onnx_import.context import Context, NodeView
from qfuse.compiler.onnx_import.convert_quant import as_int8, centered_weights
from qfuse.ir.chain import Fused
from qfuse.ir.ops import Op, arity
from qfuse.ir.types import DType, TensorInfo


def dynamic_quantize_linear(ctx: Context, node: NodeView) -> None:
    """DynamicQuantizeLinear(x) → (y u8, scale, zero point): a native op
    (compiler/lower/lower_dynamic.py)."""
    if len(node.outputs) != 3 or not all(node.outputs):
        raise ctx.malformed(node, "DynamicQuantizeLinear has three outputs")
    ctx.emit(node, Op.DYNAMIC_QUANTIZE_LINEAR, node.inputs[:1], outputs=list(node.outputs))


def runtime_zero_point(ctx: Context, node: NodeView) -> bool:
    """Whether MatMulInteger / ConvInteger ``node`` reads its src zero point at run time."""
    zx = node.input(2)
    return bool(zx) and not ctx.is_const(zx)


def integer_op(ctx: Context, node: NodeView) -> None:
    """MatMulInteger / ConvInteger with a run-time src zero point (module docstring)."""
    conv = node.op_type == "ConvInteger"
    x_info = ctx.input_info(node, 0)
    if x_info.dtype is not DType.U8:  # DynamicQuantizeLinear writes u8
        raise ctx.unsupported(node, f"src is {x_info.dtype.name} with a run-time zero point; "
                                    "only u8 (DynamicQuantizeLinear's) is supported")
    zx = node.input(2)
    z_info = ctx.input_info(node, 2)
    if int(np.prod(z_info.shape)) != 1:
        raise ctx.unsupported(node, f"src zero point '{zx}' of shape {list(z_info.shape)}: "
                                    "only one per tensor has a oneDNN form")
    if z_info.dtype != x_info.dtype:
        raise ctx.malformed(node, f"src zero point '{zx}' is {z_info.dtype.name}, the src "
                                  f"{x_info.dtype.name}")
    weights, wei_zp = _weights(ctx, node, conv)
    _integer_node(ctx, node, weights, wei_zp)


def _integer_node(ctx: Context, node: NodeView, weights: str, wei_zp: int) -> None:
    """The int8 compute node of ``node`` reading ``weights``, its src zero point at run time,
    writing ``acc`` as s32."""
    conv = node.op_type == "ConvInteger"
    zx = node.input(2)
    output = node.outputs[0]
    view = NodeView(node.name, node.op_type.removesuffix("Integer"), node.domain,
                    [node.inputs[0], weights], [output], dict(node.attrs),
                    list(node.origin), node.proto)
    (convert_spatial.conv if conv else convert_math.matmul)(ctx, view)
    ir_node = ctx.graph.producer(output)
    assert ir_node is not None
    own = arity(ir_node.op)[1]
    assert own is not None
    while len(ir_node.inputs) < own:
        ir_node.inputs.append("")  # an absent optional input (Conv's bias): nothing to link
    port = ctx.graph.append_input(ir_node, ctx.materialize(node, zx))
    ir_node.fused = Fused(src_zero_point_port=port,
                          wei_zero_point=wei_zp, absorbed=[node.name],
                          notes=[f"src zero point '{zx}' read at run time (dynamic "
                                 "quantization)"])
    shape = ctx.graph.info(output).shape
    ctx.graph.set_info(output, TensorInfo(shape, DType.S32))


def _weights(ctx: Context, node: NodeView, conv: bool) -> tuple[str, int]:
    """The weights value the node reads and its (per-tensor) zero point: s8 with zero point 0
    when ``w − zw`` fits, a MatMul's u8 weights and their one zero point as they are (oneDNN's
    matmul takes it), else ``w − zw`` as int16 (a convolution's, a MatMul's per column),
    which passes/weight_zero_point.py splits into two int8 nodes."""
    w_name, zw_name = node.input(1), node.input(3)
    if not ctx.is_const(w_name) or (zw_name and not ctx.is_const(zw_name)):
        raise ctx.unsupported(node, "run-time weights or weight zero point with a run-time src "
                                    "zero point")
    w = ctx.consts[w_name]
    if w.dtype not in (np.uint8, np.int8):
        raise ctx.malformed(node, f"weights '{w_name}' are {w.dtype}, not u8 / s8")
    zw = ctx.consts[zw_name] if zw_name else np.zeros((), w.dtype)
    axis = 0 if conv else w.ndim - 1
    if zw.size != 1 and (zw.ndim != 1 or zw.size != w.shape[axis]):
        raise ctx.malformed(node, f"weight zero point of shape {list(zw.shape)} for weights "
                                  f"{list(w.shape)}")
    real = centered_weights(w, zw, axis)
    s8 = as_int8(real)
    if s8 is not None:
        if w.dtype == np.int8 and not np.any(zw):
            return w_name, 0
        return ctx.new_const(f"{w_name}_s8", s8), 0
    if not conv and zw.size == 1:
        return w_name, int(zw.reshape(-1)[0])
    return ctx.new_const(f"{w_name}_centered", real.astype(np.int16)), 0
