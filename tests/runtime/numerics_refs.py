"""Independent integer references for the fixed-point numerics tests: gemmlowp / TFLite
written out with Python's arbitrary-precision ints and Fractions, sharing no code with
runtime/numerics."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import strategies as st

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
EDGES = [I32_MIN, I32_MIN + 1, -(2**30), -3, -2, -1, 0, 1, 2, 3, 2**30, I32_MAX - 1, I32_MAX]
int32s = st.one_of(st.sampled_from(EDGES), st.integers(I32_MIN, I32_MAX))


def half_away(v: Fraction) -> int:
    return math.floor(v + Fraction(1, 2)) if v >= 0 else -math.floor(-v + Fraction(1, 2))


def ref_quantize_multiplier(real: float) -> tuple[int, int]:
    if real == 0:
        return 0, 0
    frac, shift = math.frexp(real)
    q = half_away(Fraction(frac) * 2**31)
    if q == 2**31:
        q, shift = q // 2, shift + 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        return 2**31 - 1, 30
    return q, shift


def ref_srdhm(a: int, b: int) -> int:
    """gemmlowp's C++ written out with Python ints (C division truncates toward zero)."""
    if a == b == I32_MIN:
        return I32_MAX
    ab = a * b
    s = ab + (2**30 if ab >= 0 else 1 - 2**30)
    return s // 2**31 if s >= 0 else -((-s) // 2**31)


def ref_rdbpot(x: int, e: int) -> int:
    """Mathematical definition: x / 2**e rounded half away from zero."""
    return half_away(Fraction(x, 2**e))
