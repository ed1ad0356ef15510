"""Integer forms of AvgPool, Add, LeakyReLU, PReLU and Pad (TPU-MLIR quantization chapter) against float math."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.runtime.numerics import (
    Rounding,
    add_float,
    add_int16,
    add_multipliers,
    avgpool_float,
    avgpool_int,
    avgpool_params,
    dequantize,
    leaky_relu_int,
    pad_value,
    prelu_int,
    quantize,
    tpu_multiplier_rshift,
)


def _windows(rng: np.random.Generator, k: int, n: int, lo: int, hi: int) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=(n, k))


@pytest.mark.parametrize(("zp_x", "zp_y", "dtype"), [(0, 0, np.int8), (37, 120, np.uint8),
                                                     (-20, 5, np.int8)])  # fmt: skip
def test_avgpool_float_form_matches_float_math(zp_x: int, zp_y: int, dtype: type) -> None:
    rng = np.random.default_rng(0)
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    k, s_x, s_y = 9, 0.05, 0.04
    x = _windows(rng, k, 2000, lo, hi)
    scale, offset = avgpool_params(s_x, zp_x, s_y, zp_y, k)
    assert scale == np.float32(s_x / (s_y * k))
    assert offset == np.float32(s_x / s_y * zp_x - zp_y)  # TPU-MLIR quantization chapter prints the opposite sign
    got = avgpool_float(x.sum(axis=1), scale, offset, dtype)
    real = s_x * (x - zp_x).mean(axis=1)  # the float AvgPool of the dequantized input
    want = quantize(real, s_y, zp_y, dtype)
    diff = np.abs(got.astype(np.int64) - want)
    assert diff.max() <= 1 and (diff == 0).mean() > 0.98


def test_avgpool_int_form() -> None:
    rng = np.random.default_rng(1)
    k, s_x, s_y, zp_x, zp_y = 4, 0.03, 0.02, 12, -7
    x = _windows(rng, k, 3000, -128, 127)
    m, r = tpu_multiplier_rshift(s_x / (s_y * k))
    got = avgpool_int(x.sum(axis=1), k, zp_x, zp_y, int(m), int(r), np.int8)
    exact = (x - zp_x).sum(axis=1) * (s_x / (s_y * k))
    want = np.clip(np.floor(exact + 0.5) + zp_y, -128, 127)  # half up, like the shift
    assert np.array_equal(got, want)


def test_add_float_is_qdq_semantics() -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, 500).astype(np.uint8)
    b = rng.integers(0, 256, 500).astype(np.uint8)
    got = add_float(a, 0.02, 128, b, 0.03, 100, 0.045, 110, np.uint8)
    want = quantize(dequantize(a, 0.02, 128) + dequantize(b, 0.03, 100), 0.045, 110, np.uint8)
    assert np.array_equal(got, want)


def test_add_symmetric_int16() -> None:
    s_a, s_b, s_y = 0.02, 0.035, 0.05
    m_a, m_b, r = add_multipliers(s_a, s_b, s_y)
    assert max(abs(m_a), abs(m_b)) <= 127
    assert abs(m_a / 2**r - s_a / s_y) <= 2 ** -(r + 1)
    assert abs(m_b / 2**r - s_b / s_y) <= 2 ** -(r + 1)
    assert max(m_a, m_b) * 2 > 127  # the largest shift that fits
    a = np.arange(-128, 128).repeat(256)
    b = np.tile(np.arange(-128, 128), 256)
    got = add_int16(a, b, m_a, m_b, r, np.int8)
    real = (a * s_a + b * s_b) / s_y
    assert np.abs(got - np.clip(real, -128, 127)).max() <= 1.5  # multiplier + rounding error
    exact_int = np.clip(np.floor((a * m_a + b * m_b) / 2**r + 0.5), -128, 127)
    assert np.array_equal(got, exact_int)
    with pytest.raises(ValueError, match="do not fit"):
        add_multipliers(1.0, 300.0, 1.0)


def test_leaky_relu_int() -> None:
    alpha = 0.1
    m, r = tpu_multiplier_rshift(alpha, bits=8)
    x = np.arange(-128, 128)
    got = leaky_relu_int(x, -3, -3, int(m), int(r), np.int8)
    d = x + 3
    want = np.where(d >= 0, d, np.floor(d * int(m) / 2 ** int(r) + 0.5)) - 3
    assert np.array_equal(got, np.clip(want, -128, 127))
    real = np.where(d >= 0, d, alpha * d) - 3  # S_x == S_y: compare in units of the scale
    assert np.abs(got - np.clip(real, -128, 127)).max() <= 1


def test_prelu_int_per_channel() -> None:
    rng = np.random.default_rng(3)
    q_alpha = np.array([3, 25, 100])  # alpha_c = S_alpha * q_alpha[c], S_alpha = 1/128
    m, r = tpu_multiplier_rshift(1 / 128, bits=8)
    x = rng.integers(0, 256, size=(2, 3, 7))
    got = prelu_int(x, q_alpha, 128, 128, int(m), int(r), np.uint8, axis=1)
    d = x - 128
    neg = np.floor(d * q_alpha[None, :, None] * int(m) / 2 ** int(r) + 0.5)
    assert np.array_equal(got, np.clip(np.where(d >= 0, d, neg) + 128, 0, 255))


def test_pad_value() -> None:
    assert pad_value(0.0, 0.1, 17, np.uint8) == 17  # zero pads with the zero point
    assert pad_value(1.0, 0.1, 17, np.uint8) == 27
    assert pad_value(-0.625, 0.25, 0, np.int8) == -3  # -2.5 rounds away from zero
    assert pad_value(-0.625, 0.25, 0, np.int8, Rounding.HALF_EVEN) == -2
    assert pad_value(1e6, 0.1, 0, np.int8) == 127
