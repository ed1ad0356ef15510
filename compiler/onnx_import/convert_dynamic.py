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
and their zero point as they are; a ConvInteger's (``weight_type=QUInt8``: asymmetric u8
weights) split into a main and a box-sum convolution as passes/weight_zero_point.py splits a
QDQ one, each writing its exact accumulator in float32, and their sum; a MatMulInteger's with
zero points per column (``per_channel=True``) likewise into two matmuls, the second's weights
the offsets ``o`` per column. Refused, so the node runs as a float island with the reason:
run-time weights, a per-row src zero point.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from qfuse.compiler.onnx_import import convert_math, convert_spatial
from qfuse.compiler.onnx_import.context import Context, NodeView
from qfuse.compiler.onnx_import.convert_quant import as_int8, centered_weights
from qfuse.ir.chain import ChainOp, Fused, Scale
from qfuse.ir.ops import NoAttrs, Op, arity
from qfuse.ir.types import DType, TensorInfo
from qfuse.passes.weight_zero_point import Split, split, split_matmul

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
    weights = _weights(ctx, node, conv)
    if isinstance(weights, Split):
        _split(ctx, node, weights)
        return
    _integer_node(ctx, node, weights[0], weights[1], node.outputs[0], DType.S32)


def _integer_node(ctx: Context, node: NodeView, weights: str, wei_zp: int, output: str,
                  dtype: DType, chain: list[ChainOp] | None = None, name: str = "",
                  pointwise: bool = False) -> None:
    """The int8 compute node of ``node`` (named ``name`` if given) reading ``weights``, its
    src zero point at run time, writing ``output`` (``acc`` as s32, or the chain's f32);
    ``pointwise``: a 1x1 convolution (stride 1, no padding) instead of ``node``'s window."""
    conv = node.op_type == "ConvInteger"
    zx = node.input(2)
    view = NodeView(name or node.name, node.op_type.removesuffix("Integer"), node.domain,
                    [node.inputs[0], weights], [output], {} if pointwise else dict(node.attrs),
                    list(node.origin), node.proto)
    (convert_spatial.conv if conv else convert_math.matmul)(ctx, view)
    ir_node = ctx.graph.producer(output)
    assert ir_node is not None
    own = arity(ir_node.op)[1]
    assert own is not None
    while len(ir_node.inputs) < own:
        ir_node.inputs.append("")  # an absent optional input (Conv's bias): nothing to link
    port = ctx.graph.append_input(ir_node, ctx.materialize(node, zx))
    ir_node.fused = Fused(chain=list(chain or []), src_zero_point_port=port,
                          wei_zero_point=wei_zp, absorbed=[node.name],
                          notes=[f"src zero point '{zx}' read at run time (dynamic "
                                 "quantization)"])
    shape = ctx.graph.info(output).shape
    ctx.graph.set_info(output, TensorInfo(shape, dtype))


def _split(ctx: Context, node: NodeView, parts: Split) -> None:
    """A ConvInteger whose weights leave s8 (or a MatMulInteger's with zero points per
    column): the main and box-sum convolutions (matmuls) of passes/weight_zero_point.py, each
    writing its accumulator in float32 (exact while below 2^24), and their sum, which the
    Cast to float32 then reads as it is."""
    accs = []
    for weights, scales, what in ((parts.main, None, "main"),
                                  (parts.box, parts.box_scales, "box_sum")):
        name = ctx.new_const(f"{node.input(1)}_{what}", weights)
        acc = ctx.graph.unique_name(f"{node.outputs[0]}/{what}")
        chain = [] if scales is None or np.all(scales == 1) else [Scale.of(scales)]
        if what == "box_sum" and parts.spread is not None:  # channel sums, then their box
            sums = ctx.graph.unique_name(f"{node.outputs[0]}/channel_sum")
            _integer_node(ctx, node, name, 0, sums, DType.F32, chain,
                          f"{node.name}/channel_sum", pointwise=True)
            window = ctx.graph.producer(accs[0])
            assert window is not None
            ones = ctx.new_const(f"{node.name}/box_kernel",
                                 np.ones((1, 1, *parts.spread), np.float32))
            box = NodeView(f"{node.name}/{what}", "Conv", node.domain, [sums, ones], [acc],
                           {}, list(node.origin), node.proto)
            ctx.emit(box, Op.CONV, [sums, ones], dataclasses.replace(window.attrs, group=1),
                     outputs=[acc])
        else:
            _integer_node(ctx, node, name, 0, acc, DType.F32, chain, f"{node.name}/{what}")
        accs.append(acc)
    ctx.emit(node, Op.ADD, accs, NoAttrs())
    out = node.outputs[0]
    ctx.graph.set_info(out, TensorInfo(ctx.graph.info(out).shape, DType.F32))


def _weights(ctx: Context, node: NodeView, conv: bool) -> tuple[str, int] | Split:
    """The weights value the node reads and its (per-tensor) zero point, or a convolution's
    weights split in two (passes/weight_zero_point.py) when they leave s8."""
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
    s8 = as_int8(centered_weights(w, zw, axis))
    if s8 is not None:
        if w.dtype == np.int8 and not np.any(zw):
            return w_name, 0
        return ctx.new_const(f"{w_name}_s8", s8), 0
    dtype = DType.U8 if w.dtype == np.uint8 else DType.S8
    if conv:
        return split(w, zw, dtype, int(node.attr("group", 1)))
    if zw.size != 1:  # oneDNN's matmul takes one weight zero point: a second matmul
        return split_matmul(w, zw, dtype)
    return w_name, int(zw.reshape(-1)[0])
