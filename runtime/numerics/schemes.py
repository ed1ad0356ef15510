"""Requantization: int32 accumulator -> quantized output, as each framework computes it.

Notation: ``acc`` is the exact integer sum ``sum((x_q - zp_x) * w_q)`` of a conv / matmul output;
``bias`` (optional) is int32 in accumulator units (scale ``s_in * s_w``); ``s_w`` is per-tensor or
per-output-channel (broadcast along ``axis`` of ``acc``); the output is ``(s_out, zp_out)`` in
``dtype``. Every scheme computes ``clamp(round(acc * s_in * s_w / s_out) + zp_out)``; they differ
in precision and rounding:

TFLite D2 / F2 (two roundings; SNPS-Caffe names, SNPS-Caffe QUANTIZED_OP.md)::

    M = (s_in * s_w) / s_out                  double (D2) or float32 (F2)
    q, shift = quantize_multiplier(M)         M ~ q * 2**(shift - 31)
    y = rounding_divide_by_pot(srdhm(acc32 * 2**max(shift,0), q), max(-shift,0)) + zp_out

TFLite D1 (one rounding, half toward +inf)::

    y = ((acc32 * q + 2**(30 - shift)) >> (31 - shift)) + zp_out

``acc32 = wrap_int32(acc + bias)``; the result is clamped to ``dtype``'s range. QUANTIZED_OP.md's table
of which one TFLite uses per conv kind is ``tflite_scheme``.

ONNX Runtime (MLAS ``MlasRequantizeOutput`` on x86; ``QLinearConv`` and ``QLinearMatMul``)::

    scale = f32(f32(s_in * s_w) / s_out)      float32, computed once per channel by the kernel
    v = f32(acc32) * scale                    acc32 = int32 add of bias (wraps), then cvtdq2ps
    v = min(max(v, qmin - zp_out), qmax - zp_out)     clamp in float first
    y = rint(v) + zp_out                      cvtps2dq (MXCSR round half to even), int add

Source: onnxruntime/core/mlas/lib/quantize.cpp (``MlasRequantizeOutput``) adds the bias to the
int32 accumulator, converts to float, multiplies by the per-tensor or per-column scale, clamps to
the zero-point-shifted output range, rounds to nearest-even and adds the zero point; the
symmetric-weight conv kernels (x86_64/ConvSymKernelAvx2.S, ``ConvertAccumulatorToFloat`` /
``ConvertFloatToInteger``) do the same steps in registers. qlinearconv.cc computes the per-channel
scale as ``X_scale * W_scale[i] / Y_scale`` in float. (ARM64 MLAS also has a fixed-point
requantization kernel flag, not emulated here.) Clamping before rounding equals rounding first
because the bounds are integers.

Caffe2: SNPS-Caffe QUANTIZED_OP.md matches Caffe2 models with F2 (float multiplier, two roundings).

oneDNN 3.x (docs/onednn.md; the order of oneDNN's ref_convolution_int8.cpp)::

    x = f32(acc) * f32(f32(s_in) * f32(s_w[oc])) + bias_f32
    x = post_ops(x)                           float32
    y = saturate(rint(x * f32(1 / s_out) + f32(zp_out)))

oneDNN adds the dst zero point in float32 *before* rounding; for values within ~2**-16 of a .5
tie that can round differently from ``rint(x / s_out) + zp_out``
(``dst_zp_in_float=False`` selects the latter). An int32 ``bias`` is turned into ``bias_f32`` the
way an s32 bias initializer is dequantized: ``f32(bias) * f32(s_in * s_w)``. NaN saturates to 0
(u8) / 127 (s8) per docs/onednn.md.

TPU-MLIR (BM1684X ``Conv2DOp::inference``, ``RequantMode::MultiplierShift``)::

    m, r = tpu_multiplier_rshift(f32(s_in * s_w / s_out), 32, "search")
    y = saturate(RightShiftRound((acc + bias) * m, r, HALF_UP) + zp_out)

``RightShiftRound`` rounds half toward +infinity for MultiplierShift mode (TPU-MLIR uses
half-away-from-zero only in its TFLite/QDM modes). ``acc + bias`` and the product are int64.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from qfuse.runtime.numerics.gemmlowp import multiply_by_quantized_multiplier, wrap_int32
from qfuse.runtime.numerics.multiplier import (
    effective_scale,
    quantize_multiplier,
    tpu_multiplier_rshift,
)
from qfuse.runtime.numerics.qdq import check_scale, check_zero_point
from qfuse.runtime.numerics.rounding import (
    Rounding,
    dtype_range,
    resolve_dtype,
    saturate,
    shift_right_round,
)

__all__ = [
    "ConvKind",
    "Scheme",
    "channel_broadcast",
    "requantize",
    "requantize_onednn",
    "requantize_onnxruntime",
    "requantize_tflite",
    "requantize_tpu_mlir",
    "tflite_scheme",
]

ConvKind = Literal["regular", "depthwise", "pointwise"]
PostOps = Callable[[np.ndarray], np.ndarray]


class Scheme(enum.Enum):
    """A framework's requantization arithmetic (see the module docstring)."""

    TFLITE_D1 = "tflite_d1"
    TFLITE_D2 = "tflite_d2"
    TFLITE_F2 = "tflite_f2"
    ONNXRUNTIME = "onnxruntime"
    CAFFE2 = "caffe2"
    ONEDNN = "onednn"
    TPU_MLIR = "tpu_mlir"


# SNPS-Caffe QUANTIZED_OP.md (SNPS-Caffe, found by matching TFLite bit-exactly; pointwise by brute force).
_TFLITE_TABLE: Final[dict[tuple[bool, str], Scheme]] = {
    (False, "regular"): Scheme.TFLITE_D2,
    (False, "depthwise"): Scheme.TFLITE_F2,
    (False, "pointwise"): Scheme.TFLITE_F2,
    (True, "regular"): Scheme.TFLITE_D1,
    (True, "depthwise"): Scheme.TFLITE_D2,
    (True, "pointwise"): Scheme.TFLITE_D1,
}

# oneDNN's NaN results on store (docs/onednn.md); other dtypes fall back to qmin.
_ONEDNN_NAN: Final[dict[np.dtype, int]] = {np.dtype(np.uint8): 0, np.dtype(np.int8): 127}


def tflite_scheme(per_channel: bool, kind: ConvKind) -> Scheme:
    """The TFLite requantization variant for a conv (QUANTIZED_OP.md's table).

    ``kind``: "regular" (group 1), "depthwise" (group == in == out channels), "pointwise" (1x1).
    """
    try:
        return _TFLITE_TABLE[(bool(per_channel), kind)]
    except KeyError:
        raise ValueError(
            f"conv kind must be 'regular', 'depthwise' or 'pointwise', got {kind!r}"
        ) from None


def channel_broadcast(v: npt.ArrayLike, ndim: int, axis: int) -> np.ndarray:
    """Reshape a per-channel 1-D array to broadcast along ``axis`` of an ``ndim``-D tensor."""
    a = np.asarray(v)
    if a.ndim == 0 or a.size == 1:
        return a.reshape(())
    if a.ndim != 1:
        raise ValueError(f"per-channel values must be 1-D, got shape {a.shape}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-D accumulator")
    shape = [1] * ndim
    shape[axis % ndim] = a.size
    return a.reshape(shape)


def requantize(
    acc: npt.ArrayLike,
    *,
    scheme: Scheme,
    s_in: npt.ArrayLike,
    s_w: npt.ArrayLike,
    s_out: npt.ArrayLike,
    zp_out: int,
    dtype: npt.DTypeLike | str,
    bias: npt.ArrayLike | None = None,
    axis: int = 1,
) -> np.ndarray:
    """Requantize ``acc`` (+ int32 ``bias``) to ``dtype`` the way ``scheme`` does."""
    a = np.asarray(acc, dtype=np.int64)
    dt = resolve_dtype(dtype)
    check_scale(s_in, name="s_in")
    check_scale(s_w, name="s_w")
    check_scale(s_out, name="s_out")
    if scheme in (Scheme.TFLITE_D1, Scheme.TFLITE_D2, Scheme.TFLITE_F2, Scheme.CAFFE2):
        precision = "double" if scheme in (Scheme.TFLITE_D1, Scheme.TFLITE_D2) else "float"
        q, shift = quantize_multiplier(effective_scale(s_in, s_w, s_out, precision))
        return requantize_tflite(
            a,
            q,
            shift,
            zp_out,
            dt,
            bias=bias,
            axis=axis,
            single_rounding=scheme is Scheme.TFLITE_D1,
        )
    if scheme is Scheme.ONNXRUNTIME:
        return requantize_onnxruntime(a, s_in, s_w, s_out, zp_out, dt, bias=bias, axis=axis)
    if scheme is Scheme.ONEDNN:
        return requantize_onednn(a, s_in, s_w, s_out, zp_out, dt, bias=bias, axis=axis)
    if scheme is Scheme.TPU_MLIR:
        scale = effective_scale(s_in, s_w, s_out, "double")
        m, r = tpu_multiplier_rshift(scale, 32, "search")
        return requantize_tpu_mlir(a, m, r, zp_out, dt, bias=bias, axis=axis)
    raise ValueError(f"unknown requantization scheme {scheme!r}")


def requantize_tflite(
    acc: npt.ArrayLike,
    multiplier: npt.ArrayLike,
    shift: npt.ArrayLike,
    zp_out: int,
    dtype: npt.DTypeLike | str,
    *,
    bias: npt.ArrayLike | None = None,
    axis: int = 1,
    single_rounding: bool = False,
) -> np.ndarray:
    """TFLite with given (per-channel) multipliers: D2/F2, or D1 with ``single_rounding``."""
    a = _acc32(acc, bias, axis)
    m = channel_broadcast(multiplier, a.ndim, axis)
    sh = channel_broadcast(shift, a.ndim, axis)
    z = _zp_scalar(zp_out, dtype)
    y = multiply_by_quantized_multiplier(a, m, sh, single_rounding=single_rounding)
    return saturate(y + z, dtype)


def requantize_onnxruntime(
    acc: npt.ArrayLike,
    s_in: npt.ArrayLike,
    s_w: npt.ArrayLike,
    s_out: npt.ArrayLike,
    zp_out: int,
    dtype: npt.DTypeLike | str,
    *,
    bias: npt.ArrayLike | None = None,
    axis: int = 1,
) -> np.ndarray:
    """ONNX Runtime's MlasRequantizeOutput, bit-exact (float32 scale, clamp, rint, + zp)."""
    a = _acc32(acc, bias, axis)
    z = _zp_scalar(zp_out, dtype)
    scale = (_scalar_f32(s_in, "s_in") * np.asarray(s_w, dtype=np.float32)) / _scalar_f32(
        s_out, "s_out"
    )
    v = a.astype(np.float32) * channel_broadcast(scale, a.ndim, axis)
    lo, hi = dtype_range(dtype)
    v = np.minimum(np.maximum(v, np.float32(lo - z)), np.float32(hi - z))
    return (np.rint(v).astype(np.int64) + z).astype(resolve_dtype(dtype))


def requantize_onednn(
    acc: npt.ArrayLike,
    s_in: npt.ArrayLike,
    s_w: npt.ArrayLike,
    s_out: npt.ArrayLike,
    zp_out: int,
    dtype: npt.DTypeLike | str,
    *,
    bias: npt.ArrayLike | None = None,
    bias_f32: npt.ArrayLike | None = None,
    post_ops: PostOps | None = None,
    axis: int = 1,
    dst_zp_in_float: bool = True,
) -> np.ndarray:
    """oneDNN 3.x int8 output stage in float32 (``bias_f32`` wins over an int32 ``bias``)."""
    a = np.asarray(acc, dtype=np.int64)
    dt = resolve_dtype(dtype)
    z = _zp_scalar(zp_out, dt)
    scale = channel_broadcast(
        _scalar_f32(s_in, "s_in") * np.asarray(s_w, dtype=np.float32), a.ndim, axis
    ).astype(np.float32)
    x = wrap_int32(a).astype(np.float32) * scale
    if bias_f32 is not None:
        x = x + channel_broadcast(np.asarray(bias_f32, dtype=np.float32), a.ndim, axis)
    elif bias is not None:
        b = channel_broadcast(np.asarray(bias, dtype=np.int64), a.ndim, axis)
        x = x + b.astype(np.float32) * scale
    if post_ops is not None:
        x = np.asarray(post_ops(x), dtype=np.float32)
    inv = np.float32(1) / _scalar_f32(s_out, "s_out")
    y = x * inv
    if dst_zp_in_float:
        r = np.rint(y + np.float32(z))
    else:
        r = np.rint(y).astype(np.float64) + z
    return saturate(r, dt, nan=_ONEDNN_NAN.get(dt))


def requantize_tpu_mlir(
    acc: npt.ArrayLike,
    multiplier: npt.ArrayLike,
    rshift: npt.ArrayLike,
    zp_out: int,
    dtype: npt.DTypeLike | str,
    *,
    bias: npt.ArrayLike | None = None,
    axis: int = 1,
    rounding: Rounding = Rounding.HALF_UP,
) -> np.ndarray:
    """TPU-MLIR ``(acc + bias) * multiplier >> rshift`` (rounded) ``+ zp_out``, saturated."""
    a = np.asarray(acc, dtype=np.int64)
    if bias is not None:
        a = a + channel_broadcast(np.asarray(bias, dtype=np.int64), a.ndim, axis)
    m = channel_broadcast(np.asarray(multiplier, dtype=np.int64), a.ndim, axis)
    r = channel_broadcast(np.asarray(rshift, dtype=np.int64), a.ndim, axis)
    z = _zp_scalar(zp_out, dtype)
    return saturate(shift_right_round(a * m, r, rounding) + z, dtype)


def _acc32(acc: npt.ArrayLike, bias: npt.ArrayLike | None, axis: int) -> np.ndarray:
    """``acc + bias`` with int32 wrap-around, as int64."""
    a = np.asarray(acc, dtype=np.int64)
    if bias is not None:
        a = a + channel_broadcast(np.asarray(bias, dtype=np.int64), a.ndim, axis)
    return wrap_int32(a)


def _scalar_f32(v: npt.ArrayLike, name: str) -> np.float32:
    a = np.asarray(v, dtype=np.float32)
    if a.size != 1:
        raise ValueError(f"{name} must be a single (per-tensor) value, got shape {a.shape}")
    return np.float32(a.reshape(()))


def _zp_scalar(zp: npt.ArrayLike, dtype: npt.DTypeLike | str) -> int:
    z = check_zero_point(zp, dtype, name="zp_out")
    if z.size != 1:
        raise ValueError(f"zp_out must be a single (per-tensor) value, got shape {z.shape}")
    return int(z.reshape(()))
