"""ONNX QuantizeLinear / DequantizeLinear, bit-exact.

    q  = saturate(round_half_even(x / scale) + zero_point)      (QuantizeLinear)
    x' = (q - zero_point) * scale                                (DequantizeLinear)

Precision, as ONNX and ONNX Runtime compute it:

- ``x / scale`` is a float32 division. Multiplying by ``1/scale`` is *not* the same: the
  reciprocal is rounded first, and results move by one LSB on values near a tie.
- The rounded value is an integral float32; the zero point is added exactly (MLAS clamps to
  ``[qmin - zp, qmax - zp]`` in float, rounds, then adds ``zp`` in int32: same result).
- ``(q - zero_point)`` is exact in int32, converted to float32 (exact for 8/16-bit types,
  rounded to nearest-even beyond 2**24 for s32), then multiplied by the float32 scale.
- NaN quantizes to ``qmin``, +inf to ``qmax``, -inf to ``qmin`` (onnxruntime 1.31 on x86;
  the ONNX spec leaves NaN undefined).

Per-axis quantization: ``scale`` and ``zero_point`` are 1-D of length ``x.shape[axis]``
(ONNX's default axis is 1). Blocked quantization (opset 21 ``block_size``) is not supported.

Validation (``ValueError``): a scale that is zero, negative, NaN or infinite, and a zero point
outside the target dtype's range or not an integer.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from qfuse.runtime.numerics.rounding import dtype_range, resolve_dtype, saturate

__all__ = ["check_scale", "check_zero_point", "dequantize", "quantize"]


def check_scale(scale: npt.ArrayLike, *, name: str = "scale") -> np.ndarray:
    """``scale`` as float32 after checking every value is finite and > 0."""
    s = np.asarray(scale)
    if s.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be a float array, got dtype {s.dtype}")
    s32 = s.astype(np.float32)
    bad = ~np.isfinite(s32) | (s32 <= 0)
    if np.any(bad):
        first = s32.reshape(-1)[int(np.argmax(bad.reshape(-1)))]
        raise ValueError(f"{name} must be finite and > 0, got {first!r}")
    return s32


def check_zero_point(
    zero_point: npt.ArrayLike, dtype: npt.DTypeLike | str, *, name: str = "zero_point"
) -> np.ndarray:
    """``zero_point`` as int64 after checking it is an integer inside ``dtype``'s range."""
    z = np.asarray(zero_point)
    if z.dtype.kind == "f":
        if np.any(z != np.round(z)):
            raise ValueError(f"{name} must hold integers, got {z!r}")
    elif z.dtype.kind not in "iub":
        raise ValueError(f"{name} must be an integer array, got dtype {z.dtype}")
    zi = z.astype(np.int64)
    lo, hi = dtype_range(dtype)
    out = (zi < lo) | (zi > hi)
    if np.any(out):
        first = int(zi.reshape(-1)[int(np.argmax(out.reshape(-1)))])
        raise ValueError(
            f"{name} {first} is outside the range [{lo}, {hi}] of {resolve_dtype(dtype)}"
        )
    return zi


def quantize(
    x: npt.ArrayLike,
    scale: npt.ArrayLike,
    zero_point: npt.ArrayLike = 0,
    dtype: npt.DTypeLike | str = np.uint8,
    axis: int | None = None,
) -> np.ndarray:
    """ONNX QuantizeLinear: ``saturate(rint(f32(x) / f32(scale)) + zero_point)``."""
    dt = resolve_dtype(dtype)
    xf = np.asarray(x, dtype=np.float32)
    s = check_scale(scale)
    z = check_zero_point(zero_point, dt)
    s, z = _per_axis(xf.shape, s, z, axis)
    r = np.rint(xf / s)  # float32 division, round half to even
    with np.errstate(invalid="ignore"):
        shifted = r.astype(np.float64) + z  # exact: r is an integral float32
    return saturate(shifted, dt)


def dequantize(
    q: npt.ArrayLike,
    scale: npt.ArrayLike,
    zero_point: npt.ArrayLike = 0,
    axis: int | None = None,
) -> np.ndarray:
    """ONNX DequantizeLinear: ``f32(q - zero_point) * f32(scale)`` (float32 result)."""
    qa = np.asarray(q)
    if qa.dtype.kind not in "iu":
        raise ValueError(f"dequantize expects an integer array, got dtype {qa.dtype}")
    s = check_scale(scale)
    z = check_zero_point(zero_point, qa.dtype)
    s, z = _per_axis(qa.shape, s, z, axis)
    diff = qa.astype(np.int64) - z
    return diff.astype(np.float32) * s


def _per_axis(
    shape: tuple[int, ...], s: np.ndarray, z: np.ndarray, axis: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Reshape 1-D scale / zero point so they broadcast along ``axis`` (ONNX default 1)."""
    if s.size == 1 and z.size == 1 and (axis is None or s.ndim == 0):
        return s.reshape(()), z.reshape(())
    if s.ndim > 1 or z.ndim > 1:
        raise ValueError(
            "per-axis scale and zero point must be 1-D (blocked quantization is not supported)"
        )
    ndim = len(shape)
    ax = 1 if axis is None else axis
    if not -ndim <= ax < ndim:
        raise ValueError(f"axis {ax} is out of range for a {ndim}-D tensor")
    ax %= ndim
    n = shape[ax]
    if s.size not in (1, n) or z.size not in (1, n):
        raise ValueError(
            f"per-axis scale ({s.size}) and zero point ({z.size}) must have "
            f"{n} values, the size of axis {ax}"
        )
    bshape = [1] * ndim
    bshape[ax] = n
    sb = np.broadcast_to(s.reshape(-1), (n,)).reshape(bshape)
    zb = np.broadcast_to(z.reshape(-1), (n,)).reshape(bshape)
    return sb, zb
