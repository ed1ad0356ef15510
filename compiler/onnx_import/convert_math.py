"""Elementwise math, activations, normalizations, Gemm and MatMul.

Softmax before opset 13 flattens the input to 2-D at ``axis`` and normalizes each row; that is
the IR's last-axis softmax exactly when every dim from ``axis`` to the second-to-last is 1, the
only case accepted. Clip's min/max inputs (opset 11+) must be constants; a missing bound is
±inf.
"""

from __future__ import annotations

import math

import numpy as np

from qfuse.compiler.onnx_import.context import Context, NodeView
from qfuse.ir.ops import (
    AlphaAttrs,
    AxisAttrs,
    BatchNormAttrs,
    ClipAttrs,
    GeluApprox,
    GeluAttrs,
    GemmAttrs,
    HardSigmoidAttrs,
    LayerNormAttrs,
    Op,
)

_BINARY = {"Add": Op.ADD, "Sub": Op.SUB, "Mul": Op.MUL, "Div": Op.DIV}
_UNARY = {"Relu": Op.RELU, "Sigmoid": Op.SIGMOID, "Tanh": Op.TANH, "HardSwish": Op.HARD_SWISH,
          "Identity": Op.IDENTITY}


def binary(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, _BINARY[node.op_type], node.inputs[:2])


def sum_(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.SUM, node.inputs)


def unary(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, _UNARY[node.op_type], node.inputs[:1])


def prelu(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.PRELU, node.inputs[:2])


def leaky_relu(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.LEAKY_RELU, node.inputs[:1], AlphaAttrs(float(node.attr("alpha", 0.01))))


def hard_sigmoid(ctx: Context, node: NodeView) -> None:
    attrs = HardSigmoidAttrs(float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5)))
    ctx.emit(node, Op.HARD_SIGMOID, node.inputs[:1], attrs)


def clip(ctx: Context, node: NodeView) -> None:
    bounds = []
    for port, what, default in ((1, "min", -math.inf), (2, "max", math.inf)):
        value = ctx.optional_const(node, port, what)
        if value is None:
            bounds.append(default)
        elif value.size != 1:
            raise ctx.malformed(node, f"{what} must be a scalar, got shape {value.shape}")
        else:
            bounds.append(float(value.reshape(())))
    if any(math.isnan(b) for b in bounds):
        raise ctx.malformed(node, f"Clip bounds {bounds} contain NaN")
    ctx.emit(node, Op.CLIP, node.inputs[:1], ClipAttrs(bounds[0], bounds[1]))


def gelu(ctx: Context, node: NodeView) -> None:
    """The opset 20 Gelu op, or a decomposed GELU recognized by patterns.fuse_gelu."""
    approximate = str(node.attr("approximate", "none"))
    try:
        mode = GeluApprox(approximate)
    except ValueError as exc:
        raise ctx.malformed(node, f"unknown approximate '{approximate}'") from exc
    ctx.emit(node, Op.GELU, node.inputs[:1], GeluAttrs(mode))


def _axis(ctx: Context, node: NodeView, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.malformed(node, f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def softmax(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    if ctx.opset >= 13:
        axis = _axis(ctx, node, int(node.attr("axis", -1)), x.rank)
    else:
        axis = _axis(ctx, node, int(node.attr("axis", 1)), x.rank)
        if any(d != 1 for d in x.shape[axis:-1]):
            raise ctx.unsupported(
                node, f"opset {ctx.opset} Softmax on axis {axis} of shape {x.shape} normalizes "
                      f"over the flattened dims {axis}.., which differs from a last-axis "
                      f"softmax; not supported")
        axis = x.rank - 1
    ctx.emit(node, Op.SOFTMAX, node.inputs[:1], AxisAttrs(axis))


def layer_norm(ctx: Context, node: NodeView) -> None:
    ctx.check_unused(node, 1, "Mean / InvStdDev")
    x = ctx.input_info(node, 0)
    axis = _axis(ctx, node, int(node.attr("axis", -1)), x.rank)
    attrs = LayerNormAttrs(axis, float(node.attr("epsilon", 1e-5)))
    ctx.emit(node, Op.LAYER_NORM, node.inputs[:3], attrs)


def batch_norm(ctx: Context, node: NodeView) -> None:
    if node.attr("training_mode", 0):
        raise ctx.unsupported(node, "training_mode=1 is not supported (inference only)")
    ctx.check_unused(node, 1, "running mean / var")
    ctx.emit(node, Op.BATCH_NORM, node.inputs[:5], BatchNormAttrs(float(node.attr("epsilon",
                                                                                  1e-5))))


def gemm(ctx: Context, node: NodeView) -> None:
    attrs = GemmAttrs(float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0)),
                      bool(node.attr("transA", 0)), bool(node.attr("transB", 0)))
    ctx.emit(node, Op.GEMM, node.inputs[:3], attrs)


def matmul(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.MATMUL, node.inputs[:2])


def dropout(ctx: Context, node: NodeView) -> None:
    ctx.check_unused(node, 1, "mask")
    training = ctx.optional_const(node, 2, "training_mode")
    if training is not None and bool(np.any(training)):
        raise ctx.unsupported(node, "training_mode=True is not supported (inference only)")
    ctx.emit(node, Op.DROPOUT, node.inputs[:1])
