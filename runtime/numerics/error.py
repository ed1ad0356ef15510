"""Quantization error statistics, after Caffe2 DNNLOWP's ``measure_quantization_error``.

Caffe2 (caffe2/quantization/server/dnnlowp.cc) runs a float shadow of each int8 operator and
accumulates, per output, ``sum_sq = sum(ref**2)``, ``sum_err_sq = sum((actual - ref)**2)``, the
max absolute error together with the reference and actual values where it occurred, and a
measurement count; it reports the *l2 relative error* ``sqrt(sum_err_sq) / sqrt(sum_sq)`` ("nan"
when ``sum_sq`` is 0), the max abs error with its two values, both sums and the count. Caffe2
accumulates in float32; qfuse accumulates in float64.

Added here:

- ``l2_error = sqrt(sum_err_sq)``
- ``sqnr_db = 10 log10(sum_sq / sum_err_sq)``; +inf when the two tensors are equal
- ``max_error_lsb = max(|actual - ref| / scale)`` — the error in units of the output's
  quantization step (``scale`` scalar or broadcastable per-channel array); None without a scale.

``ErrorStats.merge`` combines measurements like Caffe2's running stats (``count`` adds up).

The two measures every comparison in qfuse uses (tests, bench, the zoo tables) live here once:

- ``cosine(a, b) = a·b / (|a|·|b|)`` in float64 over the flattened tensors (1.0 when both are
  zero, 0.0 when only one is);
- ``step_diff(a, b, scale=None)``: ``StepDiff(max_steps, identical)`` — the largest distance in
  quantization steps (integer tensors: |a − b|; float tensors: rint(|a − b| / scale)) and the
  share of elements at distance 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["ErrorStats", "StepDiff", "cosine", "quantization_error", "step_diff"]


def cosine(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Cosine similarity of two tensors of the same size (module docstring)."""
    x = np.asarray(a, np.float64).ravel()
    y = np.asarray(b, np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"cosine of tensors of {x.size} and {y.size} elements")
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    if norm == 0.0:
        return float(not np.any(x) and not np.any(y))
    return float(x @ y) / norm


class StepDiff(NamedTuple):
    """How far two quantized tensors are apart, in quantization steps (LSB)."""

    max_steps: int
    identical: float  # share of elements 0 steps apart


def step_diff(a: npt.ArrayLike, b: npt.ArrayLike, scale: float | None = None) -> StepDiff:
    """Integer tensors: |a − b|; dequantized tensors: rint(|a − b| / scale) (module docstring)."""
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        raise ValueError(f"step_diff of shapes {x.shape} and {y.shape}")
    if scale is None:
        steps = np.abs(x.astype(np.int64) - y.astype(np.int64))
    else:
        steps = np.rint(np.abs(x.astype(np.float64) - y.astype(np.float64)) / scale)
    identical = float(np.mean(steps == 0)) if steps.size else 1.0
    return StepDiff(int(steps.max(initial=0)), identical)


@dataclass(frozen=True)
class ErrorStats:
    """Error of an approximation against a float reference (see the module docstring)."""

    count: int
    elements: int
    sum_sq: float
    sum_err_sq: float
    max_abs_error: float
    max_error_ref: float
    max_error_actual: float
    max_error_lsb: float | None

    @property
    def l2_error(self) -> float:
        return math.sqrt(self.sum_err_sq)

    @property
    def relative_l2(self) -> float:
        """``sqrt(sum_err_sq) / sqrt(sum_sq)``; NaN when the reference is all zeros."""
        if self.sum_sq == 0:
            return math.nan
        return math.sqrt(self.sum_err_sq) / math.sqrt(self.sum_sq)

    @property
    def sqnr_db(self) -> float:
        """``10 log10(sum(ref**2) / sum(err**2))``; +inf when there is no error."""
        if self.sum_err_sq == 0:
            return math.inf
        if self.sum_sq == 0:
            return -math.inf
        return 10.0 * math.log10(self.sum_sq / self.sum_err_sq)

    def merge(self, other: ErrorStats) -> ErrorStats:
        """Accumulate two measurements (sums add, maxima combine)."""
        first = self.max_abs_error >= other.max_abs_error
        worst = self if first else other
        lsb: float | None
        if self.max_error_lsb is None or other.max_error_lsb is None:
            lsb = None
        else:
            lsb = max(self.max_error_lsb, other.max_error_lsb)
        return ErrorStats(
            count=self.count + other.count,
            elements=self.elements + other.elements,
            sum_sq=self.sum_sq + other.sum_sq,
            sum_err_sq=self.sum_err_sq + other.sum_err_sq,
            max_abs_error=worst.max_abs_error,
            max_error_ref=worst.max_error_ref,
            max_error_actual=worst.max_error_actual,
            max_error_lsb=lsb,
        )

    def summary(self) -> str:
        """One line in the spirit of Caffe2's report."""
        lsb = "" if self.max_error_lsb is None else f" ({self.max_error_lsb:.3g} LSB)"
        return (
            f"l2 relative error {self.relative_l2:.6g}, SQNR {self.sqnr_db:.2f} dB, "
            f"max abs error {self.max_abs_error:.6g}{lsb} (reference {self.max_error_ref:.6g}, "
            f"actual {self.max_error_actual:.6g}), sum_err_sq {self.sum_err_sq:.6g}, "
            f"sum_sq {self.sum_sq:.6g}, cnt {self.count}"
        )


def quantization_error(
    ref: npt.ArrayLike, approx: npt.ArrayLike, scale: npt.ArrayLike | None = None
) -> ErrorStats:
    """Compare a float reference with an approximation (e.g. a dequantized int8 output)."""
    r = np.asarray(ref, dtype=np.float64)
    a = np.asarray(approx, dtype=np.float64)
    if r.shape != a.shape:
        raise ValueError(f"reference shape {r.shape} differs from approximation {a.shape}")
    if r.size == 0:
        raise ValueError("cannot measure the error of empty tensors")
    err = a - r
    abs_err = np.abs(err)
    i = int(np.argmax(abs_err))
    lsb: float | None = None
    if scale is not None:
        s = np.asarray(scale, dtype=np.float64)
        if np.any(~np.isfinite(s)) or np.any(s <= 0):
            raise ValueError(f"scale must be finite and > 0, got {s!r}")
        lsb = float(np.max(abs_err / np.broadcast_to(s, r.shape)))
    return ErrorStats(
        count=1,
        elements=int(r.size),
        sum_sq=float(np.sum(r * r)),
        sum_err_sq=float(np.sum(err * err)),
        max_abs_error=float(abs_err.reshape(-1)[i]),
        max_error_ref=float(r.reshape(-1)[i]),
        max_error_actual=float(a.reshape(-1)[i]),
        max_error_lsb=lsb,
    )
