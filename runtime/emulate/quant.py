"""A QuantizeLinear on the float path, with the framework's own quantizer.

ONNX (and ONNX Runtime's MLAS): ``saturate(rint(f32(x / s)) + zp)`` — the float path itself.
Two frameworks quantize a float tensor differently:

- tflite (reference_ops ``AffineQuantize``): ``zp + TfLiteRound(x / s)``, a float32 division
  rounded half away from zero, then saturated.
- onednn (a reorder f32 -> u8/s8 with a dst scale and zero point; runtime/onednn/reference.py
  measured the store): ``saturate(rint(f32(f32(x·f32(1/s)) + zp)))`` — the reciprocal is
  rounded first and the zero point added in float32 before rounding, so values within an ulp of
  a tie can land on the other side of it; NaN stores 0 (u8) / 127 (s8).
"""

from __future__ import annotations

import numpy as np

from qfuse.ir.types import DType
from qfuse.runtime.emulate.kernel import Prepared, Reader
from qfuse.runtime.emulate.patterns import Decline, Match
from qfuse.runtime.numerics import round_half_away, saturate

__all__ = ["quantize_onednn", "quantize_tflite"]

F32 = np.float32


def _float_input(m: Match, read: Reader) -> np.ndarray:
    return np.asarray(read(m.root.inputs[0]), F32)


def quantize_tflite(m: Match) -> Prepared | Decline:
    s, zp = m.out.scale, m.out.zero_point

    def run(read: Reader) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = round_half_away((_float_input(m, read) / s).astype(F32))
        return saturate(q.astype(np.float64) + zp, m.out.dtype.np)

    return Prepared("tflite quantize (x / s rounded half away + zp)", run)


def quantize_onednn(m: Match) -> Prepared | Decline:
    inv, zp = F32(1) / m.out.scale, F32(m.out.zero_point)
    nan = 0 if m.out.dtype is DType.U8 else 127

    def run(read: Reader) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            y = ((_float_input(m, read) * inv).astype(F32) + zp).astype(F32)
        return saturate(np.rint(y), m.out.dtype.np, nan=nan)

    return Prepared("onednn reorder quantize (rint(x·(1/s) + zp))", run)
