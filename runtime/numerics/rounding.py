"""Rounding modes, integer ranges and saturation.

Every framework qfuse compares against picks one of three ways to round a tie (a value exactly
halfway between two integers):

==========  ======================  ======================  =================================
mode        rule                    -2.5 -1.5 -0.5 .5 1.5   used by
==========  ======================  ======================  =================================
HALF_EVEN   to the even neighbour   -2   -2   -0   0  2    ONNX, MLAS, oneDNN (MXCSR default)
HALF_AWAY   away from zero          -3   -2   -1   1  2    ``std::round``, TFLite
HALF_UP     toward +infinity        -2   -1   -0   1  2    ``floor(x + .5)``, TPU-MLIR shifts
==========  ======================  ======================  =================================

Float precision matters for ``HALF_UP`` and ``HALF_AWAY`` when they are written the C way,
``floor(x + 0.5)``: for the float32 just below 0.5, ``0.49999997 + 0.5`` is a tie in float32 that
rounds (to even) to ``1.0``, so the idiom returns 1 where the exact answer is 0. The same idiom in
float64 fails at ``0.49999999999999994``. The functions here are exact in the input's own
precision (they compare the fraction ``x - floor(x)``, which is always exact); ``naive=True``
reproduces the idiom bit for bit, in the input's precision, for emulating code that uses it.

Integer right shifts with rounding (``shift_right_round``) follow TPU-MLIR's ``RightShiftRound``:
``v = x >> n`` (arithmetic, i.e. floor), ``m = x & (2**n - 1)`` (the dropped bits, always >= 0),
``h = 2**(n-1)``; then HALF_UP adds 1 when ``m >= h``, HALF_AWAY adds 1 when ``m >= h`` for
``x >= 0`` and when ``m > h`` for ``x < 0``, HALF_EVEN adds 1 when ``m > h`` or ``m == h`` and ``v``
is odd. A negative ``n`` is a left shift.

Saturation clamps to the integer type's range before the cast. NaN has no integer value; every
caller states what it maps to (``nan=``). The default, ``qmin``, is what ONNX Runtime's
QuantizeLinear returns on x86 (MLAS clamps with ``maxps``, which returns the bound for NaN) —
measured with onnxruntime 1.31: NaN -> 0 (u8), -128 (s8); +inf -> qmax, -inf -> qmin.
"""

from __future__ import annotations

import enum
from typing import Final

import numpy as np
import numpy.typing as npt

#: Integers up to 2^24 in magnitude are exact in float32 (a 24-bit significand).
F32_EXACT: Final = 1 << 24

__all__ = [
    "Rounding",
    "dtype_range",
    "resolve_dtype",
    "round_half_away",
    "round_half_even",
    "round_half_up",
    "round_with",
    "saturate",
    "shift_right_round",
]


class Rounding(enum.Enum):
    """How a value exactly halfway between two integers is rounded."""

    HALF_EVEN = "half_even"
    HALF_AWAY = "half_away"
    HALF_UP = "half_up"


_ALIASES: Final[dict[str, np.dtype]] = {
    "u8": np.dtype(np.uint8),
    "s8": np.dtype(np.int8),
    "u16": np.dtype(np.uint16),
    "s16": np.dtype(np.int16),
    "s32": np.dtype(np.int32),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
}
_SUPPORTED: Final[frozenset[np.dtype]] = frozenset(
    np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32)
)


def resolve_dtype(dtype: npt.DTypeLike | str) -> np.dtype:
    """The numpy integer dtype for ``dtype`` ("u8", "s8", "s16", "s32", np.uint8, ...)."""
    if isinstance(dtype, str) and dtype.lower() in _ALIASES:
        resolved = _ALIASES[dtype.lower()]
    else:
        try:
            resolved = np.dtype(dtype)
        except TypeError as exc:
            raise ValueError(f"unknown quantized dtype {dtype!r}") from exc
    if resolved not in _SUPPORTED:
        raise ValueError(
            f"unsupported quantized dtype {resolved}: use one of u8, s8, u16, s16, s32"
        )
    return resolved


def dtype_range(dtype: npt.DTypeLike | str) -> tuple[int, int]:
    """``(qmin, qmax)`` of an integer dtype: u8 (0, 255), s8 (-128, 127), s32 (-2**31, 2**31-1)."""
    info = np.iinfo(resolve_dtype(dtype))
    return int(info.min), int(info.max)


def round_half_even(x: npt.ArrayLike) -> np.ndarray:
    """Round half to even (IEEE default, ``np.rint``), in the input's float precision."""
    return np.rint(_as_float(x))


def round_half_away(x: npt.ArrayLike, *, naive: bool = False) -> np.ndarray:
    """Round half away from zero (``std::round``).

    ``naive=True`` computes ``trunc(x + copysign(0.5, x))`` in the input's precision, the C idiom
    that rounds the float just below 0.5 up to 1.
    """
    xf = _as_float(x)
    half = xf.dtype.type(0.5)
    if naive:
        return np.trunc(xf + np.copysign(half, xf))
    t = np.trunc(xf)
    frac = np.abs(xf - t)  # exact: |x - trunc(x)| < 1 keeps x's fraction bits
    return np.where(frac >= half, t + np.copysign(xf.dtype.type(1), xf), t)


def round_half_up(x: npt.ArrayLike, *, naive: bool = False) -> np.ndarray:
    """Round half toward +infinity (``floor(x + 0.5)`` done exactly).

    ``naive=True`` computes ``floor(x + 0.5)`` literally in the input's precision.
    """
    xf = _as_float(x)
    half = xf.dtype.type(0.5)
    if naive:
        return np.floor(xf + half)
    f = np.floor(xf)
    return np.where(xf - f >= half, f + xf.dtype.type(1), f)


def round_with(x: npt.ArrayLike, mode: Rounding) -> np.ndarray:
    """Round ``x`` with ``mode`` (exact in the input's precision)."""
    if mode is Rounding.HALF_EVEN:
        return round_half_even(x)
    if mode is Rounding.HALF_AWAY:
        return round_half_away(x)
    if mode is Rounding.HALF_UP:
        return round_half_up(x)
    raise ValueError(f"unknown rounding mode {mode!r}")


def shift_right_round(x: npt.ArrayLike, n: npt.ArrayLike, mode: Rounding) -> np.ndarray:
    """``x / 2**n`` rounded with ``mode``, on int64 (TPU-MLIR ``RightShiftRound``).

    ``n`` broadcasts against ``x`` (per-channel shifts); ``n < 0`` shifts left, ``n > 63`` is
    clamped to 63 like TPU-MLIR. Inputs must fit in int64 (products of int32 values do).
    """
    xi = np.asarray(x, dtype=np.int64)
    ni = np.minimum(np.asarray(n, dtype=np.int64), 63)
    pos = np.maximum(ni, 0)
    left = np.left_shift(xi, np.maximum(-ni, 0))
    val = np.right_shift(xi, pos)
    mant = np.bitwise_and(xi, np.left_shift(np.int64(1), pos) - 1)
    half = np.left_shift(np.int64(1), np.maximum(pos - 1, 0))
    if mode is Rounding.HALF_UP:
        up = mant >= half
    elif mode is Rounding.HALF_AWAY:
        up = np.where(xi >= 0, mant >= half, mant > half)
    elif mode is Rounding.HALF_EVEN:
        up = (mant > half) | ((mant == half) & (np.bitwise_and(val, 1) == 1))
    else:
        raise ValueError(f"unknown rounding mode {mode!r}")
    rounded = val + up.astype(np.int64)
    return np.where(ni > 0, rounded, left)


def saturate(x: npt.ArrayLike, dtype: npt.DTypeLike | str, *, nan: int | None = None) -> np.ndarray:
    """Clamp ``x`` to the range of ``dtype`` and cast.

    Float inputs must already hold integral values (round first); NaN becomes ``nan``, which
    defaults to ``qmin`` (ONNX Runtime's x86 behaviour, see the module docstring).
    """
    dt = resolve_dtype(dtype)
    lo, hi = dtype_range(dt)
    arr = np.asarray(x)
    if arr.dtype.kind == "f":
        a = arr.astype(np.float64)
        nan_value = lo if nan is None else int(nan)
        if not lo <= nan_value <= hi:
            raise ValueError(f"nan replacement {nan_value} is outside {dt}'s range [{lo}, {hi}]")
        a = np.where(np.isnan(a), float(nan_value), a)
        return np.clip(a, lo, hi).astype(dt)
    if arr.dtype.kind in "iub":
        return np.clip(arr.astype(np.int64), lo, hi).astype(dt)
    raise ValueError(f"cannot saturate values of dtype {arr.dtype}")


def _as_float(x: npt.ArrayLike) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind == "f":
        return arr
    return arr.astype(np.float64)
