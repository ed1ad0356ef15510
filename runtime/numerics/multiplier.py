"""Fixed-point multipliers: a real scale M ~ multiplier / 2**n.

Effective scale of a quantized conv / matmul (``effective_scale``)::

    M = s_in * s_w / s_out        computed as (s_in * s_w) / s_out

Scales are float32 values (that is how ONNX and TFLite files store them); ``precision`` is the
arithmetic: "double" promotes them to float64 (TFLite), "float" keeps every step in float32
(ONNX Runtime, Caffe2, SNPS-Caffe's "F" variants).

TFLite ``QuantizeMultiplier`` (``quantize_multiplier``)::

    frac, shift = frexp(M)              M = frac * 2**shift,  frac in [0.5, 1)
    q = std::round(frac * 2**31)        round half away from zero; frac * 2**31 is exact
    if q == 2**31: q = 2**30; shift += 1
    if shift < -31: q = 0; shift = 0    (flush tiny multipliers to zero)
    if shift > 30: q = 2**31 - 1; shift = 30   (newer TFLite, for single rounding)
    =>  M ~ q * 2**(shift - 31)

Shift convention: TFLite's ``shift`` is a *left* shift exponent (positive for M >= 1, negative
for M < 0.5); the total right shift after the 32x32 multiply is ``31 - shift``. 0.5 gives
``(2**30, 0)``, 1.0 gives ``(2**30, 1)``, 0.25 gives ``(2**30, -1)``.

TPU-MLIR multiplier + right shift (``tpu_multiplier_rshift``), ``M ~ multiplier / 2**rshift``
with a ``bits``-wide signed multiplier (32 or 8):

- ``method="normalize"`` — the form in TPU-MLIR's quantization chapter (TPU-MLIR quantization chapter): normalise M
  to ``frac * 2**e`` with ``frac`` in [0.5, 1), take ``multiplier = round(frac * 2**(bits-1))``
  (half away; 2**(bits-1) folds to 2**(bits-2) with e + 1) and ``rshift = (bits - 1) - e``.
  0.1234 = 0.9872 * 2**-3 gives (2119995857, 34): ``(x * 2119995857) >> 34 ~ 0.1234 x``.
- ``method="search"`` — what the BM1684X conv lowering actually calls
  (``get_scale_and_shift`` in lib/Support/MathUtils.cpp): the scale is converted to float32,
  then for ``n = -32 .. 30`` it takes ``m = std::round(M * 2**n)`` and keeps the first n with
  the strictly smallest float32 error ``|m / 2**n - M|`` among ``|m| < INT32_MAX`` (bits=32) or
  ``|m| < 127`` (bits=8). The float32 conversion makes the search stop at the first *exact*
  representation of the float32 value: float32(0.1234) is exactly 4140617 / 2**25, so it
  returns (4140617, 25), not the normalised (2119995857, 34). Both are within 3e-9 relative of
  0.1234; they round differently on some accumulators.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from qfuse.runtime.numerics.rounding import round_half_away

__all__ = ["Precision", "effective_scale", "quantize_multiplier", "tpu_multiplier_rshift"]

Precision = Literal["double", "float"]
TpuMethod = Literal["normalize", "search"]

_INT32_MAX = 2**31 - 1


def effective_scale(
    s_in: npt.ArrayLike,
    s_w: npt.ArrayLike,
    s_out: npt.ArrayLike,
    precision: Precision = "double",
) -> np.ndarray:
    """``(s_in * s_w) / s_out`` from float32 scales, in double or float arithmetic (as float64)."""
    a = np.asarray(s_in, dtype=np.float32)
    w = np.asarray(s_w, dtype=np.float32)
    o = np.asarray(s_out, dtype=np.float32)
    if precision == "double":
        return (a.astype(np.float64) * w.astype(np.float64)) / o.astype(np.float64)
    if precision == "float":
        return ((a * w) / o).astype(np.float64)
    raise ValueError(f"precision must be 'double' or 'float', got {precision!r}")


def quantize_multiplier(
    real: npt.ArrayLike, precision: Precision = "double"
) -> tuple[np.ndarray, np.ndarray]:
    """TFLite ``QuantizeMultiplier``: ``real ~ multiplier * 2**(shift - 31)``.

    Returns int32 ``multiplier`` and int32 ``shift`` arrays of ``real``'s shape (0-d for a scalar).
    ``precision="float"`` first rounds ``real`` to float32 (the multiplier was computed in float).
    """
    r = _check_real(real, "real multiplier")
    if precision == "float":
        r = r.astype(np.float32).astype(np.float64)
    elif precision != "double":
        raise ValueError(f"precision must be 'double' or 'float', got {precision!r}")
    frac, shift = np.frexp(r)
    q = round_half_away(frac * 2.0**31).astype(np.int64)
    shift = shift.astype(np.int64)
    carry = q == 2**31
    q = np.where(carry, q // 2, q)
    shift = np.where(carry, shift + 1, shift)
    tiny = shift < -31
    q = np.where(tiny, 0, q)
    shift = np.where(tiny, 0, shift)
    big = shift > 30
    q = np.where(big, _INT32_MAX, q)
    shift = np.where(big, 30, shift)
    return q.astype(np.int32), shift.astype(np.int32)


def tpu_multiplier_rshift(
    scale: npt.ArrayLike, bits: int = 32, method: TpuMethod = "normalize"
) -> tuple[np.ndarray, np.ndarray]:
    """TPU-MLIR ``scale ~ multiplier / 2**rshift`` (int64 arrays; see the module docstring)."""
    if bits not in (8, 32):
        raise ValueError(f"bits must be 8 or 32, got {bits}")
    r = _check_real(scale, "scale")
    if method == "normalize":
        frac, e = np.frexp(r)
        m = round_half_away(frac * 2.0 ** (bits - 1)).astype(np.int64)
        e = e.astype(np.int64)
        carry = m == 2 ** (bits - 1)
        m = np.where(carry, m // 2, m)
        e = np.where(carry, e + 1, e)
        rshift = np.where(m == 0, 0, (bits - 1) - e)
        return m, rshift.astype(np.int64)
    if method == "search":
        return _tpu_search(r, bits)
    raise ValueError(f"method must be 'normalize' or 'search', got {method!r}")


def _tpu_search(r: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    limit = _INT32_MAX if bits == 32 else 127
    scale_f = r.astype(np.float32).astype(np.float64)[..., None]
    n = np.arange(-32, 31, dtype=np.int64)
    pow2 = np.ldexp(1.0, n)
    m = round_half_away(scale_f * pow2)
    err = np.abs(m / pow2 - scale_f).astype(np.float32)
    valid = np.abs(m) < limit
    err = np.where(valid, err, np.inf)
    # First n with the strictly smallest error (C++ loop with `err < min_err`): argmin picks the
    # first minimum.
    best = np.argmin(err, axis=-1)
    shift = np.asarray(n[best])
    mult = round_half_away(scale_f[..., 0] * np.ldexp(1.0, shift)).astype(np.int64)
    return mult, shift


def _check_real(x: npt.ArrayLike, name: str) -> np.ndarray:
    r = np.asarray(x, dtype=np.float64)
    if np.any(~np.isfinite(r)) or np.any(r < 0):
        raise ValueError(f"{name} must be finite and >= 0, got {r!r}")
    return r
