"""decompose_fake_quantize: float FakeQuantize → quantize-only FakeQuantize + DequantizeLinear.

Numerics: the level k is computed by the same float32 expression before and after (il, ih
and L are kept), so the integer output q = k + ol' is exact and the dequantized output
So·(q - zp) differs from the FakeQuantize's k/(L-1)·(oh - ol) + ol by float32 rounding only:
asserted here as the same level everywhere and |diff| <= 1e-4·So. For pairs that came from
Q/DQ the DequantizeLinear is ONNX's own (same scale and zero point): bit-exact with the
original DQ given the same q.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_helpers import (
    F32,
    add,
    apply,
    fake_quantize,
    finish,
    new_graph,
    ops,
    qdq,
    reasons,
    reference,
)

import qfuse.passes.decompose_fake_quantize as D
import qfuse.passes.qdq_to_fake_quantize as P
from qfuse.ir import DType, Op
from qfuse.runtime.numerics import step_diff


def _decomposed(g):
    """(quantize-only FQ node, its dtype/quant, the DQ node) after the pass."""
    dq = g.producer(g.outputs[0])
    assert dq.op is Op.DEQUANTIZE_LINEAR
    q = g.producer(dq.inputs[0])
    info = g.info(q.outputs[0])
    return q, info, dq


def _check_numerics(before, after, step: float, seed: int = 0, spread: float = 3.0) -> None:
    rng = np.random.default_rng(seed)
    shape = before.info("x").shape
    x = (rng.standard_normal(shape) * spread).astype(F32)
    b, a = reference(before, {"x": x})["y"], reference(after, {"x": x})["y"]
    most, same = step_diff(a, b, step)
    assert same == 1.0 and most == 0
    assert float(np.max(np.abs(a - b))) <= 1e-4 * step


@pytest.mark.parametrize("dtype,zp", [(DType.U8, 113), (DType.U8, 0), (DType.S8, 0),
                                      (DType.S8, -7), (DType.U8, 128)])
def test_from_qdq_recovers_type_scale_and_zero_point(dtype, zp):
    g = new_graph((1, 3, 4, 4))
    qdq(g, "x", "y", 0.0213, zp, dtype)
    finish(g, "y")
    apply(P, g)
    before = g.copy()
    result = apply(D, g)
    assert result.changed == 1 and not result.declined
    assert ops(g) == ["FakeQuantize", "DequantizeLinear"]
    q, info, dq = _decomposed(g)
    assert info.dtype is dtype and info.quant.scale == (float(F32(0.0213)),)
    assert info.quant.zero_point == (zp,)
    lo, hi = dtype.range
    assert g.constant(q.inputs[3]) == lo and g.constant(q.inputs[4]) == hi
    assert g.constant(dq.inputs[1]) == F32(0.0213) and g.constant(dq.inputs[2]) == zp
    assert q.name == "y_q" and q.outputs[0] == "y_q"  # ONNX Runtime's Q names come back
    _check_numerics(before, g, 0.0213)


@pytest.mark.parametrize("il,ih,levels,dtype,zp,q_low", [
    (0.0, 2.55, 256, DType.U8, 0, 0),            # ReLU range
    (-1.27, 1.27, 255, DType.S8, 0, -127),       # symmetric, 255 levels
    (-1.28, 1.27, 256, DType.S8, 0, -128),       # symmetric, 256 levels
    (-0.5, 2.05, 256, DType.U8, 50, 0),          # asymmetric, integral zero point
    (0.0, 1.5, 16, DType.S8, 0, 0),              # 4-bit levels fit s8 at zp 0
])
def test_general_fake_quantize(il, ih, levels, dtype, zp, q_low):
    g = new_graph((2, 5))
    fake_quantize(g, "x", "y", F32(il), F32(ih), F32(il), F32(ih), levels)
    finish(g, "y")
    before = g.copy()
    assert apply(D, g).changed == 1
    q, info, _ = _decomposed(g)
    assert info.dtype is dtype and info.quant.zero_point == (zp,)
    assert g.constant(q.inputs[3]) == q_low and g.constant(q.inputs[4]) == q_low + levels - 1
    _check_numerics(before, g, (ih - il) / (levels - 1))


def test_per_channel_ranges():
    g = new_graph((1, 3, 2, 2))
    ih = np.array([1.0, 2.0, 2.55], F32).reshape(1, 3, 1, 1)
    fake_quantize(g, "x", "y", F32(0), ih, F32(0), ih)
    finish(g, "y")
    before = g.copy()
    assert apply(D, g).changed == 1
    _, info, dq = _decomposed(g)
    assert info.dtype is DType.U8 and info.quant.axis == 1
    np.testing.assert_allclose(info.quant.scale, ih.ravel() / 255, rtol=1e-6)
    assert dq.attrs.axis == 1
    _check_numerics(before, g, float(ih.min()) / 255)


@pytest.mark.parametrize("case,want", [
    ("zero_point", "integer zero point"),
    ("levels", "does not fit 8 bits"),
    ("inverted", "input_low >= input_high"),
    ("decreasing", "output_high <= output_low"),
    ("inexact", "not exact in float32"),
    ("two_axes", "more than one axis"),
    ("too_wide", "fits neither u8 nor s8"),
])
def test_declined_with_reason(case, want):
    g = new_graph((1, 3, 2))
    il, ih, ol, oh, levels = F32(-1), F32(1), F32(-1), F32(1), 256
    if case == "zero_point":
        il, ol = F32(-0.013), F32(-0.013)
    if case == "levels":
        levels = 1024
    if case == "inverted":
        il, ih = F32(1), F32(-1)
    if case == "decreasing":
        ol, oh = F32(1), F32(-1)
    if case == "inexact":
        levels = 14
        il, ih, ol, oh = F32(0), F32(13), F32(0), F32(13)
    if case == "two_axes":
        ih = np.full((1, 3, 2), 1.0, F32)
    if case == "too_wide":  # 256 levels starting at 300: q would need zp = -300
        il, ih, ol, oh = F32(300), F32(555), F32(300), F32(555)
    fake_quantize(g, "x", "y", il, ih, ol, oh, levels)
    finish(g, "y")
    result = apply(D, g)
    assert result.changed == 0 and ops(g) == ["FakeQuantize"]
    assert len(result.declined) == 1 and want in reasons(result)[0], reasons(result)


def test_constant_input_and_quantize_only_are_skipped():
    g = new_graph((1, 4))
    g.add_constant("w", np.linspace(-1, 1, 4, dtype=F32).reshape(1, 4))
    fake_quantize(g, "w", "wq", F32(-1), F32(1), F32(-1), F32(1), 255)
    add(g, Op.ADD, ["x", "wq"], "y")
    finish(g, "y")
    result = apply(D, g)
    assert result.changed == 0 and not result.declined


def test_quantize_only_output_is_integral_and_idempotent():
    g = new_graph((1, 3, 4, 4))
    qdq(g, "x", "y", 0.05, 17)
    finish(g, "y")
    apply(P, g)
    apply(D, g)
    again = apply(D, g)
    assert again.changed == 0 and not again.declined
    values = reference(g, {"x": np.random.default_rng(0).standard_normal((1, 3, 4, 4))
                           .astype(F32) * 5}, keep=True)
    q = values[g.producer("y").inputs[0]]
    assert q.dtype == np.uint8 and q.min() == 0  # saturates at qmin


@settings(max_examples=60, deadline=None)
@given(scale=st.floats(2.0 ** -13, 8.0, width=32), zp=st.integers(-128, 255),
       signed=st.booleans(), seed=st.integers(0, 2**16))
def test_roundtrip_through_both_passes(scale, zp, signed, seed):
    """Any Q/DQ → FakeQuantize → quantize-only FQ + DQ with the same type, scale, zp (s8 with
    zero point -128: u8 with zero point 0, the same values + 128, tests/passes/
    test_zero_level.py)."""
    dtype = DType.S8 if signed else DType.U8
    lo, hi = dtype.range
    zp = min(max(zp, lo), hi)
    g = new_graph((1, 64))
    qdq(g, "x", "y", scale, zp, dtype)
    finish(g, "y")
    apply(P, g)
    before = g.copy()
    assert apply(D, g).changed == 1
    _, info, _ = _decomposed(g)
    want = (DType.U8, 0) if (dtype, zp) == (DType.S8, -128) else (dtype, zp)
    assert (info.dtype, *info.quant.zero_point) == want
    assert info.quant.scale == (float(F32(scale)),)
    rng = np.random.default_rng(seed)
    x = (rng.uniform(lo - zp - 2, hi - zp + 2, (1, 64)) * F32(scale)).astype(F32)
    b, a = reference(before, {"x": x})["y"], reference(g, {"x": x})["y"]
    same = step_diff(a, b, float(F32(scale))).identical
    assert same == 1.0 and float(np.max(np.abs(a - b))) <= 1e-4 * float(F32(scale))
