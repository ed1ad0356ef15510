"""Compute ops: Conv, ConvTranspose, Gemm, MatMul, pooling, normalizations, Softmax.

Precision. Conv, ConvTranspose, Gemm, MatMul and BatchNormalization on floats accumulate in
float64 and round once to float32: the exact value to within one float32 rounding, independent
of summation order. ONNX Runtime sums these in float32 (MLAS SGEMM: one FMA chain per output
along k, cut into k-blocks whose length MLAS derives from the share of N each thread gets, so it
changes with the thread count): it differs by a few float32 ulps, and the tests bound the gap at
``|diff| <= 1e-5 * max(1, |ref|)``. AveragePool, GlobalAveragePool (ops_pool.py),
LayerNormalization and Softmax (ops_mlas.py) compute in float32 in exactly the order of ONNX
Runtime's CPU kernels, and so give its bits. Integer Conv / ConvTranspose / MatMul (int8
compute nodes) accumulate exactly in int64 and return int32.

Sliding windows (Conv, pooling): with the dilated kernel ``ek = (k-1)·d + 1``, output ``o`` of
a spatial dim reads the padded input at ``o·s + j·d`` for taps ``j < k``;
``out = floor((in + pad_begin + pad_end - ek) / s) + 1`` (``ceil`` in pooling's ceil_mode, minus
one when the last window would start inside the end padding, as ONNX Runtime and PyTorch do).
Pooling windows of ceil_mode that run past the end padding read nothing there: MaxPool ignores
those taps; what AveragePool divides by is ONNX Runtime's rule (ops_pool.py).
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from qfuse.ir.graph import Node
from qfuse.ir.ops import (
    AxisAttrs,
    BatchNormAttrs,
    ConvAttrs,
    ConvTransposeAttrs,
    GemmAttrs,
    LayerNormAttrs,
    Op,
    PoolAttrs,
)
from qfuse.runtime.reference.ops_mlas import (
    layer_norm_rows,
    log_softmax_last_axis,
    softmax_last_axis,
)
from qfuse.runtime.reference.ops_pool import average_pool, global_average_pool
from qfuse.runtime.reference.registry import Arrays, impl, need, opt

F32 = np.float32


def _types(*arrays: np.ndarray) -> tuple[type, type]:
    """(accumulation type, output type) for a product of ``arrays``."""
    kinds = {a.dtype.kind for a in arrays}
    if kinds <= {"i", "u"}:
        return np.int64, np.int32
    if kinds == {"f"} and len({a.dtype for a in arrays}) == 1:  # f32 (f16, f64 as ONNX allows)
        return np.float64, arrays[0].dtype.type
    raise ValueError(f"unsupported operand types {[str(a.dtype) for a in arrays]}")


def window_out(size: int, k: int, s: int, d: int, begin: int, end: int, ceil: bool) -> int:
    span = size + begin + end - ((k - 1) * d + 1)
    if span < 0:
        raise ValueError(f"kernel {k} (dilation {d}) is larger than the padded input {size}")
    if not ceil:
        return span // s + 1
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= size + begin else out


def _windows(xp: np.ndarray, kernel: tuple[int, ...], strides: tuple[int, ...],
             dilations: tuple[int, ...], outs: list[int]) -> np.ndarray:
    """View ``[N, C, *outs, *kernel]`` of the padded ``xp``: element (o, j) is xp[o·s + j·d]."""
    n = len(kernel)
    extents = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    view = sliding_window_view(xp, extents, axis=tuple(range(2, 2 + n)))
    picks = tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(outs, strides))
    taps = tuple(slice(None, None, d) for d in dilations)
    return view[(slice(None), slice(None)) + picks + taps]


def _spatial_pads(pads: tuple[int, ...], extra: list[int] | None = None) -> list[tuple[int, int]]:
    n = len(pads) // 2
    extra = extra or [0] * n
    return [(0, 0), (0, 0)] + [(pads[i], pads[n + i] + extra[i]) for i in range(n)]


def _letters(n: int) -> tuple[str, str]:
    """Einsum subscripts for n output dims and n kernel dims."""
    if n > 4:
        raise ValueError(f"{n}-D windows are not supported (at most 4 spatial dims)")
    return "PQRS"[:n], "WXYZ"[:n]


def _add_bias(y: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    if bias is None:
        return y
    return y + bias.astype(y.dtype).reshape((1, -1) + (1,) * (y.ndim - 2))


@impl(Op.CONV)
def conv(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: ConvAttrs = node.attrs
    x, w, bias = need(args, 0), need(args, 1), opt(args, 2)
    acc, out_type = _types(x, w)
    n, g = len(attrs.kernel_shape), attrs.group
    (batch, channels), m = x.shape[:2], w.shape[0]
    if channels % g or m % g or w.shape[1] != channels // g:
        raise ValueError(f"x {x.shape} and w {w.shape} do not fit group={g}")
    outs = [window_out(x.shape[2 + i], attrs.kernel_shape[i], attrs.strides[i],
                       attrs.dilations[i], attrs.pads[i], attrs.pads[n + i], False)
            for i in range(n)]
    xp = np.pad(x.astype(acc), _spatial_pads(attrs.pads))
    cols = _windows(xp, attrs.kernel_shape, attrs.strides, attrs.dilations, outs)
    cols = cols.reshape((batch, g, channels // g) + cols.shape[2:])
    wg = w.astype(acc).reshape((g, m // g, channels // g) + w.shape[2:])
    o, k = _letters(n)
    y = np.einsum(f"bgc{o}{k},gmc{k}->bgm{o}", cols, wg, optimize=True)
    y = _add_bias(y.reshape((batch, m) + tuple(outs)), bias)
    return [y.astype(out_type)]


@impl(Op.CONV_TRANSPOSE)
def conv_transpose(node: Node, args: Arrays) -> list[np.ndarray]:
    """y[o·s + j·d - pad_begin] += x[o]·w[j]: scatter every tap, then crop the pads."""
    attrs: ConvTransposeAttrs = node.attrs
    x, w, bias = need(args, 0), need(args, 1), opt(args, 2)
    acc, out_type = _types(x, w)
    n, g = len(attrs.kernel_shape), attrs.group
    (batch, channels), per_group = x.shape[:2], w.shape[1]
    if channels % g or w.shape[0] != channels:
        raise ValueError(f"x {x.shape} and w {w.shape} do not fit group={g}")
    ins, kernel = x.shape[2:], w.shape[2:]
    xg = x.astype(acc).reshape((batch, g, channels // g) + ins)
    wg = w.astype(acc).reshape((g, channels // g, per_group) + kernel)
    o, k = _letters(n)
    taps = np.einsum(f"bgc{o},gcm{k}->bgm{o}{k}", xg, wg, optimize=True)
    full = [(i - 1) * s + (kk - 1) * d + 1 + p for i, s, kk, d, p in
            zip(ins, attrs.strides, kernel, attrs.dilations, attrs.output_padding)]
    y = np.zeros((batch, g, per_group) + tuple(full), dtype=acc)
    for j in itertools.product(*(range(kk) for kk in kernel)):
        dst = tuple(slice(jj * d, jj * d + (i - 1) * s + 1, s)
                    for jj, d, i, s in zip(j, attrs.dilations, ins, attrs.strides))
        y[(Ellipsis,) + dst] += taps[(Ellipsis,) + j]
    crop = tuple(slice(attrs.pads[i], full[i] - attrs.pads[n + i]) for i in range(n))
    y = y[(Ellipsis,) + crop]
    y = _add_bias(y.reshape((batch, g * per_group) + y.shape[3:]), bias)
    return [y.astype(out_type)]


@impl(Op.GEMM)
def gemm(node: Node, args: Arrays) -> list[np.ndarray]:
    """``alpha · A' · B' + beta · C`` with A' = Aᵀ if trans_a, B' = Bᵀ if trans_b."""
    attrs: GemmAttrs = node.attrs
    a, b, c = need(args, 0), need(args, 1), opt(args, 2)
    acc, out_type = _types(a, b)
    a64, b64 = a.astype(acc), b.astype(acc)
    y = attrs.alpha * ((a64.T if attrs.trans_a else a64) @ (b64.T if attrs.trans_b else b64))
    if c is not None:
        y = y + attrs.beta * c.astype(acc)
    return [y.astype(out_type)]


@impl(Op.MATMUL)
def matmul(node: Node, args: Arrays) -> list[np.ndarray]:
    a, b = need(args, 0), need(args, 1)
    acc, out_type = _types(a, b)
    return [np.matmul(a.astype(acc), b.astype(acc)).astype(out_type)]


def _pool_shape(x: np.ndarray, attrs: PoolAttrs) -> tuple[list[int], list[int]]:
    """Output sizes and the extra end padding ceil_mode windows run into."""
    n = len(attrs.kernel_shape)
    outs, extra = [], []
    for i in range(n):
        size, k, s, d = x.shape[2 + i], attrs.kernel_shape[i], attrs.strides[i], attrs.dilations[i]
        begin, end = attrs.pads[i], attrs.pads[n + i]
        out = window_out(size, k, s, d, begin, end, attrs.ceil_mode)
        outs.append(out)
        extra.append(max(0, (out - 1) * s + (k - 1) * d + 1 - (size + begin + end)))
    return outs, extra


@impl(Op.MAX_POOL)
def max_pool(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: PoolAttrs = node.attrs
    x = need(args, 0)
    outs, extra = _pool_shape(x, attrs)
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = np.pad(x, _spatial_pads(attrs.pads, extra), constant_values=low)
    cols = _windows(xp, attrs.kernel_shape, attrs.strides, attrs.dilations, outs)
    n = len(outs)
    return [cols.max(axis=tuple(range(-n, 0)))]


@impl(Op.GLOBAL_MAX_POOL)
def global_max_pool(node: Node, args: Arrays) -> list[np.ndarray]:
    """Max over every spatial axis, kept as size-1 axes (any element type: max is exact)."""
    x = need(args, 0)
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


@impl(Op.AVG_POOL)
def avg_pool(node: Node, args: Arrays) -> list[np.ndarray]:
    """float32, in ONNX Runtime's CPU kernel order (ops_pool.py)."""
    attrs: PoolAttrs = node.attrs
    x = need(args, 0)
    if x.dtype != F32:
        raise ValueError(f"AveragePool reads float32, got {x.dtype}")
    outs, _ = _pool_shape(x, attrs)
    return [average_pool(x, attrs, outs)]


@impl(Op.GLOBAL_AVG_POOL)
def global_avg_pool(node: Node, args: Arrays) -> list[np.ndarray]:
    """float32, MLAS's four-lane sum (ops_pool.py)."""
    x = need(args, 0)
    if x.dtype != F32:
        raise ValueError(f"GlobalAveragePool reads float32, got {x.dtype}")
    return [global_average_pool(x)]


@impl(Op.BATCH_NORM)
def batch_norm(node: Node, args: Arrays) -> list[np.ndarray]:
    """Inference form: ``(x - mean) / sqrt(var + eps) · scale + bias`` per channel (dim 1)."""
    attrs: BatchNormAttrs = node.attrs
    x, scale, bias, mean, var = (need(args, i).astype(np.float64) for i in range(5))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale, bias, mean, var = (a.reshape(shape) for a in (scale, bias, mean, var))
    y = (x - mean) / np.sqrt(var + attrs.epsilon) * scale + bias
    return [y.astype(F32)]


@impl(Op.LAYER_NORM)
def layer_norm(node: Node, args: Arrays) -> list[np.ndarray]:
    """Normalize over dims axis..rank-1: ``(x - mean) / sqrt(var + eps) · scale + bias``.

    float32 in ONNX Runtime's order (ops_mlas.py). Extra outputs, when the node has them, are
    ONNX's Mean and InvStdDev (kept dims)."""
    attrs: LayerNormAttrs = node.attrs
    x, scale, bias = need(args, 0), need(args, 1), opt(args, 2)
    if x.dtype != F32:
        raise ValueError(f"LayerNormalization reads float32, got {x.dtype}")
    axis = attrs.axis + x.ndim if attrs.axis < 0 else attrs.axis
    rows = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    flat_bias = None if bias is None else np.broadcast_to(bias, x.shape[axis:]).reshape(-1)
    y, mean, inv_std = layer_norm_rows(rows, np.broadcast_to(scale, x.shape[axis:]).reshape(-1),
                                       flat_bias, attrs.epsilon)
    kept = x.shape[:axis] + (1,) * (x.ndim - axis)
    return [y.reshape(x.shape), mean.reshape(kept), inv_std.reshape(kept)][:len(node.outputs)]


@impl(Op.SOFTMAX, Op.LOG_SOFTMAX)
def softmax(node: Node, args: Arrays) -> list[np.ndarray]:
    """Opset-13 Softmax along one axis, ``exp(x - max) / sum(exp(x - max))``, or LogSoftmax,
    ``(x - max) - log(sum(exp(x - max)))``: float32 in ONNX Runtime's order (ops_mlas.py)."""
    attrs: AxisAttrs = node.attrs
    x = need(args, 0)
    if x.dtype != F32:
        raise ValueError(f"{node.op.value} reads float32, got {x.dtype}")
    rows = log_softmax_last_axis if node.op is Op.LOG_SOFTMAX else softmax_last_axis
    y = rows(np.moveaxis(x, attrs.axis, -1))
    return [np.ascontiguousarray(np.moveaxis(y, -1, attrs.axis))]
