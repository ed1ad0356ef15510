"""Reductions, LRN, Sqrt and Pow: the ONNX definitions, float32 results.

Precision (what ``reference`` mode computes, and what the oneDNN lowerings are tested
against, compiler/lower/lower_reduce.py):

- ReduceMean / Sum / Prod / L1 / L2 / SumSquare and LRN accumulate in float64 and round once
  to float32: within half an ulp of the exact value. ONNX Runtime and oneDNN sum in float32 in
  their own orders, so they differ from it by rounding in the sum (the tests bound the gap
  relative to Σ|x|, ulp-level).
- ReduceMax / ReduceMin pick an element: exact in every engine.
- Sqrt is one IEEE float32 operation (correctly rounded everywhere).
- Pow with exponent 2 is ``x·x`` and with exponent 3 ``x·x·x`` in float32 — what ONNX
  Runtime's Pow kernel computes, bit for bit (measured on 10⁵ values); other exponents are
  float64 ``pow`` rounded once (ONNX Runtime's float32 ``pow`` is within an ulp of it).

ONNX LRN (https://onnx.ai/onnx/operators/onnx__LRN.html): the window of channel c is
``c - floor((size-1)/2) .. c + ceil((size-1)/2)`` clipped to [0, C), and the divisor is
``size`` whatever the clipping.
"""

from __future__ import annotations

import numpy as np

from qfuse.ir.graph import Node
from qfuse.ir.ops import LrnAttrs, Op, PowAttrs, ReduceAttrs
from qfuse.runtime.reference.registry import Arrays, impl, need

F32 = np.float32


def _reduce64(op: Op, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    wide = x.astype(np.float64)
    if op is Op.REDUCE_MEAN:
        return wide.mean(axis=axes, keepdims=True)
    if op is Op.REDUCE_SUM:
        return wide.sum(axis=axes, keepdims=True)
    if op is Op.REDUCE_PROD:
        return wide.prod(axis=axes, keepdims=True)
    if op is Op.REDUCE_L1:
        return np.abs(wide).sum(axis=axes, keepdims=True)
    if op is Op.REDUCE_L2:
        return np.sqrt(np.square(wide).sum(axis=axes, keepdims=True))
    assert op is Op.REDUCE_SUM_SQUARE, op
    return np.square(wide).sum(axis=axes, keepdims=True)


@impl(Op.REDUCE_MEAN, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_SUM, Op.REDUCE_PROD,
      Op.REDUCE_L1, Op.REDUCE_L2, Op.REDUCE_SUM_SQUARE)
def reduce(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: ReduceAttrs = node.attrs
    x = need(args, 0)
    axes = attrs.axes
    if node.op in (Op.REDUCE_MAX, Op.REDUCE_MIN):
        pick = np.max if node.op is Op.REDUCE_MAX else np.min
        y = pick(x, axis=axes, keepdims=True)
    elif x.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            y = _reduce64(node.op, x, axes).astype(x.dtype)
    else:  # the importer keeps integer reductions as islands (ONNX Runtime's kernels)
        raise ValueError(f"{node.op.value} reads a float type here, got {x.dtype}")
    if not attrs.keepdims:
        y = y.reshape([d for i, d in enumerate(y.shape) if i not in axes])
    return [np.array(y, order="C", copy=True)]  # (ascontiguousarray makes 0-d 1-d)


@impl(Op.LRN)
def lrn(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: LrnAttrs = node.attrs
    x = need(args, 0)
    if x.dtype != F32:
        raise ValueError(f"LRN reads float32, got {x.dtype}")
    wide = x.astype(np.float64)
    squares = np.square(wide)
    channels = x.shape[1]
    before, after = (attrs.size - 1) // 2, attrs.size // 2  # floor and ceil of (size-1)/2
    total = np.zeros_like(wide)
    for c in range(channels):
        lo, hi = max(0, c - before), min(channels, c + after + 1)
        total[:, c] = squares[:, lo:hi].sum(axis=1)
    y = wide / (attrs.bias + attrs.alpha / attrs.size * total) ** attrs.beta
    return [y.astype(F32)]


@impl(Op.SQRT)
def sqrt(node: Node, args: Arrays) -> list[np.ndarray]:
    x = need(args, 0)
    with np.errstate(invalid="ignore"):
        return [np.sqrt(x)]


@impl(Op.EXP, Op.LOG)
def exp_log(node: Node, args: Arrays) -> list[np.ndarray]:
    """float32 exp / log as numpy computes them (log of a negative NaN, of 0 -inf)."""
    x = need(args, 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return [(np.exp if node.op is Op.EXP else np.log)(x)]


@impl(Op.POW)
def power(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: PowAttrs = node.attrs
    x = need(args, 0)
    if x.dtype != F32:
        raise ValueError(f"Pow reads float32, got {x.dtype}")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if attrs.exponent == 2.0:
            return [x * x]
        if attrs.exponent == 3.0:
            return [x * x * x]
        return [np.power(x.astype(np.float64), attrs.exponent).astype(F32)]
