"""A numpy model of what oneDNN 3.2 computes for int8 primitives, bit for bit.

Used by examples/binding_demo.py and tests/runtime to check the binding (and oneDNN) to 0 LSB.
Measured on this machine (Sapphire Rapids) for convolution (jit / jit_1x1 / brgconv
avx512_core_amx, jit_int8 avx512_core_vnni), deconvolution, inner product (brgemm, gemm_s8u8s32,
ref) and matmul (brg amx/vnni), with inputs built to land on rounding ties
(tests/runtime/test_onednn_int8.py), and for the AVX2 kernels' epilogue too:

    acc = sum((src - zp_src) * wei)                exact int32 with VNNI/AMX; padded taps add 0
    x   = f32(f32(acc) * f32(s_src * s_wei[oc]))   combined scale rounded to f32 first
    x   = f32(x + bias)                            a separate add, not an FMA
    post-ops in f32, in order:
      eltwise linear: x = fma(alpha, x, beta)      single rounding (vfmadd)
      sum:            x = fma(scale, f32(prev - zp), x)   single rounding (vfmadd)
      binary / prelu / other eltwise: one f32 operation each
    y   = f32(f32(x * f32(1 / s_dst)) + zp_dst)    dst zero point added in f32, BEFORE rounding
    dst = saturate(rint(y))                        round half to even (MXCSR default)

Two details differ from the ONNX-style one-line model `rint(x/s_dst) + zp_dst`:
the zero point is added before rounding (y + zp loses the low bits of y when |y + zp| is large,
so e.g. y = 2.50000024, zp = 128 gives rint(130.5) = 130, not rint(2.50000024) + 128 = 131),
and sum with a scale is fused-multiply-added. Both matter only on values within an ulp of a
tie, which random data almost never produces. Without VNNI/AMX the accumulator itself is not
exact (int16 saturation, halved s8 weights): the test module documents and models that.

Resampling (not int8-specific; measured for f32/u8/s8, nchw and nhwc, jit avx512 and AVX2):
output index o of a spatial dim resized in → out maps to ``c = f32(f32(f32(o + 0.5)·in)/out) -
0.5`` (from the dims; the factors argument does not enter). Nearest copies ``x[roundf(c)]``
(halves away from zero). Linear reads ``lo = max(trunc(c), 0)``, ``hi = min(ceil(c), in - 1)``
with weights ``1 - w`` and ``w = |c - lo|``, rounded by its own evaluation order (a few ulps
from a float64 evaluation of the same weights); u8/s8 dst: rint and saturate on store.

`fma32` emulates a float32 fused multiply-add through float64: a*b is exact in float64 (24 + 24
bits), and the sum with c is exact unless the exponents differ by more than ~29; a single
rounding to float32 then equals the hardware FMA.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from qfuse.runtime.onednn.attr import PostOpRecord
from qfuse.runtime.onednn.enums import Alg

F32 = np.float32
_erf = np.vectorize(math.erf, otypes=[np.float64])

INT_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127),
              np.dtype(np.int32): (-(2**31), 2**31 - 1)}
NAN_STORE = {np.dtype(np.uint8): 0, np.dtype(np.int8): 127, np.dtype(np.int32): 0}


def fma32(a: np.ndarray | float, b: np.ndarray | float, c: np.ndarray | float) -> np.ndarray:
    """float32(a * b + c) with a single rounding (see module docstring)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32)


def eltwise(x: np.ndarray, alg: Alg, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """oneDNN eltwise forward formulas. Exact ops (relu, linear, clip, round, abs, square) in
    float32 as oneDNN rounds them; transcendental ones in float64 (oneDNN uses polynomial
    approximations: compare those with a tolerance)."""
    a, b = F32(alpha), F32(beta)
    x = np.asarray(x, dtype=F32)
    if alg == Alg.eltwise_relu:
        return np.where(x > 0, x, x * a).astype(F32)
    if alg == Alg.eltwise_linear:
        return fma32(a, x, b)
    if alg in (Alg.eltwise_clip, Alg.eltwise_clip_v2):
        return np.minimum(np.maximum(x, a), b).astype(F32)
    if alg == Alg.eltwise_round:
        return np.rint(x)
    if alg == Alg.eltwise_abs:
        return np.abs(x)
    if alg == Alg.eltwise_square:
        return (x * x).astype(F32)
    d = x.astype(np.float64)
    ad, bd = float(a), float(b)
    sigmoid = 1.0 / (1.0 + np.exp(-d))
    formulas = {
        Alg.eltwise_tanh: lambda: np.tanh(d),
        Alg.eltwise_elu: lambda: np.where(d > 0, d, ad * np.expm1(d)),
        Alg.eltwise_sqrt: lambda: np.sqrt(d),
        Alg.eltwise_soft_relu: lambda: np.logaddexp(0.0, ad * d) / ad,
        Alg.eltwise_hardsigmoid: lambda: np.clip(ad * d + bd, 0.0, 1.0),
        Alg.eltwise_logistic: lambda: sigmoid,
        Alg.eltwise_exp: lambda: np.exp(d),
        Alg.eltwise_gelu_tanh: lambda: 0.5 * d * (1.0 + np.tanh(
            math.sqrt(2.0 / math.pi) * (d + 0.044715 * d**3))),
        Alg.eltwise_swish: lambda: d / (1.0 + np.exp(-ad * d)),
        Alg.eltwise_log: lambda: np.log(d),
        Alg.eltwise_pow: lambda: ad * np.power(d, bd),
        Alg.eltwise_gelu_erf: lambda: 0.5 * d * (1.0 + _erf(d / math.sqrt(2.0))),
        Alg.eltwise_mish: lambda: d * np.tanh(np.logaddexp(0.0, d)),
        Alg.eltwise_hardswish: lambda: d * np.clip(ad * d + bd, 0.0, 1.0),
    }
    if alg not in formulas:
        raise ValueError(f"no reference for eltwise algorithm {alg!r}")
    with np.errstate(all="ignore"):
        return formulas[alg]().astype(F32)


_BINARY = {Alg.binary_add: np.add, Alg.binary_mul: np.multiply, Alg.binary_max: np.maximum,
           Alg.binary_min: np.minimum, Alg.binary_div: np.divide, Alg.binary_sub: np.subtract}


def binary(alg: Alg, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One float32 binary operation with numpy broadcasting (as oneDNN broadcasts src1)."""
    return _BINARY[alg](np.asarray(a, F32), np.asarray(b, F32)).astype(F32)


def _out_size(size: int, k: int, s: int, d: int, pl: int, pr: int) -> int:
    return (size + pl + pr - ((k - 1) * (d + 1) + 1)) // s + 1


def _grouped(src: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weights as {G, O/G, I/G, k...} (a plain {O, I, k...} is one group)."""
    grouped = weights if weights.ndim == src.ndim + 1 else weights[None]
    return grouped.astype(_work(src, weights))


def _work(*arrays: np.ndarray) -> type:
    """int64 for integer inputs (exact); float64 for float inputs (f32 tests)."""
    return np.int64 if all(a.dtype.kind in "iub" for a in arrays) else np.float64


def conv_acc(src: np.ndarray, weights: np.ndarray, *, zp_src: int = 0,
             strides: Sequence[int] | None = None, dilation: Sequence[int] | None = None,
             padding_l: Sequence[int] | None = None,
             padding_r: Sequence[int] | None = None) -> np.ndarray:
    """Convolution accumulator {N, O, out...}: exact int64 for integer inputs (float64 for
    float ones); `dilation` in oneDNN's convention (0 = dense); padded taps contribute 0."""
    nsp = src.ndim - 2
    s, d = tuple(strides or (1,) * nsp), tuple(dilation or (0,) * nsp)
    pl, pr = tuple(padding_l or (0,) * nsp), tuple(padding_r or (0,) * nsp)
    w = _grouped(src, weights)
    groups, og, cg, kernel = w.shape[0], w.shape[1], w.shape[2], w.shape[3:]
    x = np.pad(src.astype(w.dtype) - zp_src, [(0, 0), (0, 0), *zip(pl, pr, strict=True)])
    n = src.shape[0]
    x = x.reshape(n, groups, cg, *x.shape[2:])
    out = [_out_size(src.shape[2 + i], kernel[i], s[i], d[i], pl[i], pr[i]) for i in range(nsp)]
    acc = np.zeros((n, groups, og, *out), w.dtype)
    for offs in itertools.product(*(range(k) for k in kernel)):
        window = x[(slice(None),) * 3 + tuple(
            slice(o * (d[i] + 1), o * (d[i] + 1) + s[i] * (out[i] - 1) + 1, s[i])
            for i, o in enumerate(offs))]
        acc += np.einsum("ngc...,goc->ngo...", window, w[(Ellipsis, *offs)])
    return acc.reshape(n, groups * og, *out)


def deconv_acc(src: np.ndarray, weights: np.ndarray, *, zp_src: int = 0,
               strides: Sequence[int] | None = None, dilation: Sequence[int] | None = None,
               padding_l: Sequence[int] | None = None,
               padding_r: Sequence[int] | None = None) -> np.ndarray:
    """Exact transposed-convolution accumulator: dst[oh] += src[ih] * wei[kh] where
    oh = ih * stride + kh * (dilation + 1) - padding_l; weights {[G,] O, I, k...}."""
    nsp = src.ndim - 2
    s, d = tuple(strides or (1,) * nsp), tuple(dilation or (0,) * nsp)
    pl, pr = tuple(padding_l or (0,) * nsp), tuple(padding_r or (0,) * nsp)
    w = _grouped(src, weights)
    groups, og, cg, kernel = w.shape[0], w.shape[1], w.shape[2], w.shape[3:]
    n, spatial = src.shape[0], src.shape[2:]
    x = (src.astype(w.dtype) - zp_src).reshape(n, groups, cg, *spatial)
    full = [(spatial[i] - 1) * s[i] + (kernel[i] - 1) * (d[i] + 1) + 1 for i in range(nsp)]
    acc = np.zeros((n, groups, og, *full), w.dtype)
    for offs in itertools.product(*(range(k) for k in kernel)):
        target = (slice(None),) * 3 + tuple(
            slice(o * (d[i] + 1), o * (d[i] + 1) + s[i] * (spatial[i] - 1) + 1, s[i])
            for i, o in enumerate(offs))
        acc[target] += np.einsum("ngc...,goc->ngo...", x, w[(Ellipsis, *offs)])
    crop = tuple(slice(pl[i], full[i] - pr[i]) for i in range(nsp))
    return acc[(slice(None),) * 3 + crop].reshape(n, groups * og, *(
        full[i] - pl[i] - pr[i] for i in range(nsp)))


def inner_product_acc(src: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """{N, O} = src{N, I...} . weights{O, I...}^T (exact int64 for integer inputs)."""
    work = _work(src, weights)
    a = src.reshape(src.shape[0], -1).astype(work)
    return a @ weights.reshape(weights.shape[0], -1).astype(work).T


def matmul_acc(src: np.ndarray, weights: np.ndarray, *, zp_src: int = 0,
               zp_wei: int = 0) -> np.ndarray:
    """(src - zp_src) @ (weights - zp_wei), batch dims broadcast (exact int64 for integers)."""
    work = _work(src, weights)
    return np.matmul(src.astype(work) - zp_src, weights.astype(work) - zp_wei)


def _channel(values: np.ndarray | float, ndim: int, axis: int) -> np.ndarray:
    v = np.asarray(values, dtype=F32).ravel()
    if v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


def epilogue(acc: np.ndarray, dst_dtype: np.dtype | type, *, channel_axis: int = 1,
             src_scale: float = 1.0, wei_scales: np.ndarray | float = 1.0,
             bias: np.ndarray | None = None, post_ops: Sequence[PostOpRecord] = (),
             post_op_args: Mapping[int, np.ndarray] | None = None,
             dst_prev: np.ndarray | None = None, dst_scale: float = 1.0,
             dst_zp: int = 0) -> np.ndarray:
    """The int8 output stage (module docstring) applied to an exact accumulator.

    `post_op_args[i]`: src1 of binary post-op i (broadcastable to acc) or the weights of prelu
    post-op i; `dst_prev`: dst's contents before execution (read by sum post-ops)."""
    nd = acc.ndim
    comb = (F32(src_scale) * np.asarray(wei_scales, F32)).astype(F32)
    x = (acc.astype(F32) * _channel(comb, nd, channel_axis)).astype(F32)
    if bias is not None:
        x = (x + _channel(bias, nd, channel_axis)).astype(F32)
    args = post_op_args or {}
    for index, op in enumerate(post_ops):
        if op.kind == "eltwise":
            assert op.alg is not None
            x = eltwise(x, op.alg, op.alpha, op.beta)
        elif op.kind == "sum":
            if dst_prev is None:
                raise ValueError("a sum post-op needs dst_prev")
            prev = (dst_prev.astype(F32) - F32(op.zero_point)).astype(F32)
            x = fma32(F32(op.scale), prev, x)
        elif op.kind == "binary":
            assert op.alg is not None
            x = binary(op.alg, x, args[index])
        elif op.kind == "prelu":
            w = np.asarray(args[index], F32)
            x = np.where(x > 0, x, (x * w).astype(F32)).astype(F32)
    dtype = np.dtype(dst_dtype)
    y = (x * (F32(1) / F32(dst_scale))).astype(F32)
    if dtype.kind == "f":
        return (y + F32(dst_zp)).astype(dtype)
    y = np.rint((y + F32(dst_zp)).astype(F32))
    lo, hi = INT_RANGES[dtype]
    y = np.where(np.isnan(y), NAN_STORE[dtype], np.clip(y, lo, hi))
    return y.astype(dtype)


def resampling_coordinate(size: int, out: int) -> np.ndarray:
    """The float32 source coordinate of each output index (module docstring)."""
    o = np.arange(out, dtype=F32)
    return (o + F32(0.5)) * F32(size) / F32(out) - F32(0.5)  # float32, in C's order


def resampling_nearest_index(size: int, out: int) -> np.ndarray:
    """The input index oneDNN's nearest resampling reads for each output index."""
    # roundf in float64, where |c| + 0.5 is exact (in float32, c + 0.5 can round up to a whole)
    c = resampling_coordinate(size, out).astype(np.float64)
    rounded = np.sign(c) * np.floor(np.abs(c) + 0.5)
    return np.clip(rounded, 0, size - 1).astype(np.int64)


def resampling_linear_taps(size: int, out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, w) of oneDNN's linear resampling: x[lo]·(1 - w) + x[hi]·w."""
    c = resampling_coordinate(size, out)
    lo = np.maximum(np.trunc(c), 0).astype(np.int64)
    hi = np.minimum(np.where(c < 0, 0, np.ceil(c)), size - 1).astype(np.int64)
    return lo, hi, np.abs(c - lo.astype(F32)).astype(np.float64)


def resampling(x: np.ndarray, out: Sequence[int], linear: bool) -> np.ndarray:
    """oneDNN's resampling of x {N, C, spatial...} to spatial dims ``out``: nearest exactly,
    linear in float64 (its own result is within a few float32 ulps of this)."""
    y = x.astype(np.float64) if linear else x
    for axis, (size, o) in enumerate(zip(x.shape[2:], out, strict=True), start=2):
        if not linear:
            y = np.take(y, resampling_nearest_index(size, o), axis=axis)
            continue
        lo, hi, w = resampling_linear_taps(size, o)
        w = w.reshape((-1,) + (1,) * (x.ndim - axis - 1))
        y = np.take(y, lo, axis=axis) * (1 - w) + np.take(y, hi, axis=axis) * w
    return y
