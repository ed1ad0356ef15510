"""Integer forms of the other quantized ops TPU-MLIR derives (TPU-MLIR quantization chapter).

AvgPool over a window of ``k`` elements, ``y = S_x/(S_y k) * sum(x_j - Z_x) + Z_y``::

    y = round(Scale * sum(x_j) - Offset)      Scale = S_x / (S_y k),  Offset = (S_x/S_y) Z_x - Z_y

TPU-MLIR quantization chapter prints ``Offset = Z_y - (S_x/S_y) Z_x``, which has the wrong sign: expanding step 1
gives ``- (S_x/S_y) Z_x + Z_y`` = ``- Offset`` with the definition above (checked against the
float formula in the tests). Scale and Offset are float32 (``avgpool_params``). The integer form
is ``((sum(x_j) - k Z_x) * m) >> r + Z_y`` with ``(m, r) = tpu_multiplier_rshift(Scale)``.

Add, ``S_y (y - Z_y) = S_a (a - Z_a) + S_b (b - Z_b)``:

- asymmetric: ``y = requant(dequant(a) + dequant(b))`` — ONNX Q/DQ semantics in float32.
- symmetric (all zero points 0): ``y = (a m_a + b m_b)_{i16} >> r`` with 8-bit multipliers
  ``m_a ~ S_a/S_y 2**r``, ``m_b ~ S_b/S_y 2**r`` sharing one shift; with |a|, |b| <= 128 and
  |m| <= 127 the int16 sum cannot overflow (it is saturated to int16 anyway, as the hardware's
  16-bit buffer would).

LeakyReLU / PReLU, precondition ``S_x == S_y`` (TPU-MLIR's backward calibration makes them equal;
under it the positive side is an integer identity): with ``d = x - Z_x``::

    y = d + Z_y                               d >= 0
    y = (m_alpha d) >> r + Z_y                d <  0     (LeakyReLU, m_alpha/2**r ~ alpha)
    y = (q_alpha[c] m d) >> r + Z_y           d <  0     (PReLU: per-channel q_alpha, one m, r)

The seed writes the condition as ``q_x >= 0``; with a zero point it is ``q_x >= Z_x`` (x >= 0).

Pad with a float value: ``round(value / S_y + Z_y)`` (``round(value / S_y)`` when symmetric), then
saturate. A value of 0 gives exactly ``Z_y``.

Right shifts round half toward +infinity (TPU-MLIR's MultiplierShift default), overridable.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from qfuse.runtime.numerics.qdq import check_scale, check_zero_point, dequantize, quantize
from qfuse.runtime.numerics.rounding import (
    Rounding,
    round_with,
    saturate,
    shift_right_round,
)
from qfuse.runtime.numerics.schemes import channel_broadcast

__all__ = [
    "add_float",
    "add_int16",
    "add_multipliers",
    "avgpool_float",
    "avgpool_int",
    "avgpool_params",
    "leaky_relu_int",
    "pad_value",
    "prelu_int",
]


def avgpool_params(
    s_x: float, zp_x: int, s_y: float, zp_y: int, k: int
) -> tuple[np.float32, np.float32]:
    """``(Scale, Offset)`` in float32 for ``y = round(Scale * sum(x) - Offset)``."""
    if k <= 0:
        raise ValueError(f"window size k must be > 0, got {k}")
    sx = float(check_scale(s_x, name="s_x"))
    sy = float(check_scale(s_y, name="s_y"))
    scale = sx / (sy * k)
    offset = sx / sy * float(zp_x) - float(zp_y)
    return np.float32(scale), np.float32(offset)


def avgpool_float(
    window_sum: npt.ArrayLike,
    scale: float,
    offset: float,
    dtype: npt.DTypeLike | str,
    rounding: Rounding = Rounding.HALF_AWAY,
) -> np.ndarray:
    """``saturate(round(f32(sum) * Scale - Offset))`` in float32."""
    v = np.asarray(window_sum).astype(np.float32) * np.float32(scale) - np.float32(offset)
    return saturate(round_with(v, rounding), dtype)


def avgpool_int(
    window_sum: npt.ArrayLike,
    k: int,
    zp_x: int,
    zp_y: int,
    multiplier: int,
    rshift: int,
    dtype: npt.DTypeLike | str,
    rounding: Rounding = Rounding.HALF_UP,
) -> np.ndarray:
    """``saturate(((sum - k Z_x) * m) >> r + Z_y)`` in int64."""
    centered = np.asarray(window_sum, dtype=np.int64) - np.int64(k) * np.int64(zp_x)
    return saturate(
        shift_right_round(centered * np.int64(multiplier), rshift, rounding) + zp_y, dtype
    )


def add_float(
    a: npt.ArrayLike,
    s_a: float,
    zp_a: int,
    b: npt.ArrayLike,
    s_b: float,
    zp_b: int,
    s_y: float,
    zp_y: int,
    dtype: npt.DTypeLike | str,
) -> np.ndarray:
    """Asymmetric add: ``quantize(dequantize(a) + dequantize(b))`` with ONNX semantics."""
    total = dequantize(a, s_a, zp_a) + dequantize(b, s_b, zp_b)
    return quantize(total, s_y, zp_y, dtype)


def add_multipliers(s_a: float, s_b: float, s_y: float, bits: int = 8) -> tuple[int, int, int]:
    """``(m_a, m_b, r)``: the largest shared ``r <= 31`` keeping both multipliers in ``bits``."""
    limit = 2 ** (bits - 1) - 1
    ra = float(check_scale(s_a, name="s_a")) / float(check_scale(s_y, name="s_y"))
    rb = float(check_scale(s_b, name="s_b")) / float(s_y)
    best: tuple[int, int, int] | None = None
    for r in range(32):
        ma = int(round_with(np.float64(ra * 2.0**r), Rounding.HALF_AWAY))
        mb = int(round_with(np.float64(rb * 2.0**r), Rounding.HALF_AWAY))
        if max(abs(ma), abs(mb)) > limit:
            break
        best = (ma, mb, r)
    if best is None:
        raise ValueError(f"scale ratios {ra:.6g}, {rb:.6g} do not fit a {bits}-bit multiplier")
    return best


def add_int16(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    m_a: int,
    m_b: int,
    rshift: int,
    dtype: npt.DTypeLike | str,
    rounding: Rounding = Rounding.HALF_UP,
) -> np.ndarray:
    """Symmetric add ``(a m_a + b m_b)_{i16} >> r``, saturated to ``dtype``."""
    s = np.asarray(a, dtype=np.int64) * m_a + np.asarray(b, dtype=np.int64) * m_b
    s16 = np.clip(s, -(2**15), 2**15 - 1)
    return saturate(shift_right_round(s16, rshift, rounding), dtype)


def leaky_relu_int(
    x: npt.ArrayLike,
    zp_x: int,
    zp_y: int,
    multiplier: int,
    rshift: int,
    dtype: npt.DTypeLike | str,
    rounding: Rounding = Rounding.HALF_UP,
) -> np.ndarray:
    """LeakyReLU with ``S_x == S_y``: negative side ``(m d) >> r``; ``(m, r)`` from alpha."""
    d = np.asarray(x, dtype=np.int64) - zp_x
    neg = shift_right_round(d * np.int64(multiplier), rshift, rounding)
    return saturate(np.where(d >= 0, d, neg) + zp_y, dtype)


def prelu_int(
    x: npt.ArrayLike,
    q_alpha: npt.ArrayLike,
    zp_x: int,
    zp_y: int,
    multiplier: int,
    rshift: int,
    dtype: npt.DTypeLike | str,
    axis: int = 1,
    rounding: Rounding = Rounding.HALF_UP,
) -> np.ndarray:
    """PReLU with ``S_x == S_y``: negative side ``(q_alpha[c] m d) >> r`` (one m and r)."""
    d = np.asarray(x, dtype=np.int64) - zp_x
    qa = channel_broadcast(np.asarray(q_alpha, dtype=np.int64), d.ndim, axis)
    neg = shift_right_round(d * qa * np.int64(multiplier), rshift, rounding)
    return saturate(np.where(d >= 0, d, neg) + zp_y, dtype)


def pad_value(
    value: float,
    s_y: float,
    zp_y: int,
    dtype: npt.DTypeLike | str,
    rounding: Rounding = Rounding.HALF_AWAY,
) -> int:
    """The quantized fill value ``saturate(round(value / S_y + Z_y))`` (double precision)."""
    s = float(check_scale(s_y, name="s_y"))
    z = int(check_zero_point(zp_y, dtype, name="zp_y"))
    return int(saturate(round_with(np.float64(value / s + z), rounding), dtype))
