"""qdq_to_fake_quantize: Q → DQ pairs become one FakeQuantize.

Numerics: the FakeQuantize carries the pair it stands for (``FakeQuantizeAttrs.onnx``) and
rounds ONNX's way, rint(x/s) + zp, so the rewrite is bit-exact, on exact ties (whatever the
parity of the zero point) and near them too. (The level-index formula the ranges alone would
give, rint((x - il)/(ih - il)·255), differs by one level on exact ties when zp - qmin is odd,
and near ties where float32 lands on the other side: that is why the pair is carried.)
"""

from __future__ import annotations

import numpy as np
import pytest
from quant_helpers import (
    F32,
    add,
    apply,
    dequantize,
    finish,
    new_graph,
    ops,
    qdq,
    quantize,
    reasons,
    reference,
    weights,
)

import qfuse.passes.qdq_to_fake_quantize as P
from qfuse.ir import DType, Op
from qfuse.ir.ops import ConvAttrs


def _fq_ranges(graph, node):
    return [graph.constant(v) for v in node.inputs[1:]]


def test_pair_becomes_fake_quantize():
    g = new_graph((1, 3, 4, 4))
    y = qdq(g, "x", "y", 0.02, 113)
    add(g, Op.RELU, [y], "r")
    finish(g, "r")
    result = apply(P, g)
    assert result.changed == 1 and not result.declined
    assert ops(g) == ["FakeQuantize", "Relu"]
    fq = g.producer("y")  # the DQ's output name survives
    il, ih, ol, oh = _fq_ranges(g, fq)
    assert fq.attrs.levels == 256 and g.info("y").dtype is DType.F32
    assert il == ol == F32(0.02) * F32(-113) and ih == oh == F32(0.02) * F32(255 - 113)
    dtype, quant = fq.meta["qdq"]
    assert dtype is DType.U8 and quant.scale == (float(F32(0.02)),) and quant.zero_point == (113,)
    assert fq.meta["q_output"] == "y_q"


def test_shared_dequantizes_and_graph_output_name():
    g = new_graph((1, 8))
    quantize(g, "x", "q", 0.1, -3, DType.S8)
    dequantize(g, "q", "d1", 0.1, -3)
    dequantize(g, "q", "d2", 0.1, -3)
    add(g, Op.RELU, ["d2"], "r")
    finish(g, "d1", "r")
    assert apply(P, g).changed == 1
    assert ops(g) == ["FakeQuantize", "Relu"]
    assert g.outputs == ["d1", "r"] and g.node("r").inputs == ["d1"]
    il, ih, _, _ = _fq_ranges(g, g.producer("d1"))
    assert il == F32(0.1) * F32(-128 + 3) and ih == F32(0.1) * F32(127 + 3)


def test_per_channel_ranges_broadcast_on_the_axis():
    g = new_graph((1, 3, 2, 2))
    scale, zp = np.array([0.1, 0.2, 0.3], F32), np.array([1, 2, 3])
    quantize(g, "x", "q", scale, zp, DType.U8, axis=1)
    dequantize(g, "q", "y", scale, zp, axis=1)
    finish(g, "y")
    assert apply(P, g).changed == 1
    il, ih, _, _ = _fq_ranges(g, g.producer("y"))
    assert il.shape == ih.shape == (1, 3, 1, 1)
    np.testing.assert_array_equal(il.ravel(), scale * (0 - zp).astype(F32))
    assert g.producer("y").meta["qdq"][1].axis == 1


@pytest.mark.parametrize("case", ["other_reader", "scale", "zero_point", "graph_output"])
def test_declined_with_reason(case):
    g = new_graph((1, 4))
    quantize(g, "x", "q", 0.1, 10)
    other = 0.2 if case == "scale" else 0.1
    zp = 11 if case == "zero_point" else 10
    dequantize(g, "q", "y", other, zp)
    outs = ["y"]
    if case == "other_reader":
        add(g, Op.IDENTITY, ["q"], "raw")
        outs.append("raw")
    if case == "graph_output":
        outs.append("q")
    finish(g, *outs)
    before = ops(g)
    result = apply(P, g)
    assert result.changed == 0 and ops(g) == before
    want = {"other_reader": "not only by DequantizeLinear", "scale": "differs from",
            "zero_point": "differs from", "graph_output": "is a graph output"}[case]
    assert len(result.declined) == 1 and want in reasons(result)[0]


def test_constant_weights_are_not_touched():
    g = new_graph((1, 2, 4, 4))
    x = qdq(g, "x", "xd", 0.05, 0)
    w = weights(g, "w", np.ones((3, 2, 1, 1), np.int8), np.array([0.1, 0.2, 0.3], F32))
    add(g, Op.CONV, [x, w], "y", ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1)))
    finish(g, "y")
    result = apply(P, g)
    assert result.changed == 1 and not result.declined  # only the activation pair
    assert ops(g).count("DequantizeLinear") == 1


def _pair(scale: float, zp: int, dtype: DType, n: int):
    g = new_graph((1, n))
    qdq(g, "x", "y", scale, zp, dtype)
    finish(g, "y")
    after = g.copy()
    apply(P, after)
    return g, after


def test_numerics_bit_exact_near_ties():
    """The FakeQuantize carries the pair (FakeQuantizeAttrs.onnx): the rewrite is exact."""
    rng = np.random.default_rng(3)
    for trial in range(40):
        dtype = (DType.U8, DType.S8)[trial % 2]
        lo, hi = dtype.range
        scale = float(F32(np.exp(rng.uniform(np.log(1e-3), 0.0))))
        zp = int(rng.integers(lo, hi + 1))
        before, after = _pair(scale, zp, dtype, 4096)
        x = (rng.uniform(lo - zp - 3, hi - zp + 3, (1, 2048)) * scale).astype(F32)
        ties = ((rng.integers(lo - zp, hi - zp, (1, 2048)) + F32(0.5)) * F32(scale)).astype(F32)
        near = np.nextafter(ties, np.where(rng.random(ties.shape) < 0.5, F32(np.inf),
                                           F32(-np.inf)).astype(F32))
        x = np.concatenate([x, near], axis=1)
        b, a = reference(before, {"x": x})["y"], reference(after, {"x": x})["y"]
        assert np.array_equal(a, b)


@pytest.mark.parametrize("zp", [0, 1, 2, 3, 100, 101, 255])
def test_exact_ties_round_like_onnx(zp):
    scale = 2.0 ** -6
    before, after = _pair(scale, zp, DType.U8, 255)
    m = np.arange(-zp, 255 - zp, dtype=F32)
    x = ((m + F32(0.5)) * F32(scale)).reshape(1, -1)
    b, a = reference(before, {"x": x})["y"], reference(after, {"x": x})["y"]
    assert np.array_equal(a, b)  # rint(x/s) + zp, whatever the parity of zp


def test_unused_quantize_is_ignored():
    g = new_graph((1, 4))
    quantize(g, "x", "q", 0.1, 0)
    add(g, Op.RELU, ["x"], "y")
    g.outputs = ["y"]
    g.verify()
    result = apply(P, g)
    assert result.changed == 0 and not result.declined
