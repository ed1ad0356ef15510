"""gemmlowp / TFLite fixed-point primitives, vectorised on int64 arrays holding int32 values.

``srdhm(a, b)`` — SaturatingRoundingDoublingHighMul: the high 32 bits of ``2 * a * b``,
rounded::

    if a == b == INT32_MIN: return INT32_MAX          (the only product that overflows)
    ab = int64(a) * b
    nudge = 2**30 if ab >= 0 else 1 - 2**30
    return (ab + nudge) / 2**31                       C division: truncates toward zero

On ties this rounds toward +infinity (0.5 -> 1, -0.5 -> 0, -1.5 -> -1): the negative nudge is one
short of 2**30.

``rounding_divide_by_pot(x, e)`` — RoundingDivideByPOT, ``x / 2**e`` rounded half away from
zero, with gemmlowp's mask arithmetic::

    mask = 2**e - 1;  remainder = x & mask;  threshold = (mask >> 1) + (x < 0)
    return (x >> e) + (remainder > threshold)

``multiply_by_quantized_multiplier(x, m, shift)`` — TFLite's MultiplyByQuantizedMultiplier with
the shift convention of ``quantize_multiplier`` (positive = left):

- two roundings (gemmlowp; SNPS-Caffe's "D2"/"F2")::

      rounding_divide_by_pot(srdhm(x * 2**max(shift, 0), m), max(-shift, 0))

  ``x * 2**left`` wraps like int32 arithmetic on the hardware (overflow is UB in C).
- one rounding (``TFLITE_SINGLE_ROUNDING``; SNPS-Caffe's "D1"), requires -31 <= shift <= 30::

      total = 31 - shift
      (int64(x) * m + 2**(total - 1)) >> total        floor after +half: half toward +inf

  SNPS-Caffe QUANTIZED_OP.md writes this as ``(acc*qm + (1 << (31+shift-1))) >> (31+shift-1)`` with ``shift``
  counted as a *right* shift (``-shift`` here); the rounding constant matches, but the shift
  amount must be ``31 + shift`` in that convention (``31 - shift`` here), not ``31 + shift - 1``
  — the latter doubles the result. The result is clamped to int32.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "multiply_by_quantized_multiplier",
    "rounding_divide_by_pot",
    "srdhm",
    "wrap_int32",
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def wrap_int32(x: npt.ArrayLike) -> np.ndarray:
    """Two's-complement wrap of int64 values into the int32 range (kept as int64)."""
    xi = np.asarray(x, dtype=np.int64)
    return ((xi + 2**31) & 0xFFFFFFFF) - 2**31


def srdhm(a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul of int32 values (int64 result in int32 range)."""
    ai = np.asarray(a, dtype=np.int64)
    bi = np.asarray(b, dtype=np.int64)
    overflow = (ai == bi) & (ai == INT32_MIN)
    ab = ai * bi
    s = ab + np.where(ab >= 0, 2**30, 1 - 2**30)
    q = np.where(s >= 0, s >> 31, -((-s) >> 31))
    return np.where(overflow, INT32_MAX, q)


def rounding_divide_by_pot(x: npt.ArrayLike, exponent: npt.ArrayLike) -> np.ndarray:
    """RoundingDivideByPOT: ``x / 2**exponent``, rounded half away from zero; exponent 0..31."""
    xi = np.asarray(x, dtype=np.int64)
    e = np.asarray(exponent, dtype=np.int64)
    if np.any((e < 0) | (e > 31)):
        raise ValueError(f"exponent must be in [0, 31], got {e!r}")
    mask = (np.int64(1) << e) - 1
    remainder = xi & mask
    threshold = (mask >> 1) + (xi < 0)
    return (xi >> e) + (remainder > threshold)


def multiply_by_quantized_multiplier(
    x: npt.ArrayLike,
    multiplier: npt.ArrayLike,
    shift: npt.ArrayLike,
    *,
    single_rounding: bool = False,
) -> np.ndarray:
    """TFLite MultiplyByQuantizedMultiplier (``x * multiplier * 2**(shift - 31)``, rounded)."""
    xi = np.asarray(x, dtype=np.int64)
    m = np.asarray(multiplier, dtype=np.int64)
    sh = np.asarray(shift, dtype=np.int64)
    if single_rounding:
        if np.any((sh < -31) | (sh > 30)):
            raise ValueError(f"single rounding needs -31 <= shift <= 30, got {sh!r}")
        total = 31 - sh
        out = (xi * m + (np.int64(1) << (total - 1))) >> total
        return np.clip(out, INT32_MIN, INT32_MAX)
    left = np.maximum(sh, 0)
    right = np.maximum(-sh, 0)
    return rounding_divide_by_pot(srdhm(wrap_int32(xi << left), m), right)
