"""Requantization schemes: TFLite D1/D2/F2 against plain-Python-int references, the SNPS-Caffe QUANTIZED_OP.md
selector, oneDNN / TPU-MLIR formulas, and every scheme against the exact real result.

The TFLite references are independent of runtime.numerics: Python floats for the double
multiplier (numpy float32 scalars only for F2's float arithmetic), fractions for exact rounding,
one element at a time.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numerics_refs import I32_MAX, I32_MIN, half_away
from numerics_refs import ref_quantize_multiplier as ref_multiplier

from qfuse.runtime.numerics import (
    Rounding,
    Scheme,
    requantize,
    requantize_onednn,
    requantize_tpu_mlir,
    tflite_scheme,
    tpu_multiplier_rshift,
)


def ref_tflite(acc: int, bias: int, s_in: float, s_w: float, s_out: float, zp: int,
               lo: int, hi: int, variant: str) -> int:  # fmt: skip
    if variant == "F2":
        real = float((np.float32(s_in) * np.float32(s_w)) / np.float32(s_out))
    else:
        real = float(np.float32(s_in)) * float(np.float32(s_w)) / float(np.float32(s_out))
    q, shift = ref_multiplier(real)
    x = (acc + bias + 2**31) % 2**32 - 2**31  # int32 wrap
    if variant == "D1":
        y = math.floor(Fraction(x * q, 2 ** (31 - shift)) + Fraction(1, 2))
    else:
        xl = (x * 2 ** max(shift, 0) + 2**31) % 2**32 - 2**31
        if xl == q == I32_MIN:
            high = I32_MAX
        else:
            ab = xl * q
            s = ab + (2**30 if ab >= 0 else 1 - 2**30)
            high = s // 2**31 if s >= 0 else -((-s) // 2**31)
        y = half_away(Fraction(high, 2 ** max(-shift, 0)))
    return min(max(y + zp, lo), hi)


def f32s(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Float32 values in [lo, hi] (as Python floats)."""
    return st.floats(lo, hi).map(lambda v: float(np.float32(v)))


VARIANTS = {"D1": Scheme.TFLITE_D1, "D2": Scheme.TFLITE_D2, "F2": Scheme.TFLITE_F2}


def _check_tflite(acc, bias, s_in, s_w, s_out, zp, dtype, variant):
    lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
    got = requantize(
        np.array(acc, dtype=np.int64).reshape(1, -1),
        scheme=VARIANTS[variant],
        s_in=s_in,
        s_w=s_w,
        s_out=s_out,
        zp_out=zp,
        dtype=dtype,
        bias=bias,
        axis=1,
    )[0]
    sw = np.broadcast_to(np.asarray(s_w, np.float32), (len(acc),))
    bb = np.broadcast_to(np.asarray(0 if bias is None else bias), (len(acc),))
    want = [
        ref_tflite(int(a), int(b), s_in, float(w), s_out, zp, lo, hi, variant)
        for a, b, w in zip(acc, bb, sw, strict=True)
    ]
    assert got.tolist() == want


@pytest.mark.parametrize("variant", ["D1", "D2", "F2"])
def test_tflite_edges(variant: str) -> None:
    acc = [I32_MIN, I32_MIN + 1, -(2**30), -1001, -3, -2, -1, 0, 1, 2, 3, 1001, 2**30, I32_MAX]
    for s_in, s_w, s_out in [(0.5, 1.0, 1.0), (0.5, 1.0, 2.0), (0.02, 0.003, 0.1),
                             (1.0, 1.0, 1.0), (0.7, 0.9, 0.1), (1e-4, 1e-4, 0.5)]:  # fmt: skip
        for dtype, zp in [(np.uint8, 128), (np.int8, -5), (np.int32, 0)]:
            _check_tflite(acc, None, s_in, s_w, s_out, zp, dtype, variant)


def test_tflite_ties_differ_between_one_and_two_roundings() -> None:
    """M = 1/4 (q = 2**30, shift = -1). True values -0.5, -0.25, 0.5, 0.75:
    D1 rounds once, half toward +inf; D2 rounds acc/2 half-up, then halves again half-away."""
    acc = np.array([[-2, -1, 2, 3]])
    kw = {"s_in": 0.25, "s_w": 1.0, "s_out": 1.0, "zp_out": 0, "dtype": np.int32}
    assert requantize(acc, scheme=Scheme.TFLITE_D1, **kw).tolist() == [[0, 0, 1, 1]]
    assert requantize(acc, scheme=Scheme.TFLITE_D2, **kw).tolist() == [[-1, 0, 1, 1]]
    # ONNX Runtime / oneDNN round half to even in float: -0.5 -> 0, 0.5 -> 0.
    assert requantize(acc, scheme=Scheme.ONNXRUNTIME, **kw).tolist() == [[0, 0, 0, 1]]
    assert requantize(acc, scheme=Scheme.ONEDNN, **kw).tolist() == [[0, 0, 0, 1]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(I32_MIN, I32_MAX), min_size=1, max_size=8),
    f32s(1e-4, 1.0),
    f32s(1e-4, 1.0),
    f32s(1e-4, 10.0),
    st.sampled_from(["D1", "D2", "F2"]),
    st.integers(-128, 127),
)
def test_tflite_random_extreme_acc(acc, s_in, s_w, s_out, variant, zp) -> None:
    _check_tflite(acc, None, s_in, s_w, s_out, zp, np.int8, variant)


@settings(max_examples=200, deadline=None)
@given(
    st.data(),
    st.integers(1, 6),
    f32s(1e-3, 0.1),
    f32s(1e-3, 0.5),
    st.sampled_from(["D1", "D2", "F2"]),
)
def test_tflite_random_per_channel(data, c, s_in, s_out, variant) -> None:
    """Realistic accumulators (|acc| < 2**20) with per-channel weight scales and a bias."""
    acc = data.draw(st.lists(st.integers(-(2**20), 2**20), min_size=c, max_size=c))
    s_w = np.array(data.draw(st.lists(f32s(1e-4, 0.05), min_size=c,
                                      max_size=c)), np.float32)  # fmt: skip
    bias = np.array(data.draw(st.lists(st.integers(-(2**16), 2**16), min_size=c, max_size=c)))
    zp = data.draw(st.integers(0, 255))
    _check_tflite(acc, bias, s_in, s_w, s_out, zp, np.uint8, variant)


def test_tflite_selector_matches_seed_001() -> None:
    table = {
        (False, "regular"): Scheme.TFLITE_D2,
        (False, "depthwise"): Scheme.TFLITE_F2,
        (False, "pointwise"): Scheme.TFLITE_F2,
        (True, "regular"): Scheme.TFLITE_D1,
        (True, "depthwise"): Scheme.TFLITE_D2,
        (True, "pointwise"): Scheme.TFLITE_D1,
    }
    for (per_channel, kind), scheme in table.items():
        assert tflite_scheme(per_channel, kind) is scheme
    with pytest.raises(ValueError, match="conv kind"):
        tflite_scheme(True, "grouped")  # type: ignore[arg-type]


def test_caffe2_is_f2() -> None:
    acc = np.random.default_rng(1).integers(-(2**20), 2**20, size=(4, 3, 5))
    kw = {"s_in": 0.013, "s_w": np.array([0.002, 0.004, 0.0011]), "s_out": 0.07,
          "zp_out": 3, "dtype": np.int8}  # fmt: skip
    assert np.array_equal(
        requantize(acc, scheme=Scheme.CAFFE2, **kw), requantize(acc, scheme=Scheme.TFLITE_F2, **kw)
    )


# --- every scheme against the exact real result ----------------------------------------------


@pytest.mark.parametrize("scheme", list(Scheme))
def test_all_schemes_within_one_lsb_of_exact(scheme: Scheme) -> None:
    rng = np.random.default_rng(5)
    acc = rng.integers(-(2**18), 2**18, size=(3, 8, 20))
    bias = rng.integers(-5000, 5000, size=8)
    s_in, s_out = np.float32(0.021), np.float32(0.173)
    s_w = rng.uniform(0.001, 0.01, size=8).astype(np.float32)
    got = requantize(acc, scheme=scheme, s_in=s_in, s_w=s_w, s_out=s_out, zp_out=7,
                     dtype=np.int8, bias=bias)  # fmt: skip
    assert got.dtype == np.int8 and got.shape == acc.shape
    real = (acc + bias[:, None]) * (float(s_in) * s_w.astype(np.float64)[:, None] / float(s_out))
    exact = np.clip(np.rint(real) + 7, -128, 127)
    diff = np.abs(got.astype(np.int64) - exact)
    assert diff.max() <= 1
    assert (diff == 0).mean() > 0.99


def test_requantize_validates() -> None:
    acc = np.zeros((1, 2))
    kw = {"s_in": 0.1, "s_w": 0.1, "s_out": 0.1, "dtype": np.uint8}
    with pytest.raises(ValueError, match="zp_out"):
        requantize(acc, scheme=Scheme.ONNXRUNTIME, zp_out=300, **kw)
    with pytest.raises(ValueError, match="s_out must be finite and > 0"):
        requantize(acc, scheme=Scheme.TFLITE_D2, zp_out=0, **{**kw, "s_out": 0.0})
    with pytest.raises(ValueError, match="s_w must be finite and > 0"):
        requantize(acc, scheme=Scheme.ONEDNN, zp_out=0, **{**kw, "s_w": [0.1, np.nan]})


# --- oneDNN ----------------------------------------------------------------------------------


def test_onednn_formula() -> None:
    rng = np.random.default_rng(2)
    acc = rng.integers(-(2**20), 2**20, size=(2, 4, 6))
    s_in, s_out = np.float32(0.017), np.float32(0.31)
    s_w = rng.uniform(0.001, 0.02, size=4).astype(np.float32)
    bias_f32 = rng.normal(0, 3, size=4).astype(np.float32)
    got = requantize_onednn(acc, s_in, s_w, s_out, 100, np.uint8, bias_f32=bias_f32,
                            post_ops=lambda x: np.maximum(x, np.float32(0)))  # fmt: skip
    scale = (s_in * s_w)[None, :, None]
    x = acc.astype(np.float32) * scale + bias_f32[None, :, None]
    x = np.maximum(x, np.float32(0))
    y = np.rint(x * (np.float32(1) / s_out) + np.float32(100))
    assert np.array_equal(got, np.clip(y, 0, 255))


def test_onednn_int_bias_is_dequantized_with_the_combined_scale() -> None:
    acc = np.array([[10, -10]])
    bias = np.array([1000, -3])
    s_in, s_w = np.float32(0.5), np.float32(0.25)
    a = requantize_onednn(acc, s_in, s_w, 1.0, 0, np.int8, bias=bias)
    b = requantize_onednn(acc, s_in, s_w, 1.0, 0, np.int8, bias_f32=bias * (s_in * s_w))
    assert np.array_equal(a, b)


def test_onednn_zero_point_added_in_float_before_rounding() -> None:
    """x/s_dst just above a tie: f32(x/s + zp) lands on the tie and rounds to even."""
    v = np.float32(0.5) + np.float32(2.0**-20)  # x * (1/s_out) with s_out = 1
    acc = np.array([[1]])
    in_float = requantize_onednn(acc, v, 1.0, 1.0, 128, np.uint8)
    after = requantize_onednn(acc, v, 1.0, 1.0, 128, np.uint8, dst_zp_in_float=False)
    assert in_float.tolist() == [[128]] and after.tolist() == [[129]]


def test_onednn_nan_saturation() -> None:
    acc = np.array([[1, 1]])
    nan = lambda x: x * np.float32(np.nan)
    assert requantize_onednn(acc, 1.0, 1.0, 1.0, 0, np.int8, post_ops=nan).tolist() == [[127, 127]]
    assert requantize_onednn(acc, 1.0, 1.0, 1.0, 5, np.uint8, post_ops=nan).tolist() == [[0, 0]]


# --- TPU-MLIR --------------------------------------------------------------------------------


def test_tpu_mlir_rounds_shift_half_up() -> None:
    acc = np.array([[-3, -1, 1, 3, 5]])  # * 1 >> 1: -1.5, -0.5, 0.5, 1.5, 2.5
    up = requantize_tpu_mlir(acc, 1, 1, 0, np.int8)
    assert up.tolist() == [[-1, 0, 1, 2, 3]]
    away = requantize_tpu_mlir(acc, 1, 1, 0, np.int8, rounding=Rounding.HALF_AWAY)
    assert away.tolist() == [[-2, -1, 1, 2, 3]]


def test_tpu_mlir_generic_matches_explicit_search_multipliers() -> None:
    rng = np.random.default_rng(4)
    acc = rng.integers(-(2**22), 2**22, size=(2, 3, 10))
    bias = np.array([100, -2000, 7])
    s_w = np.array([0.004, 0.0021, 0.013], np.float32)
    scale = (np.float64(np.float32(0.02)) * s_w.astype(np.float64)) / np.float64(np.float32(0.9))
    m, r = tpu_multiplier_rshift(scale, 32, "search")
    want = np.empty_like(acc)
    for c in range(3):
        v = (acc[:, c] + int(bias[c])) * int(m[c])
        want[:, c] = np.floor_divide(v + (1 << (int(r[c]) - 1)), 1 << int(r[c]))
    want = np.clip(want - 3, -128, 127)
    got = requantize(acc, scheme=Scheme.TPU_MLIR, s_in=0.02, s_w=s_w, s_out=0.9, zp_out=-3,
                     dtype=np.int8, bias=bias)  # fmt: skip
    assert np.array_equal(got, want)
