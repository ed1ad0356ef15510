"""Reductions, LRN, Sqrt and Pow (float32), which oneDNN has primitives for.

Reduce* (ReduceMean / Max / Min / Sum / Prod / L1 / L2 / SumSquare): the axes come from the
``axes`` attribute (before opset 18; ReduceSum before 13) or from the optional second input
(opset 18; ReduceSum 13), which must then be a constant. Negative axes count from the end.
No axes: every axis, or — with ``noop_with_empty_axes=1`` — the input itself (an Identity).
ReduceLogSum / ReduceLogSumExp stay float islands (oneDNN's reduction has no log form; the
island's reason says so), as do reductions of other element types, of a rank-0 tensor, or over
an empty dim (ONNX defines those as the reduction's identity element; oneDNN takes no empty
tensors).

LRN (across channels, ONNX's only form): size, alpha, beta, bias as attributes. Pow: the
exponent must be a constant scalar (it becomes an attribute); another exponent tensor keeps
the node an island. Sqrt: float32.
"""

from __future__ import annotations

import numpy as np

from qfuse.compiler.onnx_import.context import Context, NodeView
from qfuse.ir import DType
from qfuse.ir.ops import AxesAttrs, LrnAttrs, Op, PowAttrs, ReduceAttrs

REDUCE_OPS = {
    "ReduceMean": Op.REDUCE_MEAN, "ReduceMax": Op.REDUCE_MAX, "ReduceMin": Op.REDUCE_MIN,
    "ReduceSum": Op.REDUCE_SUM, "ReduceProd": Op.REDUCE_PROD, "ReduceL1": Op.REDUCE_L1,
    "ReduceL2": Op.REDUCE_L2, "ReduceSumSquare": Op.REDUCE_SUM_SQUARE,
}


def _float32(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    if x.dtype is not DType.F32:
        raise ctx.unsupported(node, f"the native kernel reads float32, not {x.dtype.name}")


def reduce(ctx: Context, node: NodeView) -> None:
    _float32(ctx, node)
    x = ctx.input_info(node, 0)
    if x.rank == 0:
        raise ctx.unsupported(node, "a rank-0 input (oneDNN describes no scalars)")
    given = node.attr("axes")
    if given is None and node.input(1):
        given = [int(a) for a in np.asarray(ctx.const(node, 1, "axes")).ravel()]
    axes = [int(a) for a in given or ()]
    if not axes and node.attr("noop_with_empty_axes", 0):
        ctx.emit(node, Op.IDENTITY, node.inputs[:1])
        return
    if any(not -x.rank <= a < x.rank for a in axes):
        raise ctx.malformed(node, f"axes {axes} are out of range for rank {x.rank}")
    resolved = tuple(sorted({a % x.rank for a in axes})) if axes else tuple(range(x.rank))
    if len(resolved) != len(axes) and axes:
        raise ctx.malformed(node, f"axes {axes} repeat an axis")
    if any(x.shape[a] == 0 for a in resolved):
        raise ctx.unsupported(node, f"it reduces an empty dim of shape {x.shape} (the "
                                    f"identity element; oneDNN takes no empty tensors)")
    keepdims = bool(node.attr("keepdims", 1))
    pool = GLOBAL_POOLS.get(node.op_type)
    if pool is not None and x.rank >= 4 and resolved == tuple(range(2, x.rank)):
        _global_pool(ctx, node, pool, resolved, keepdims)
        return
    ctx.emit(node, REDUCE_OPS[node.op_type], node.inputs[:1], ReduceAttrs(resolved, keepdims))


# A mean / max over every spatial dim of an image or a video, [N, C, H, W (, D)], is the global
# pool (ONNX: GlobalAveragePool / GlobalMaxPool reduce exactly those dims): torch.export
# writes adaptive_avg_pool2d(x, 1) as ReduceMean(axes=[2, 3]) where the TorchScript exporter
# wrote GlobalAveragePool, and timm's heads write x.mean((2, 3)). The pool then takes its
# quantizers like the exporter's own GlobalAveragePool (an int8 pooling kernel: EfficientNet-B0
# QDQ exported by torch.export 217 → 166 kernels, as with the TorchScript exporter).
GLOBAL_POOLS = {"ReduceMean": Op.GLOBAL_AVG_POOL, "ReduceMax": Op.GLOBAL_MAX_POOL}


def _global_pool(ctx: Context, node: NodeView, pool: Op, axes: tuple[int, ...],
                 keepdims: bool) -> None:
    if keepdims:
        ctx.emit(node, pool, node.inputs[:1])
        return
    pooled = ctx.graph.unique_name(f"{node.outputs[0]}@pooled")
    ctx.emit(node, pool, node.inputs[:1], outputs=[pooled])
    ctx.emit(node, Op.SQUEEZE, [pooled], AxesAttrs(axes))


def no_log_form(ctx: Context, node: NodeView) -> None:
    """ReduceLogSum / ReduceLogSumExp: an island, saying why."""
    raise ctx.unsupported(node, f"oneDNN's reduction has no algorithm for {node.op_type} "
                                f"(max, min, sum, mul, mean and Lp norms only)")


def lrn(ctx: Context, node: NodeView) -> None:
    _float32(ctx, node)
    x = ctx.input_info(node, 0)
    if x.rank < 3:
        raise ctx.unsupported(node, f"LRN of rank {x.rank} (the native kernel takes "
                                    f"{{N, C, spatial...}})")
    size = node.attr("size")
    if size is None or int(size) < 1:
        raise ctx.malformed(node, f"size must be a positive integer, got {size}")
    attrs = LrnAttrs(int(size), float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75)),
                     float(node.attr("bias", 1.0)))
    ctx.emit(node, Op.LRN, node.inputs[:1], attrs)


# float32 unary math the IR has: Sqrt and Exp on oneDNN's eltwise, Log in numpy
# (compiler/lower/lower_misc.py, docs/numerics.md)
FLOAT_UNARY = {"Sqrt": Op.SQRT, "Exp": Op.EXP, "Log": Op.LOG}


def float_unary(ctx: Context, node: NodeView) -> None:
    _float32(ctx, node)
    ctx.emit(node, FLOAT_UNARY[node.op_type], node.inputs[:1])


def power(ctx: Context, node: NodeView) -> None:
    _float32(ctx, node)
    exponent = np.asarray(ctx.const(node, 1, "exponent"))
    if exponent.size != 1 or exponent.dtype.kind not in "fiu":
        raise ctx.unsupported(node, f"exponent of shape {exponent.shape} and type "
                                    f"{exponent.dtype} (a constant scalar is lowered natively)")
    x = ctx.input_info(node, 0)
    if exponent.ndim > x.rank:
        raise ctx.unsupported(node, f"exponent of rank {exponent.ndim} broadcasts x of rank "
                                    f"{x.rank} to a higher rank")
    ctx.emit(node, Op.POW, node.inputs[:1], PowAttrs(float(exponent.reshape(()))))
