"""Quantization error statistics (Caffe2 measure_quantization_error plus SQNR and LSB)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qfuse.runtime.numerics import ErrorStats, dequantize, quantization_error, quantize


def test_known_values() -> None:
    ref = np.array([3.0, 4.0])
    approx = np.array([3.0, 4.5])
    e = quantization_error(ref, approx, scale=0.25)
    assert e.sum_sq == 25.0 and e.sum_err_sq == 0.25
    assert e.l2_error == 0.5
    assert e.relative_l2 == 0.1  # sqrt(0.25) / sqrt(25)
    assert e.sqnr_db == pytest.approx(20.0)  # 10 log10(25 / 0.25)
    assert e.max_abs_error == 0.5 and e.max_error_ref == 4.0 and e.max_error_actual == 4.5
    assert e.max_error_lsb == 2.0
    assert e.count == 1 and e.elements == 2
    assert "l2 relative error 0.1" in e.summary()


def test_equal_and_zero_reference() -> None:
    e = quantization_error([1.0, -2.0], [1.0, -2.0])
    assert e.sqnr_db == math.inf and e.relative_l2 == 0.0 and e.max_error_lsb is None
    z = quantization_error([0.0, 0.0], [0.0, 0.1])
    assert math.isnan(z.relative_l2) and z.sqnr_db == -math.inf
    both = quantization_error([0.0], [0.0])
    assert both.sqnr_db == math.inf and math.isnan(both.relative_l2)


def test_per_channel_lsb_and_merge() -> None:
    ref = np.zeros((2, 3))
    approx = np.array([[0.1, 0.2, 0.0], [0.0, 0.0, 0.3]])
    scale = np.array([0.1, 0.1, 0.3])
    e = quantization_error(ref, approx, scale)
    assert e.max_error_lsb == pytest.approx(2.0)  # 0.2 / 0.1 beats 0.3 / 0.3
    assert e.max_abs_error == pytest.approx(0.3)
    m = e.merge(quantization_error([1.0], [1.5], 0.5))
    assert isinstance(m, ErrorStats)
    assert m.count == 2 and m.elements == 7
    assert m.max_abs_error == 0.5 and m.max_error_ref == 1.0
    assert m.sum_err_sq == pytest.approx(e.sum_err_sq + 0.25)


def test_uniform_quantization_noise_sqnr() -> None:
    """Rounding to a step s adds error uniform in [-s/2, s/2]: variance s**2/12."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 200000).astype(np.float32)
    s = np.float32(2 / 255)
    e = quantization_error(x, dequantize(quantize(x, s, 0, np.int8), s), s)
    assert e.max_error_lsb <= 0.5 + 1e-6
    want = 10 * np.log10((1 / 3) / (float(s) ** 2 / 12))  # signal power 1/3
    assert e.sqnr_db == pytest.approx(want, abs=0.1)


def test_validation() -> None:
    with pytest.raises(ValueError, match="shape"):
        quantization_error(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="empty"):
        quantization_error(np.zeros(0), np.zeros(0))
    with pytest.raises(ValueError, match="scale"):
        quantization_error(np.zeros(3), np.zeros(3), scale=0.0)
