"""Elementwise ops: binary arithmetic with numpy broadcasting, activations.

Precision: the arithmetic ops (Add, Sub, Mul, Div, Sum, Relu, Clip, LeakyRelu, PRelu,
HardSigmoid, HardSwish) are single float32 operations, computed in float32, so they are the
correctly rounded results ONNX Runtime's kernels produce too. Gelu (erf form) is ONNX Runtime's
float32 kernel step by step (ops_mlas.py), bit for bit. Sigmoid, Tanh and the tanh form of Gelu
are computed in float64 and rounded once to float32: the exact value to within half an ulp,
where ONNX Runtime uses float32 polynomial approximations (a few ulps; the tests bound the gap
at 1e-5 relative).

Integer Div truncates toward zero (C semantics, as ONNX Runtime); other integer arithmetic
wraps around in the input type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import reduce

import numpy as np

from qfuse.ir.errors import InputError
from qfuse.ir.graph import Node
from qfuse.ir.ops import (
    AlphaAttrs,
    ClipAttrs,
    GeluApprox,
    GeluAttrs,
    HardSigmoidAttrs,
    HardSwishAttrs,
    LOGIC_OPS,
    Op,
    TableAttrs,
)
from qfuse.runtime.reference.ops_mlas import gelu_erf
from qfuse.runtime.reference.registry import Arrays, impl, need

F32 = np.float32


def _same_type(a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise ValueError(f"operands of different types {a.dtype} and {b.dtype}")


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(a, b)
    if np.any(b == 0):
        raise ZeroDivisionError("integer division by zero")
    wide = a.astype(np.int64), b.astype(np.int64)
    q = np.abs(wide[0]) // np.abs(wide[1]) * np.sign(wide[0]) * np.sign(wide[1])
    return q.astype(np.result_type(a, b))


_BINARY = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: _divide,
           Op.MAX: np.maximum, Op.MIN: np.minimum}


@impl(Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN)
def binary(node: Node, args: Arrays) -> list[np.ndarray]:
    a, b = need(args, 0), need(args, 1)
    _same_type(a, b)
    with np.errstate(over="ignore", invalid="ignore"):
        return [np.asarray(_BINARY[node.op](a, b))]


@impl(Op.WHERE)
def where(node: Node, args: Arrays) -> list[np.ndarray]:
    """ONNX Where: x where the condition holds, else y (numpy's where: the same broadcast)."""
    cond, x, y = need(args, 0), need(args, 1), need(args, 2)
    _same_type(x, y)
    return [np.where(cond.astype(bool, copy=False), x, y)]


@impl(Op.LOGIC)
def logic(node: Node, args: Arrays) -> list[np.ndarray]:
    """ONNX's comparisons (Equal, Less, ...) and logical ops (And, Or, Xor, Not): numpy's,
    broadcast the same way; bool out."""
    function = getattr(np, LOGIC_OPS[node.attrs.op])
    return [np.asarray(function(*[need(args, i) for i in range(len(node.inputs))]), bool)]


@impl(Op.GATHER)
def gather(node: Node, args: Arrays) -> list[np.ndarray]:
    """ONNX Gather: ``data`` indexed along ``axis`` by ``indices`` (negative ones count from
    the end, as numpy's do); an index out of range is an InputError naming the node (numpy's
    ``take`` checks the range itself)."""
    data, indices = need(args, 0), need(args, 1)
    axis = node.attrs.axis % data.ndim
    try:
        return [np.take(data, indices, axis=axis)]
    except IndexError as exc:
        raise InputError(f"node {node}: an index is out of range for axis {axis} of size "
                         f"{data.shape[axis]} ({exc})") from exc


@impl(Op.SUM)
def sum_(node: Node, args: Arrays) -> list[np.ndarray]:
    arrays = [need(args, i) for i in range(len(args))]
    for other in arrays[1:]:
        _same_type(arrays[0], other)
    with np.errstate(over="ignore", invalid="ignore"):
        total = reduce(np.add, arrays[1:], arrays[0])
    return [np.broadcast_to(total, np.broadcast_shapes(*(a.shape for a in arrays))).copy()]


@impl(Op.RELU)
def relu(node: Node, args: Arrays) -> list[np.ndarray]:
    x = need(args, 0)
    return [np.where(x < 0, x.dtype.type(0), x)]


@impl(Op.CLIP)
def clip(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: ClipAttrs = node.attrs
    x = need(args, 0)
    y = x
    if attrs.min > -math.inf:
        y = np.maximum(y, _bound(math.ceil, attrs.min, x.dtype))
    if attrs.max < math.inf:
        y = np.minimum(y, _bound(math.floor, attrs.max, x.dtype))
    return [np.array(y, dtype=x.dtype, copy=True)]


def _bound(to_int: Callable[[float], int], value: float, dtype: np.dtype) -> np.generic:
    """A float bound in x's type (integer types: the tightest integer bound, saturated)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return dtype.type(min(max(to_int(value), info.min), info.max))
    return dtype.type(value)


@impl(Op.LEAKY_RELU)
def leaky_relu(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: AlphaAttrs = node.attrs
    x = need(args, 0)
    return [np.where(x >= 0, x, x * F32(attrs.alpha)).astype(x.dtype)]


@impl(Op.PRELU)
def prelu(node: Node, args: Arrays) -> list[np.ndarray]:
    x, slope = need(args, 0), need(args, 1)
    _same_type(x, slope)
    return [np.where(x < 0, x * slope, x).astype(x.dtype)]


def _hard_sigmoid(x: np.ndarray, alpha: np.float32, beta: np.float32) -> np.ndarray:
    return np.minimum(np.maximum(alpha * x + beta, F32(0)), F32(1))


@impl(Op.HARD_SIGMOID)
def hard_sigmoid(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: HardSigmoidAttrs = node.attrs
    x = _float32(need(args, 0))
    return [_hard_sigmoid(x, F32(attrs.alpha), F32(attrs.beta))]


@impl(Op.HARD_SWISH)
def hard_swish(node: Node, args: Arrays) -> list[np.ndarray]:
    # ONNX defines HardSwish as x * HardSigmoid<alpha=1/6, beta=0.5>(x).
    attrs: HardSwishAttrs = node.attrs
    x = _float32(need(args, 0))
    return [x * _hard_sigmoid(x, F32(attrs.alpha), F32(attrs.beta))]


def _float32(x: np.ndarray) -> np.ndarray:
    if x.dtype != F32:
        raise ValueError(f"expected float32, got {x.dtype}")
    return x


@impl(Op.SIGMOID)
def sigmoid(node: Node, args: Arrays) -> list[np.ndarray]:
    x = _float32(need(args, 0)).astype(np.float64)
    with np.errstate(over="ignore"):
        return [(1.0 / (1.0 + np.exp(-x))).astype(F32)]


@impl(Op.SWISH)
def swish(node: Node, args: Arrays) -> list[np.ndarray]:
    """x·sigmoid(x) (SiLU), in float64 and rounded once, like Sigmoid."""
    x = _float32(need(args, 0)).astype(np.float64)
    with np.errstate(over="ignore"):
        return [(x / (1.0 + np.exp(-x))).astype(F32)]


@impl(Op.TANH)
def tanh(node: Node, args: Arrays) -> list[np.ndarray]:
    return [np.tanh(_float32(need(args, 0)).astype(np.float64)).astype(F32)]


@impl(Op.GELU)
def gelu(node: Node, args: Arrays) -> list[np.ndarray]:
    """erf form ``0.5·x·(1 + erf(x/√2))``: float32, ONNX Runtime's kernel (ops_mlas.py);
    tanh form ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``: float64, rounded once."""
    attrs: GeluAttrs = node.attrs
    x = _float32(need(args, 0))
    if attrs.approximate is not GeluApprox.TANH:
        return [gelu_erf(x)]
    x64 = x.astype(np.float64)
    inner = math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)
    return [(0.5 * x64 * (1.0 + np.tanh(inner))).astype(F32)]


@impl(Op.TABLE)
def table(node: Node, args: Arrays) -> list[np.ndarray]:
    """``y = table[x]``, looked up by x's byte (ir.ops.TableAttrs)."""
    attrs: TableAttrs = node.attrs
    x = np.ascontiguousarray(need(args, 0))
    return [attrs.by_byte[x.view(np.uint8)].view(attrs.info.dtype.np)]
