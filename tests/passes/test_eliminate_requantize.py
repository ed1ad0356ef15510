"""eliminate_requantize: DQ → quantize-only FakeQuantize with the same parameters is dropped.

Exactness is checked two ways: the pass itself proves F(DQ(q)) = q by evaluating all 256
integers per channel (a pair that fails is declined), and hypothesis checks that this holds
for the FakeQuantize any Q/DQ pair gives (random scales over 2^-13..8, every zero point, u8
and s8) — the float32 argument in the module docstring, tested. Before/after: bit-exact.
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
    feeds,
    finish,
    int_input,
    ops,
    quantize,
    quantize_only,
    reasons,
    reference,
)

import qfuse.passes.eliminate_requantize as E
from qfuse.ir import DType, Op, QuantParams, TensorInfo
from qfuse.ir.ops import AxisAttrs
from qfuse.passes.qdq_to_fake_quantize import qdq_ranges
from qfuse.passes.quant_utils import DqParams

S, ZP = 0.05, 7


def _bit_exact(before, after) -> None:
    for seed in range(3):
        f = feeds(before, seed)
        b, a = reference(before, f), reference(after, f)
        for name in b:
            assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


def _pair(scale: float, zp: int, dtype: DType = DType.U8, extra_reader: bool = False,
          plain: bool = False):
    """DQ → a quantize-only FakeQuantize, or (``plain``) a QuantizeLinear left unconverted
    (quantize_static's second quantize of a Gemm output after its Reshape, which a GELU
    table reads), then a Flatten."""
    g, xd = int_input((1, 4, 3), S, ZP)
    (quantize if plain else quantize_only)(g, xd, "q2", scale, zp, dtype)
    add(g, Op.FLATTEN, ["q2"], "y", AxisAttrs(1))
    outs = ["y"]
    if extra_reader:
        add(g, Op.RELU, [xd], "r")
        outs.append("r")
    return finish(g, *outs)


@pytest.mark.parametrize("plain", [False, True], ids=["fake_quantize", "quantize_linear"])
def test_identical_pair_is_removed(plain: bool):
    g = _pair(S, ZP, plain=plain)
    before = g.copy()
    result = apply(E, g)
    assert result.changed == 1 and not result.declined
    assert ops(g) == ["Flatten"] and g.node("y").inputs == ["x"]
    _bit_exact(before, g)


def test_dequantize_with_other_readers_stays():
    g = _pair(S, ZP, extra_reader=True)
    before = g.copy()
    assert apply(E, g).changed == 1
    assert ops(g) == ["DequantizeLinear", "Flatten", "Relu"] and g.node("y").inputs == ["x"]
    _bit_exact(before, g)


@pytest.mark.parametrize("plain", [False, True], ids=["fake_quantize", "quantize_linear"])
@pytest.mark.parametrize("scale,zp,dtype", [(0.06, ZP, DType.U8), (S, 8, DType.U8),
                                            (S, ZP, DType.S8)])
def test_requantize_is_kept(scale, zp, dtype, plain: bool):
    g = _pair(scale, zp, dtype, plain=plain)
    result = apply(E, g)
    kept = "QuantizeLinear" if plain else "FakeQuantize"
    assert result.changed == 0 and ops(g) == ["DequantizeLinear", kept, "Flatten"]
    assert "requantize" in reasons(result)[0] and "one requantize kernel" in reasons(result)[0]


@settings(max_examples=200, deadline=None)
@given(scale=st.floats(2.0 ** -13, 8.0, width=32), zp=st.integers(-128, 255),
       signed=st.booleans())
def test_quantize_round_trip_for_any_parameters(scale, zp, signed):
    """ONNX's QuantizeLinear maps DequantizeLinear(q) back to q for any scale in range."""
    dtype = DType.S8 if signed else DType.U8
    zp = min(max(zp, dtype.range[0]), dtype.range[1])
    assert E._quantize_round_trip(dtype, (float(np.float32(scale)),), (zp,))


def test_same_parameters_but_other_ranges_declined():
    """A quantize-only FQ typed like the DQ whose ranges do not map DQ(q) back to q."""
    g, xd = int_input((1, 4), S, ZP)
    node = fake_quantize(g, xd, "q2", F32(0), F32(S * 100), F32(0), F32(255), 256)
    g.set_info("q2", TensorInfo((1, 4), DType.U8, QuantParams.make(S, ZP)))
    assert node.op is Op.FAKE_QUANTIZE
    result = apply(E, finish(g, "q2"))
    assert result.changed == 0 and "do not map DQ(q) back to q" in reasons(result)[0]


def test_per_channel_pair():
    scale, zp = np.array([0.1, 0.2, 0.3], F32), np.array([0, 5, 255])
    g, xd = int_input((1, 3, 2), scale, zp, axis=1)
    low, high = qdq_ranges(DqParams(scale, zp, 1, DType.U8), 3)
    fake_quantize(g, xd, "q2", low, high, F32(0), F32(255))
    g.set_info("q2", TensorInfo((1, 3, 2), DType.U8, QuantParams.make(scale, zp, 1)))
    add(g, Op.IDENTITY, ["q2"], "y")
    finish(g, "y")
    before = g.copy()
    assert apply(E, g).changed == 1 and ops(g) == ["Identity"]
    _bit_exact(before, g)


@settings(max_examples=300, deadline=None)
@given(scale=st.floats(2.0 ** -13, 8.0, width=32), zp=st.integers(-128, 255),
       signed=st.booleans())
def test_round_trip_exact_for_every_qdq_fake_quantize(scale, zp, signed):
    dtype = DType.S8 if signed else DType.U8
    lo, hi = dtype.range
    zp = min(max(zp, lo), hi)
    params = DqParams(np.array([scale], F32), np.array([zp]), None, dtype)
    low, high = qdq_ranges(params, 2)
    assert E.round_trip_exact(dtype, params.quant(), (low, high, F32(lo), F32(hi)), 256, (1, 8))
