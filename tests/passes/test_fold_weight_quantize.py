"""fold_weight_quantize: FakeQuantize on constant float weights → s8 constant + DQ.

Numerics: the s8 value is the FakeQuantize's level (same float32 expression), so the
dequantized weight is the same level; it differs from FQ(w) by float32 rounding only, asserted
as |DQ(w_q) - FQ(w)| <= 1e-4·So per weight. A float conv on either then differs by at most
1e-4·So·Σ|x| over the window (asserted on the outputs with that bound).
"""

from __future__ import annotations

import numpy as np
import pytest
from quant_helpers import F32, add, apply, fake_quantize, finish, new_graph, ops, reasons, reference

import qfuse.passes.decompose_fake_quantize as D
import qfuse.passes.fold_weight_quantize as W
import qfuse.passes.move_dequantize as M
from qfuse.ir import DType, Op
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs

RNG = np.random.default_rng(11)


def _conv_graph(w: np.ndarray, il, ih, ol, oh, levels: int, op: Op = Op.CONV, group: int = 1):
    c_in = w.shape[0] if op is Op.CONV_TRANSPOSE else w.shape[1] * group
    g = new_graph((1, c_in, 5, 5))
    g.add_constant("w", w.astype(F32))
    fake_quantize(g, "w", "wq", il, ih, ol, oh, levels)
    if op is Op.CONV:
        attrs = ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), group)
    else:
        attrs = ConvTransposeAttrs((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), group)
    add(g, op, ["x", "wq"], "y", attrs)
    return finish(g, "y")


def _check(before, after, step: np.ndarray) -> None:
    x = RNG.standard_normal(before.info("x").shape).astype(F32)
    b = reference(before, {"x": x}, keep=True)
    a = reference(after, {"x": x}, keep=True)
    assert np.all(np.abs(a["wq"] - b["wq"]) <= 1e-4 * step)
    window = float(np.abs(x).sum())
    assert float(np.max(np.abs(a["y"] - b["y"]))) <= 1e-4 * float(step.max()) * window


def _dq(g):
    dq = g.producer("wq")
    assert dq.op is Op.DEQUANTIZE_LINEAR
    return dq, g.values[dq.inputs[0]]


@pytest.mark.parametrize("levels,low", [(255, -127), (256, -128)])
def test_per_channel_symmetric_conv_weights(levels, low):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(F32)
    amax = np.abs(w).max(axis=(1, 2, 3)).reshape(4, 1, 1, 1).astype(F32)
    step = amax / F32(127)
    lo, hi = F32(low) * step, F32(low + levels - 1) * step
    g = _conv_graph(w, lo, hi, lo, hi, levels)
    before = g.copy()
    result = apply(W, g)
    assert result.changed == 1 and not result.declined
    assert ops(g) == ["DequantizeLinear", "Conv"]
    dq, wq = _dq(g)
    assert wq.data.dtype == np.int8 and wq.info.dtype is DType.S8
    assert wq.info.quant.axis == 0 and wq.info.quant.zero_point == (0,) * 4
    assert dq.attrs.axis == 0 and np.all(g.constant(dq.inputs[2]) == 0)
    assert int(wq.data.min()) >= low and int(wq.data.max()) <= low + levels - 1
    np.testing.assert_allclose(g.constant(dq.inputs[1]), (hi - lo).ravel() / (levels - 1),
                               rtol=1e-6)
    _check(before, g, step.ravel().reshape(4, 1, 1, 1))


def test_per_tensor_and_conv_transpose_axis_1():
    w = RNG.standard_normal((4, 2, 3, 3)).astype(F32)  # [Cin, Cout/g, k, k], group 2
    step = np.array([0.02, 0.03], F32).reshape(1, 2, 1, 1)
    lo, hi = -127 * step, 127 * step
    g = _conv_graph(w, lo, hi, lo, hi, 255, Op.CONV_TRANSPOSE, group=2)
    before = g.copy()
    assert apply(W, g).changed == 1
    dq, wq = _dq(g)
    assert dq.attrs.axis == 1 and wq.info.quant.axis == 1 and len(wq.info.quant.scale) == 2
    _check(before, g, step)
    g2 = _conv_graph(w[:, :1], F32(-1), F32(1), F32(-1), F32(1), 255, Op.CONV_TRANSPOSE)
    assert apply(W, g2).changed == 1
    assert g2.values[_dq(g2)[0].inputs[0]].info.quant.axis is None


def test_matmul_weights_per_column():
    g = new_graph((2, 6))
    w = RNG.standard_normal((6, 5)).astype(F32)
    amax = np.abs(w).max(axis=0).astype(F32)
    g.add_constant("w", w)
    fake_quantize(g, "w", "wq", -amax, amax, -amax, amax, 255)
    add(g, Op.MATMUL, ["x", "wq"], "y")
    finish(g, "y")
    assert apply(W, g).changed == 1
    assert _dq(g)[0].attrs.axis == 1


@pytest.mark.parametrize("case,want", [
    ("asymmetric", "oneDNN has no weight zero points for conv"),
    ("wrong_axis", "not along the output-channel axis"),
    ("not_integral", "integer zero point"),
    ("levels", "does not fit 8 bits"),
])
def test_declined_with_reason(case, want):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(F32)
    lo, hi, levels = F32(-1.27), F32(1.27), 255
    if case == "asymmetric":
        lo, hi, levels = F32(-0.5), F32(2.05), 256
    if case == "wrong_axis":
        hi = np.array([1.27, 2.54, 1.27], F32).reshape(1, 3, 1, 1)
        lo = -hi
    if case == "not_integral":
        lo = F32(-1.2)
    if case == "levels":
        levels = 65536
    g = _conv_graph(w, lo, hi, lo, hi, levels)
    result = apply(W, g)
    assert result.changed == 0 and ops(g) == ["FakeQuantize", "Conv"]
    assert len(result.declined) == 1 and want in reasons(result)[0], reasons(result)


def test_activation_fake_quantize_is_not_touched():
    g = new_graph((1, 4))
    fake_quantize(g, "x", "y", F32(-1), F32(1), F32(-1), F32(1), 255)
    finish(g, "y")
    result = apply(W, g)
    assert result.changed == 0 and not result.declined


def test_openvino_style_model_becomes_int8():
    """FakeQuantize on activations and weights (NNCF export) → the same int8 conv as ONNX
    Runtime's QDQ models, through decomposition, weight folding and move_dequantize."""
    g = new_graph((1, 3, 6, 6))
    fake_quantize(g, "x", "xq", F32(0), F32(2.55), F32(0), F32(2.55), 256)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(F32)
    amax = np.abs(w).max(axis=(1, 2, 3)).reshape(4, 1, 1, 1).astype(F32)
    g.add_constant("w", w)
    fake_quantize(g, "w", "wq", -amax, amax, -amax, amax, 255)
    add(g, Op.CONV, ["xq", "wq"], "y", ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))
    finish(g, "y")
    before = g.copy()
    for module in (D, W, M):
        assert apply(module, g).changed == 1
    conv = g.node("y")
    assert conv.fused is not None and g.info(conv.inputs[0]).dtype is DType.U8
    assert g.info(conv.inputs[1]).dtype is DType.S8 and conv.fused.src_zero_point == 0
    x = np.abs(RNG.standard_normal((1, 3, 6, 6))).astype(F32)
    b, a = reference(before, {"x": x})["y"], reference(g, {"x": x})["y"]
    assert float(np.max(np.abs(a - b))) <= 1e-5 * float(np.max(np.abs(b)))
