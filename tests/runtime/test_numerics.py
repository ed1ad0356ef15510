"""Rounding modes, saturation, and ONNX QuantizeLinear / DequantizeLinear."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qfuse.runtime.numerics import (
    Rounding,
    dequantize,
    dtype_range,
    quantize,
    round_half_away,
    round_half_even,
    round_half_up,
    round_with,
    saturate,
    shift_right_round,
)

TIES = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]


@pytest.mark.parametrize("ftype", [np.float32, np.float64])
def test_rounding_on_ties(ftype: type) -> None:
    x = np.array(TIES, dtype=ftype)
    assert round_half_even(x).tolist() == [-2, -2, 0, 0, 2, 2]
    assert round_half_away(x).tolist() == [-3, -2, -1, 1, 2, 3]
    assert round_half_up(x).tolist() == [-2, -1, 0, 1, 2, 3]
    for fn in (round_half_even, round_half_away, round_half_up):
        assert fn(x).dtype == ftype  # computed in the input's precision


def test_round_with_dispatches() -> None:
    x = np.array(TIES)
    assert np.array_equal(round_with(x, Rounding.HALF_EVEN), np.rint(x))
    assert np.array_equal(round_with(x, Rounding.HALF_AWAY), round_half_away(x))
    assert np.array_equal(round_with(x, Rounding.HALF_UP), np.floor(x + 0.5))


def test_non_ties_round_to_nearest() -> None:
    x = np.array([-1.6, -1.4, -0.4, 0.4, 0.6, 1.4, 2.6])
    want = [-2, -1, 0, 0, 1, 1, 3]
    for fn in (round_half_even, round_half_away, round_half_up):
        assert fn(x).tolist() == want


@pytest.mark.parametrize(
    ("below_half", "ftype"),
    [(np.nextafter(np.float32(0.5), np.float32(0)), np.float32), (np.nextafter(0.5, 0.0), float)],
)
def test_just_below_half(below_half: float, ftype: type) -> None:
    """floor(x + 0.5) rounds the float below 0.5 up: x + 0.5 is a tie in that precision."""
    x = np.array([below_half, -below_half], dtype=ftype)
    assert round_half_up(x).tolist() == [0, 0]
    assert round_half_away(x).tolist() == [0, 0]
    assert round_half_up(x, naive=True).tolist() == [1, 0]
    assert round_half_away(x, naive=True).tolist() == [1, -1]


@given(st.floats(-1e6, 1e6, allow_nan=False, width=32))
def test_rounding_matches_definitions_float32(v: float) -> None:
    x = np.float32(v)
    floor, frac = np.floor(np.float64(x)), np.float64(x) - np.floor(np.float64(x))
    up = floor + (frac >= 0.5)
    assert round_half_up(x) == up
    away = np.sign(x) * np.floor(abs(np.float64(x)) + 0.5)  # exact in float64 for float32 x
    assert round_half_away(x) == away
    assert round_half_even(x) == np.rint(np.float64(x))


def test_dtype_range() -> None:
    assert dtype_range(np.uint8) == (0, 255)
    assert dtype_range("s8") == (-128, 127)
    assert dtype_range("s32") == (-(2**31), 2**31 - 1)
    assert dtype_range(np.int16) == (-32768, 32767)
    with pytest.raises(ValueError, match="unsupported quantized dtype"):
        dtype_range(np.float32)
    with pytest.raises(ValueError, match="unknown quantized dtype|unsupported"):
        dtype_range("u7")


def test_saturate_edges_and_nan() -> None:
    v = np.array([-1e12, -129, -128, 0, 127, 128, 255, 256, 1e12, np.inf, -np.inf, np.nan])
    assert saturate(v, np.int8).tolist() == [-128, -128, -128, 0, 127, 127, 127, 127, 127, 127,
                                             -128, -128]  # fmt: skip
    assert saturate(v, np.uint8).tolist() == [0, 0, 0, 0, 127, 128, 255, 255, 255, 255, 0, 0]
    assert saturate(np.array([np.nan]), np.int8, nan=127).tolist() == [127]
    big = np.array([-(2**40), -(2**31) - 1, 2**31, 2**40], dtype=np.int64)
    assert saturate(big, "s32").tolist() == [-(2**31), -(2**31), 2**31 - 1, 2**31 - 1]
    with pytest.raises(ValueError, match="outside"):
        saturate(np.array([np.nan]), np.uint8, nan=-1)


@pytest.mark.parametrize("mode", list(Rounding))
def test_shift_right_round_matches_float_rounding(mode: Rounding) -> None:
    x = np.arange(-4096, 4097, dtype=np.int64)
    for n in (1, 2, 5):
        want = round_with(x / 2.0**n, mode)  # exact in float64
        assert np.array_equal(shift_right_round(x, n, mode), want)
    assert np.array_equal(shift_right_round(x, 0, mode), x)
    assert np.array_equal(shift_right_round(x, -3, mode), x * 8)


def test_shift_right_round_per_channel() -> None:
    x = np.array([[6, 6, 6], [-6, -6, -6]], dtype=np.int64)
    got = shift_right_round(x, np.array([1, 2, 3]), Rounding.HALF_UP)
    assert got.tolist() == [[3, 2, 1], [-3, -1, -1]]


# --- QuantizeLinear / DequantizeLinear -------------------------------------------------------


def test_quantize_ties_to_even_with_zero_point() -> None:
    x = np.array(TIES, dtype=np.float32) * 0.5  # x / 0.5 are the ties
    assert quantize(x, 0.5, 3, np.uint8).tolist() == [1, 1, 3, 3, 5, 5]
    assert quantize(x, 0.5, -3, np.int8).tolist() == [-5, -5, -3, -3, -1, -1]


def test_quantize_saturation_and_nan() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 127.4, 127.6], dtype=np.float32)
    assert quantize(x, 1.0, 0, np.int8).tolist() == [-128, 127, -128, 127, -128, 127, 127]
    assert quantize(x, 1.0, 128, np.uint8).tolist() == [0, 255, 0, 255, 0, 255, 255]


def test_quantize_divides_in_float32() -> None:
    """x / s and x * (1/s) differ on some float32 values; QuantizeLinear divides."""
    s = np.float32(0.013)
    x = np.random.default_rng(0).uniform(-300, 300, 50000).astype(np.float32)
    div = np.rint(x / s)
    mul = np.rint(x * (np.float32(1) / s))
    assert (div != mul).any()
    q = quantize(x, s, 0, np.int32)
    assert np.array_equal(q, div.astype(np.int32))


def test_quantize_per_axis() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10
    s = np.array([0.5, 1.0, 2.0], dtype=np.float32)
    zp = np.array([1, 2, 3], dtype=np.int8)
    q = quantize(x, s, zp, np.int8, axis=1)
    want = np.clip(np.rint(x / s[None, :, None]) + zp[None, :, None], -128, 127)
    assert np.array_equal(q, want)
    assert np.array_equal(quantize(x, s, zp, np.int8), q)  # ONNX default axis is 1
    back = dequantize(q, s, zp, axis=1)
    assert back.dtype == np.float32
    assert np.array_equal(back, (q.astype(np.float32) - zp[None, :, None]) * s[None, :, None])
    q2 = quantize(x, np.array([0.5, 1.0, 2.0, 4.0], np.float32), 0, np.int8, axis=-1)
    assert q2.shape == x.shape
    with pytest.raises(ValueError, match="must have 3 values"):
        quantize(x, np.ones(4, np.float32), 0, np.int8, axis=1)


@pytest.mark.parametrize("bad", [0.0, -0.1, np.nan, np.inf, -np.inf])
def test_bad_scale_raises(bad: float) -> None:
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        quantize(np.zeros(3, np.float32), bad, 0, np.uint8)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        dequantize(np.zeros(3, np.uint8), np.array([1.0, bad, 1.0]), 0, axis=0)


@pytest.mark.parametrize(("zp", "dtype"), [(256, np.uint8), (-1, np.uint8), (128, np.int8),
                                           (-129, np.int8), (1.5, np.uint8)])  # fmt: skip
def test_bad_zero_point_raises(zp: float, dtype: type) -> None:
    with pytest.raises(ValueError, match="zero_point"):
        quantize(np.zeros(3, np.float32), 0.1, zp, dtype)


def test_dequantize_s32_bias() -> None:
    q = np.array([-(2**31), -5, 0, 2**24 + 1, 2**31 - 1], dtype=np.int32)
    got = dequantize(q, np.float32(0.25))
    want = q.astype(np.int64).astype(np.float32) * np.float32(0.25)  # 2**24 + 1 rounds in f32
    assert np.array_equal(got, want)
    assert got[3] == np.float32(2**24) * np.float32(0.25)


def _qdq_session(per_axis: bool, dtype: type):
    tp = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    s = np.array([0.013, 0.5, 0.0071], np.float32) if per_axis else np.float32(0.013)
    z = np.array([0, 17, 120], dtype) if per_axis else np.array(100 if dtype == np.uint8 else -7,
                                                                 dtype)  # fmt: skip
    inits = [numpy_helper.from_array(np.asarray(s), "s"), numpy_helper.from_array(z, "z")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 50])],
        [
            helper.make_tensor_value_info("q", tp, None),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess, s, z


@pytest.mark.parametrize("per_axis", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_dequantize_match_onnxruntime(per_axis: bool, dtype: type) -> None:
    sess, s, z = _qdq_session(per_axis, dtype)
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1.5, size=(4, 3, 50)).astype(np.float32)
    ties = (np.arange(50, dtype=np.float32) - 25 + np.float32(0.5)) * np.asarray(s).reshape(-1)[0]
    x[0, 0] = ties  # exact ties for the first channel's scale
    x[1, 0, :4] = [np.nan, np.inf, -np.inf, 1e9]
    q_ort, y_ort = sess.run(None, {"x": x})
    q = quantize(x, s, z, dtype, axis=1)
    assert np.array_equal(q, q_ort)
    y = dequantize(q, s, z, axis=1)
    assert np.array_equal(y, y_ort)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-300, 300, allow_nan=False, width=32), min_size=1, max_size=40),
    st.floats(1 / 1024, 10, width=32),
    st.integers(0, 255),
)
def test_quantize_matches_formula(xs: list[float], scale: float, zp: int) -> None:
    x = np.array(xs, dtype=np.float32)
    q = quantize(x, scale, zp, np.uint8)
    want = np.clip(np.rint(x / np.float32(scale)).astype(np.float64) + zp, 0, 255)
    assert np.array_equal(q, want)
    # Q -> DQ -> Q is idempotent.
    assert np.array_equal(quantize(dequantize(q, scale, zp), scale, zp, np.uint8), q)
