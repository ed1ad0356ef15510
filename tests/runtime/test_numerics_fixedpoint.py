"""Fixed-point multipliers and the gemmlowp primitives, against plain-Python-int references.

The references below are written independently of runtime.numerics: Python ints (arbitrary
precision) and fractions.Fraction, one element at a time.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numerics_refs import (
    I32_MAX,
    I32_MIN,
    half_away,
    int32s,
    ref_quantize_multiplier,
    ref_rdbpot,
    ref_srdhm,
)

from qfuse.runtime.numerics import (
    effective_scale,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    rounding_divide_by_pot,
    srdhm,
    tpu_multiplier_rshift,
    wrap_int32,
)


def ref_wrap32(x: int) -> int:
    return (x + 2**31) % 2**32 - 2**31


# --- quantize_multiplier ---------------------------------------------------------------------


def test_quantize_multiplier_known_values() -> None:
    assert quantize_multiplier(0.5) == (1 << 30, 0)
    assert quantize_multiplier(1.0) == (1 << 30, 1)
    assert quantize_multiplier(0.25) == (1 << 30, -1)
    assert quantize_multiplier(0.75) == (3 << 29, 0)
    assert quantize_multiplier(2.0) == (1 << 30, 2)
    assert quantize_multiplier(0.0) == (0, 0)
    assert quantize_multiplier(0.1234) == (2119995857, -3)  # TPU-MLIR's multiplier, TFLite shift
    assert quantize_multiplier(2.0**-40) == (0, 0)  # shift < -31 flushes to zero


def test_quantize_multiplier_rounds_up_to_two_pow_31() -> None:
    """frac * 2**31 rounding to 2**31 folds into (2**30, shift + 1)."""
    frac = 1.0 - 2.0**-33  # largest frac below 1 that still rounds to 2**31
    assert round(frac * 2**31) == 2**31
    assert quantize_multiplier(frac * 2.0**-4) == (1 << 30, -3)
    below = 1.0 - 2.0**-31  # rounds to 2**31 - 1, no fold
    assert quantize_multiplier(below * 2.0**-4) == (2**31 - 1, -4)


def test_quantize_multiplier_ties_round_away() -> None:
    """frac * 2**31 with a fractional part of exactly .5 rounds up (std::round)."""
    frac = (2**30 + 2 + 0.5) / 2**31  # in [0.5, 1), exactly representable
    assert quantize_multiplier(frac) == (2**30 + 3, 0)
    frac_even = (2**30 + 3 + 0.5) / 2**31
    assert quantize_multiplier(frac_even) == (2**30 + 4, 0)


def test_quantize_multiplier_float_precision() -> None:
    real = 0.1 + 1e-12
    q64, _ = quantize_multiplier(real, precision="double")
    q32, _ = quantize_multiplier(real, precision="float")
    assert q32 == ref_quantize_multiplier(float(np.float32(real)))[0]
    assert q64 == ref_quantize_multiplier(real)[0]
    assert q32 != q64


@settings(max_examples=300)
@given(st.floats(0, 1e4, allow_nan=False, allow_infinity=False))
def test_quantize_multiplier_matches_reference(real: float) -> None:
    q, shift = quantize_multiplier(real)
    assert (int(q), int(shift)) == ref_quantize_multiplier(real)
    if 2.0**-31 < real < 2.0**30:
        assert abs(int(q) * 2.0 ** (int(shift) - 31) - real) <= real * 2.0**-30


def test_quantize_multiplier_vectorised_and_validated() -> None:
    reals = np.array([0.5, 1.0, 0.25, 0.1234, 0.0])
    q, shift = quantize_multiplier(reals)
    assert q.dtype == np.int32 and shift.dtype == np.int32
    assert [(int(a), int(b)) for a, b in zip(q, shift, strict=True)] == [
        ref_quantize_multiplier(float(r)) for r in reals
    ]
    for bad in (-0.5, np.nan, np.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            quantize_multiplier(bad)


def test_effective_scale_precision() -> None:
    s_in, s_w, s_out = np.float32(0.0123), np.float32(0.00457), np.float32(0.0711)
    d = effective_scale(s_in, s_w, s_out, "double")
    f = effective_scale(s_in, s_w, s_out, "float")
    assert d == (float(s_in) * float(s_w)) / float(s_out)
    assert f == float((s_in * s_w) / s_out)
    per_channel = effective_scale(s_in, np.array([s_w, 2 * s_w], np.float32), s_out)
    assert per_channel.shape == (2,)


# --- TPU-MLIR multiplier + rshift ------------------------------------------------------------


def test_tpu_seed_example() -> None:
    """TPU-MLIR quantization chapter: y = x * 0.1234 = (x * 2119995857) >> 34."""
    m, r = tpu_multiplier_rshift(0.1234)
    assert (int(m), int(r)) == (2119995857, 34)
    x = np.arange(-100000, 100001, 7, dtype=np.int64)
    approx = (x * 2119995857) >> 34  # floor, as in the seed
    assert np.all(np.abs(approx - x * 0.1234) <= 1.0)
    assert np.all(np.abs(x * 2119995857 / 2.0**34 - x * 0.1234) < 1e-9 * np.abs(x) + 1e-12)


def test_tpu_normalize_bits() -> None:
    m8, r8 = tpu_multiplier_rshift(0.1234, bits=8)
    assert (int(m8), int(r8)) == (126, 10)  # 0.9872 * 2**7 = 126.36
    assert abs(126 / 2**10 - 0.1234) < 2**-10
    m, r = tpu_multiplier_rshift(np.array([0.5, 1.0, 3.0, 0.0]), bits=8)
    assert m.tolist() == [64, 64, 96, 0] and r.tolist() == [7, 6, 5, 0]
    m_fold, r_fold = tpu_multiplier_rshift((1 - 2.0**-9) * 0.25, bits=8)  # rounds to 128 -> 64
    assert (int(m_fold), int(r_fold)) == (64, 8)
    with pytest.raises(ValueError, match="bits must be 8 or 32"):
        tpu_multiplier_rshift(0.5, bits=16)


def ref_tpu_search(scale: float, bits: int) -> tuple[int, int]:
    """TPU-MLIR get_scale_and_shift written out: float scale, float error, strict <."""
    scale_f = float(np.float32(scale))
    limit = I32_MAX if bits == 32 else 127
    best_err, best_n = np.float32(np.finfo(np.float32).max), None
    for n in range(-32, 31):
        m = half_away(Fraction(scale_f) * Fraction(2) ** n)
        err = np.float32(abs(m / 2.0**n - scale_f))
        if err < best_err and abs(m) < limit:
            best_err, best_n = err, n
    assert best_n is not None
    return half_away(Fraction(scale_f) * Fraction(2) ** best_n), best_n


def test_tpu_search_known() -> None:
    m, r = tpu_multiplier_rshift(0.1234, method="search")
    assert (int(m), int(r)) == (4140617, 25)  # float32(0.1234) == 4140617 / 2**25 exactly
    assert np.float32(0.1234) == 4140617 / 2**25


@settings(max_examples=150, deadline=None)
@given(st.floats(1e-6, 4.0), st.sampled_from([8, 32]))
def test_tpu_search_matches_reference(scale: float, bits: int) -> None:
    m, r = tpu_multiplier_rshift(scale, bits=bits, method="search")
    assert (int(m), int(r)) == ref_tpu_search(scale, bits)


# --- gemmlowp primitives ---------------------------------------------------------------------


def test_srdhm_edges() -> None:
    assert srdhm(I32_MIN, I32_MIN) == I32_MAX  # the overflow case
    assert srdhm(I32_MAX, I32_MAX) == I32_MAX - 1
    assert srdhm(I32_MIN, I32_MAX) == I32_MIN + 1
    assert srdhm(2**30, 2**30) == 2**29
    # ties (a * b / 2**31 = k + 1/2) round toward +infinity
    assert srdhm(1, 2**30) == 1  # 0.5 -> 1
    assert srdhm(-1, 2**30) == 0  # -0.5 -> 0
    assert srdhm(-3, 2**30) == -1  # -1.5 -> -1
    assert srdhm(3, 2**30) == 2  # 1.5 -> 2


@settings(max_examples=400)
@given(int32s, int32s)
def test_srdhm_matches_reference(a: int, b: int) -> None:
    got = srdhm(np.array([a]), np.array([b]))[0]
    assert got == ref_srdhm(a, b)
    if not a == b == I32_MIN:  # it is round-half-up of a * b / 2**31
        assert got == math.floor(Fraction(a * b, 2**31) + Fraction(1, 2))


def test_rdbpot_ties_and_edges() -> None:
    x = np.array([-5, -3, -1, 1, 3, 5])  # x / 2 are ties
    assert rounding_divide_by_pot(x, 1).tolist() == [-3, -2, -1, 1, 2, 3]
    assert rounding_divide_by_pot(np.array([I32_MIN, I32_MAX]), 31).tolist() == [-1, 1]
    assert rounding_divide_by_pot(np.array([I32_MIN, -7, 7]), 0).tolist() == [I32_MIN, -7, 7]
    per_channel = rounding_divide_by_pot(np.array([12, 12, 12]), np.array([1, 2, 3]))
    assert per_channel.tolist() == [6, 3, 2]
    with pytest.raises(ValueError, match="exponent"):
        rounding_divide_by_pot(1, 32)


@settings(max_examples=400)
@given(int32s, st.integers(0, 31))
def test_rdbpot_matches_reference(x: int, e: int) -> None:
    assert rounding_divide_by_pot(np.array([x]), e)[0] == ref_rdbpot(x, e)


def test_wrap_int32() -> None:
    v = [2**31, -(2**31) - 1, 2**32 + 5, -7]
    assert wrap_int32(np.array(v)).tolist() == [ref_wrap32(x) for x in v]


@settings(max_examples=300)
@given(int32s, st.integers(2**30, I32_MAX), st.integers(-31, 30))
def test_multiply_by_quantized_multiplier_matches_reference(x: int, m: int, shift: int) -> None:
    two = multiply_by_quantized_multiplier(np.array([x]), m, shift)[0]
    left, right = max(shift, 0), max(-shift, 0)
    assert two == ref_rdbpot(ref_srdhm(ref_wrap32(x * 2**left), m), right)
    one = multiply_by_quantized_multiplier(np.array([x]), m, shift, single_rounding=True)[0]
    exact = math.floor(Fraction(x * m, 2 ** (31 - shift)) + Fraction(1, 2))
    assert one == min(max(exact, I32_MIN), I32_MAX)
