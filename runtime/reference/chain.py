"""Numeric evaluation of post-op chains, two ways.

``apply_chain`` evaluates a chain as the graph means it (ir/chain.py): float32, item by item,
then ``saturate(rint(x))`` on an integer store. A Quantize from an ONNX Q/DQ pair means ONNX's
``saturate(rint(x / s) + zp)`` (division, then round, then the zero point), any other the
FakeQuantize formula. ``apply_composed`` evaluates the composer's
oneDNN attributes the way oneDNN 3.x computes them (docs/onednn.md):

    x   = f32(acc)·wei_scale + bias;  x = post_ops(x);
    dst = saturate(rint(x·f32(1/dst_scale)) + dst_zp)

Comparing the two checks the composer; comparing ``apply_composed`` with oneDNN's output checks
the lowering. Both use float32 throughout, with numpy's rint (round half to even, as oneDNN
under the default MXCSR).

Measured on oneDNN 3.2 (tests/runtime/test_onednn_int8.py::test_conv_rounding_ties): the dst
zero point is added in float32 *before* rounding, ``dst = saturate(rint(f32(x·f32(1/s)) + zp))``,
and the sum post-op with a scale and eltwise linear are fused multiply-adds (one rounding).
``apply_composed`` follows that, not the ONNX-style ``rint(x/s) + zp`` form (docs/onednn.md).
"""

from __future__ import annotations

import math

import numpy as np

from qfuse.ir.chain import (
    Activation,
    ChainOp,
    PRelu,
    Quantize,
    Residual,
    Scale,
    Shift,
    TensorOperand,
)
from qfuse.ir.postops import ACT_ALG, Binary, Composed, Eltwise, Prelu, Sum, TensorBinary
from qfuse.ir.types import DType

F32 = np.float32
_erf = np.frompyfunc(math.erf, 1, 1)


def _per_channel(values: tuple[float, ...] | np.ndarray, ndim: int, axis: int) -> np.ndarray:
    v = np.asarray(values, dtype=F32).ravel()
    if v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


def saturate_store(x: np.ndarray, dtype: DType) -> np.ndarray:
    """rint then clamp into ``dtype`` (NaN → 0 for u8, 127 for s8, as oneDNN stores it)."""
    if not dtype.is_integer:
        return x.astype(dtype.np)
    lo, hi = dtype.range
    r = np.rint(x.astype(F32))
    r = np.where(np.isnan(r), F32(0 if lo == 0 else hi), r)
    return np.clip(r, lo, hi).astype(dtype.np)


def eltwise(x: np.ndarray, alg: str, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """oneDNN eltwise forward formulas, in float32."""
    a, b = F32(alpha), F32(beta)
    if alg == "relu":
        return np.where(x > 0, x, x * a).astype(F32)
    if alg == "linear":
        return (x * a + b).astype(F32)
    if alg == "clip":
        return np.minimum(np.maximum(x, a), b).astype(F32)
    if alg == "round":
        return np.rint(x).astype(F32)
    if alg == "logistic":
        with np.errstate(over="ignore"):  # exp(-x) = inf below -88: 1 / inf is the 0 wanted
            return (F32(1) / (F32(1) + np.exp(-x))).astype(F32)
    if alg == "swish":
        with np.errstate(over="ignore"):  # likewise x / inf = -0 for large negative x
            return (x / (F32(1) + np.exp(-(x * a)))).astype(F32)
    if alg == "tanh":
        return np.tanh(x).astype(F32)
    if alg == "hardswish":
        return (x * np.clip(x * a + b, 0, 1)).astype(F32)
    if alg == "hardsigmoid":
        return np.clip(x * a + b, 0, 1).astype(F32)
    if alg == "gelu_erf":
        xd = x.astype(np.float64)
        return (0.5 * xd * (1.0 + _erf(xd / math.sqrt(2.0)).astype(np.float64))).astype(F32)
    if alg == "gelu_tanh":
        xd = x.astype(np.float64)
        inner = math.sqrt(2.0 / math.pi) * (xd + 0.044715 * xd**3)
        return (0.5 * xd * (1.0 + np.tanh(inner))).astype(F32)
    raise ValueError(f"no reference for eltwise algorithm {alg!r}")


def fake_quantize(
    x: np.ndarray, il: np.ndarray, ih: np.ndarray, ol: np.ndarray, oh: np.ndarray, levels: int
) -> np.ndarray:
    """OpenVINO fake_quantize.md's FakeQuantize in float32 (il < ih; see runtime/reference for the full op)."""
    steps = F32(levels - 1)
    q = np.rint((x - il) / (ih - il) * steps) / steps * (oh - ol) + ol
    q = np.where(x <= np.minimum(il, ih), ol, q)
    return np.where(x > np.maximum(il, ih), oh, q).astype(F32)


def _fma(a: np.ndarray | np.float32, b: np.ndarray | np.float32, c: np.ndarray) -> np.ndarray:
    """a·b + c rounded once to float32 (the product of two float32 is exact in float64)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + c).astype(F32)


def apply_chain(
    acc: np.ndarray,
    chain: list[ChainOp],
    residuals: dict[int, np.ndarray],
    *,
    channel_axis: int,
    dst_dtype: DType,
) -> np.ndarray:
    """The chain's meaning: float32 item by item, then the store."""
    x = acc.astype(F32)
    nd, ax = x.ndim, channel_axis
    for item in chain:
        if isinstance(item, Scale):
            x = (x * _per_channel(item.values, nd, ax)).astype(F32)
        elif isinstance(item, Shift):
            x = (x + _per_channel(item.values, nd, ax)).astype(F32)
        elif isinstance(item, Activation):
            x = eltwise(x, ACT_ALG[item.act], item.alpha, item.beta)
        elif isinstance(item, PRelu):
            x = np.where(x >= 0, x, x * _per_channel(item.slopes, nd, ax)).astype(F32)
        elif isinstance(item, Residual):
            r = residuals[item.port].astype(F32)
            x = (x + F32(item.scale) * (r - F32(item.zero_point))).astype(F32)
        elif isinstance(item, TensorOperand):
            fn = np.multiply if item.alg == "mul" else np.add
            x = fn(x, residuals[item.port].astype(F32)).astype(F32)
        elif isinstance(item, Quantize) and item.onnx is not None:
            quant, (lo, hi) = item.onnx.quant, item.onnx.dtype.range
            s = _per_channel(quant.scale, nd, ax)
            zp = _per_channel(tuple(float(z) for z in quant.zero_point), nd, ax)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                q = np.rint(x / s) + zp
            x = np.where(np.isnan(q), F32(lo), np.clip(q, F32(lo), F32(hi))).astype(F32)
        elif isinstance(item, Quantize):
            x = fake_quantize(x, *(_per_channel(v, nd, ax) for v in (
                item.input_low, item.input_high, item.output_low, item.output_high)),
                item.levels)
    return saturate_store(x, dst_dtype)


def apply_composed(
    acc: np.ndarray,
    composed: Composed,
    residuals: dict[int, np.ndarray],
    *,
    channel_axis: int,
) -> np.ndarray:
    """What oneDNN computes for ``composed`` on the int32 accumulator ``acc``."""
    nd, ax = acc.ndim, channel_axis
    x = (acc.astype(F32) * _per_channel(composed.wei_scales, nd, ax)).astype(F32)
    if composed.bias is not None:
        x = (x + _per_channel(composed.bias, nd, ax)).astype(F32)
    for op in composed.post_ops:
        if isinstance(op, Eltwise) and op.alg == "linear":
            x = _fma(x, F32(op.alpha), F32(op.beta))
        elif isinstance(op, Eltwise):
            x = eltwise(x, op.alg, op.alpha, op.beta)
        elif isinstance(op, Sum):
            r = (residuals[op.port].astype(F32) - F32(op.zero_point)).astype(F32)
            x = _fma(F32(op.scale), r, x)
        elif isinstance(op, Binary):
            v = _per_channel(op.values, nd, ax)
            fn = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
                  "div": np.divide}
            x = fn[op.alg](x, v).astype(F32)
        elif isinstance(op, Prelu):
            x = np.where(x >= 0, x, x * _per_channel(op.slopes, nd, ax)).astype(F32)
        elif isinstance(op, TensorBinary):
            fn = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
            x = fn[op.alg](x, residuals[op.port].astype(F32)).astype(F32)
    if composed.dst_dtype.is_integer:
        if composed.dst_scale is not None:
            x = (x * (F32(1.0) / F32(composed.dst_scale))).astype(F32)
        x = (x + F32(composed.dst_zero_point)).astype(F32)
    return saturate_store(x, composed.dst_dtype)
