"""What an emulation kernel is, and helpers the kernels share.

A kernel takes a ``Match`` and, *before computing anything*, either declines (a ``Decline``
naming the precondition that fails, so the emulator falls back to the float path and says why)
or returns a ``Prepared``: a one-line description of the arithmetic it will use and a ``run``
function from a value reader to the quantized output. Every static parameter (multipliers,
shifts, float32 ratios) is computed in the preparation, the way the frameworks compute them in
their ``Prepare`` / kernel-creation step.

Activation clamp: Relu / Clip between the op and the QuantizeLinear becomes a clamp of the
integer output to ``[Q(lo), Q(hi)]``. Because quantization is monotonic, ``Q(clip(x, lo, hi)) =
clamp(Q(x), Q(lo), Q(hi))`` exactly, for any rounding; ``Q`` here is the framework's own
quantizer: ``zp + round(v / s)`` with round half away from zero for TFLite (``TfLiteRound``
in ``CalculateActivationRangeQuantized``) and round half to even for the others (ONNX).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qfuse.ir.ops import Op
from qfuse.runtime.emulate.patterns import Decline, Match
from qfuse.runtime.numerics import round_half_away, saturate

__all__ = [
    "Kernel",
    "Prepared",
    "Reader",
    "activation_bounds",
    "clamp_out",
    "float_activation",
    "ort_keeps_activation",
]

Reader = Callable[[str], np.ndarray]


@dataclass(frozen=True)
class Prepared:
    """A kernel ready to run: ``describe`` says which arithmetic, ``run`` computes the output."""

    describe: str
    run: Callable[[Reader], np.ndarray]


Kernel = Callable[[Match], "Prepared | Decline"]


def _activation_range(m: Match) -> tuple[float, float]:
    act = m.activation
    if act is None:
        return -math.inf, math.inf
    if act.op is Op.RELU:
        return 0.0, math.inf
    return float(act.attrs.min), float(act.attrs.max)


def activation_bounds(m: Match, *, half_away: bool = False) -> tuple[int, int]:
    """The output's integer range, narrowed by the fused Relu / Clip (module docstring)."""
    qmin, qmax = m.out.range
    lo, hi = _activation_range(m)
    s, zp = m.out.scale, m.out.zero_point

    def q(v: float) -> int:
        with np.errstate(over="ignore"):
            r = np.float32(v) / s
        rounded = round_half_away(r) if half_away else np.rint(r)
        return int(np.clip(float(rounded) + zp, qmin, qmax))

    if lo > -math.inf:
        qmin = max(qmin, q(lo))
    if hi < math.inf:
        qmax = min(qmax, q(hi))
    return qmin, qmax


def float_activation(m: Match) -> Callable[[np.ndarray], np.ndarray] | None:
    """The fused Relu / Clip as a float32 function (oneDNN eltwise post-op), or None."""
    if m.activation is None:
        return None
    lo, hi = _activation_range(m)
    return lambda x: np.clip(x, np.float32(lo), np.float32(hi)).astype(np.float32)


def ort_keeps_activation(m: Match) -> Decline | None:
    """ONNX Runtime fuses DQ -> op -> Q only when the op feeds the Q directly; a Relu / Clip in
    between is first removed by ReluQuantFusion (Q's zero point is its type's minimum) or
    ClipQuantFusion (the Clip range covers Q's real range, to float epsilon). Otherwise the op
    runs in float: decline, so the emulator takes the float path too."""
    act = m.activation
    if act is None:
        return None
    qmin, qmax = m.out.range
    zp, s = m.out.zero_point, float(m.out.scale)
    if act.op is Op.RELU and zp == qmin:
        return None
    if act.op is Op.CLIP:
        eps = float(np.finfo(np.float32).eps)
        lower, upper = s * (qmin - zp), s * (qmax - zp)
        if act.attrs.min - lower <= eps and upper - act.attrs.max <= eps:
            return None
    return Decline(f"ONNX Runtime keeps {act} (it does not cover the output range), so the "
                   f"op runs in float")


def clamp_out(values: np.ndarray, m: Match, bounds: tuple[int, int]) -> np.ndarray:
    """Clamp integer ``values`` to ``bounds`` and cast to the output type."""
    lo, hi = bounds
    return saturate(np.clip(np.asarray(values, np.int64), lo, hi), m.out.dtype.np)
