"""move_dequantize: Conv / ConvTranspose / MatMul on dequantized int8 → int8 compute nodes.

Numerics: the int8 node's accumulator is exact and it rounds once, in the scale; the float
graph rounds each dequantized input to float32 and accumulates (the reference in float64)
before rounding. The f32 outputs differ by a few ulps, so a following QuantizeLinear picks
the same level except for values within ulps of a .5 tie: asserted within 1 LSB and >= 99.9%
identical over 4 random inputs (in practice all identical on these sizes).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from quant_helpers import (
    F32,
    add,
    apply,
    const,
    dequantize,
    feeds,
    finish,
    int_input,
    new_graph,
    ops,
    qdq,
    reasons,
    reference,
    weights,
)

import qfuse.passes.move_dequantize as M
from qfuse.compiler.onnx_import import import_model
from qfuse.compiler.pipeline import run_pipeline
from qfuse.examples.zoo.quantize import quantize
from qfuse.ir import DType, Op, QuantParams, TensorInfo
from qfuse.ir.chain import Scale, Shift, TensorOperand
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs, DequantizeAttrs
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.reference import IMPLS

RNG = np.random.default_rng(5)
SX, ZX = 0.04, 9
S_OUT = 0.09
CONV = ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))


def _w(shape) -> np.ndarray:
    return RNG.integers(-127, 128, shape).astype(np.int8)


def _int32_bias(g, name: str, values: np.ndarray, scale: np.ndarray) -> str:
    q = np.rint(values / scale).astype(np.int32)
    b = g.add_constant(f"{name}_q", q).name
    ins = [b, const(g, f"{name}_scale", scale), const(g, f"{name}_zp", np.zeros_like(q), np.int32)]
    return add(g, Op.DEQUANTIZE_LINEAR, ins, name, DequantizeAttrs(0)).outputs[0]


def _quantized_output(g, out: str) -> None:
    qdq(g, out, "y", S_OUT, 128)
    finish(g, "y")


def _numerics(before, after) -> None:
    shares = []
    for seed in range(4):
        f = feeds(before, seed)
        most, share = step_diff(reference(after, f)["y"], reference(before, f)["y"], S_OUT)
        assert most <= 1
        shares.append(share)
    assert float(np.mean(shares)) >= 0.999


def test_conv_per_channel_with_int32_bias_golden():
    g, xd = int_input((2, 8, 10, 10), SX, ZX)
    sw = np.linspace(0.001, 0.003, 16).astype(F32)
    w = weights(g, "w", _w((16, 8, 3, 3)), sw)
    bias_scale = (F32(SX) * sw).astype(F32)
    b = _int32_bias(g, "b", RNG.standard_normal(16).astype(F32), bias_scale)
    add(g, Op.CONV, [xd, w, b], "conv", CONV)
    _quantized_output(g, "conv")
    before = g.copy()
    bias_f32 = reference(g, feeds(g), keep=True)["b"]
    result = apply(M, g)
    assert result.changed == 1 and not result.declined
    assert ops(g) == ["Conv", "QuantizeLinear", "DequantizeLinear"]
    conv = g.node("conv")
    assert conv.inputs == ["x", "w_q"] and g.info("conv").dtype is DType.F32
    assert conv.fused.chain == [Scale.of(F32(SX) * sw), Shift.of(bias_f32)]
    assert conv.fused.src_zero_point == ZX and conv.fused.wei_zero_point == 0
    assert conv.fused.absorbed == ["xd", "w", "b"]
    _numerics(before, g)


def test_conv_per_tensor_float_bias_and_groups():
    g, xd = int_input((1, 8, 9, 9), SX, 0, DType.U8)
    w = weights(g, "w", _w((8, 2, 3, 3)), F32(0.002))
    bias = const(g, "bias", RNG.standard_normal(8))
    add(g, Op.CONV, [xd, w, bias], "conv", ConvAttrs((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 4))
    _quantized_output(g, "conv")
    before = g.copy()
    assert apply(M, g).changed == 1
    chain = g.node("conv").fused.chain
    assert chain == [Scale.of(F32(SX) * F32(0.002)), Shift.of(before.constant("bias"))]
    _numerics(before, g)


def test_conv_transpose_group_scales_are_tiled():
    g, xd = int_input((1, 4, 6, 6), SX, ZX, DType.U8)
    sw = np.array([0.002, 0.004, 0.003], F32)  # axis 1 of [Cin=4, Cout/g=3, k, k]
    w = weights(g, "w", _w((4, 3, 3, 3)), sw, axis=1)
    add(g, Op.CONV_TRANSPOSE, [xd, w], "conv",
        ConvTransposeAttrs((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 2))
    _quantized_output(g, "conv")
    before = g.copy()
    assert apply(M, g).changed == 1
    assert g.node("conv").fused.chain == [Scale.of(F32(SX) * np.tile(sw, 2))]
    _numerics(before, g)


def test_depthwise_per_channel_activation_scales_join_the_weight_scales():
    """NNCF quantizes depthwise inputs per channel: with one zero point, sx[c] scales only
    output channels of group c, so it folds into their weight scales (channel multiplier 2)."""
    sx = np.array([0.02, 0.05, 0.03, 0.04], F32)
    g, xd = int_input((1, 4, 6, 6), sx, [7, 7, 7, 7], axis=1)
    sw = np.linspace(0.002, 0.004, 8).astype(F32)
    w = weights(g, "w", _w((8, 1, 3, 3)), sw)
    add(g, Op.CONV, [xd, w], "conv", ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4))
    _quantized_output(g, "conv")
    before = g.copy()
    assert apply(M, g).changed == 1
    conv = g.node("conv")
    assert conv.fused.chain == [Scale.of(np.repeat(sx, 2) * sw)]
    assert conv.fused.src_zero_point == 7
    _numerics(before, g)


@pytest.mark.parametrize(("stride", "pad", "multiplier"), [(1, 1, 1), (2, 1, 2), (1, 0, 1)])
def test_depthwise_per_channel_zero_points_add_an_integer_correction(stride, pad, multiplier):
    """NNCF's MIXED preset quantizes depthwise inputs per channel with their own zero points:
    the node reads x_q with zero point 0 and adds C = −op(zx image, w) to the accumulator
    first; the result is bit-identical to the exact integer sum Σ w·(x_q − zx[c]) (padding
    contributes 0) times the scale. Without padding C is one value per output channel."""
    sx = np.array([0.02, 0.05, 0.03, 0.04], F32)
    zx = [0, 37, 128, 255]
    g, xd = int_input((2, 4, 7, 6), sx, zx, axis=1)
    sw = np.linspace(0.002, 0.004, 4 * multiplier).astype(F32)
    w_q = _w((4 * multiplier, 1, 3, 3))
    w = weights(g, "w", w_q, sw)
    attrs = ConvAttrs((3, 3), (stride, stride), (pad,) * 4, (1, 1), 4)
    add(g, Op.CONV, [xd, w], "conv", attrs)
    _quantized_output(g, "conv")
    before = g.copy()
    assert apply(M, g).changed == 1
    conv = g.node("conv")
    scale = np.repeat(sx, multiplier) * sw
    assert conv.fused.chain == [TensorOperand(2, "add"), Scale.of(scale)]
    assert conv.fused.src_zero_point == 0
    correction = g.constant(conv.inputs[2])
    out_shape = g.info("conv").shape
    assert correction.shape == ((1, 4 * multiplier, *out_shape[2:]) if pad else
                                (1, 4 * multiplier, 1, 1))
    for seed in range(3):
        f = feeds(before, seed)
        x_q = f["x"].astype(np.int64)
        shifted = x_q - np.array(zx).reshape(1, 4, 1, 1)
        acc = IMPLS[Op.CONV](before.node("conv"), [shifted, w_q.astype(np.int64)])[0]
        want = (acc.astype(F32) * scale.reshape(1, -1, 1, 1)).astype(F32)
        np.testing.assert_array_equal(reference(g, f, keep=True)["conv"], want)
    _numerics(before, g)


def test_per_channel_scales_into_a_dense_conv_declined():
    g, xd = int_input((1, 4, 6, 6), np.array([0.02, 0.02, 0.03, 0.02], F32), [0, 1, 0, 0],
                      axis=1)
    w = weights(g, "w", _w((4, 4, 3, 3)), F32(0.01))
    add(g, Op.CONV, [xd, w], "y", CONV)
    result = apply(M, finish(g, "y"))
    assert result.changed == 0 and "each group reads one channel" in reasons(result)[0]


@pytest.mark.parametrize(("kernel", "pad"), [(1, 0), (3, 1)])
def test_one_scale_with_per_channel_zero_points_into_a_dense_conv(kernel, pad):
    """A Concat of an s8 tensor (zero point 0, held as u8 with zero point 128) and u8 ReLU
    outputs sharing its scale (NNCF's unified scales: HGNet's aggregation convs) is
    dequantized per channel with one scale and zero points 128 and 0: a per-tensor source
    scale, and the zero points' integer correction added to the accumulator — bit-identical
    to the exact sum Σ w·(x_q − zx[c]) times the scale."""
    zx = [128, 128, 0, 0, 0]
    g, xd = int_input((1, 5, 6, 7), np.full(5, 0.05, F32), zx, axis=1)
    sw = np.linspace(0.002, 0.004, 6).astype(F32)
    w_q = _w((6, 5, kernel, kernel))
    add(g, Op.CONV, [xd, weights(g, "w", w_q, sw)], "conv",
        ConvAttrs((kernel, kernel), (1, 1), (pad,) * 4, (1, 1)))
    _quantized_output(g, "conv")
    before = g.copy()
    assert apply(M, g).changed == 1
    conv = g.node("conv")
    assert conv.fused.chain == [TensorOperand(2, "add"), Scale.of(F32(0.05) * sw)]
    assert conv.fused.src_zero_point == 0
    for seed in range(3):
        f = feeds(before, seed)
        shifted = f["x"].astype(np.int64) - np.array(zx).reshape(1, 5, 1, 1)
        acc = IMPLS[Op.CONV](before.node("conv"), [shifted, w_q.astype(np.int64)])[0]
        want = (acc.astype(F32) * (F32(0.05) * sw).reshape(1, -1, 1, 1)).astype(F32)
        np.testing.assert_array_equal(reference(g, f, keep=True)["conv"], want)
    _numerics(before, g)


def test_matmul_constant_weights_per_column_and_batched():
    g, xd = int_input((2, 5, 12), SX, ZX)
    sw = np.linspace(0.002, 0.004, 7).astype(F32)
    w = weights(g, "w", _w((2, 12, 7)), sw, axis=2)  # batched B, per column (last axis)
    add(g, Op.MATMUL, [xd, w], "mm")
    _quantized_output(g, "mm")
    before = g.copy()
    assert apply(M, g).changed == 1
    mm = g.node("mm")
    assert mm.fused.chain == [Scale.of(F32(SX) * sw)] and mm.fused.wei_zero_point == 0
    _numerics(before, g)


def test_matmul_activation_times_activation():
    g, ad = int_input((1, 2, 6, 8), SX, ZX)
    g.add_input("b", TensorInfo((1, 2, 8, 6), DType.U8, QuantParams.make(0.03, 131)))
    dequantize(g, "b", "bd", 0.03, 131)
    add(g, Op.MATMUL, [ad, "bd"], "mm")
    _quantized_output(g, "mm")
    before = g.copy()
    assert apply(M, g).changed == 1
    mm = g.node("mm")
    assert mm.inputs == ["x", "b"] and mm.fused.src_zero_point == ZX
    assert mm.fused.wei_zero_point == 131 and mm.fused.chain == [Scale.of(F32(SX) * F32(0.03))]
    _numerics(before, g)


@pytest.mark.parametrize("case,want", [
    ("float_activation", "activation is not dequantized int8"),
    ("weight_zero_point", "w − zw spans [-130, 124], beyond s8"),
    ("per_channel_activation", "activation dequantize is per channel"),
    ("u8_weights", "weights are u8 with zero point(s) [0]: w − zw spans [1, 255]"),
    ("conv_wrong_axis", "not the output-channel axis"),
    ("float_weights", "weights are not a dequantized int8 constant"),
])
def test_conv_declined_with_reason(case, want):
    if case == "float_activation":
        g = new_graph((1, 4, 5, 5))
        xd = "x"
    elif case == "per_channel_activation":
        g, xd = int_input((1, 4, 5, 5), np.array([0.1, 0.2, 0.3, 0.4], F32), [0, 0, 0, 0],
                          axis=1)
    else:
        g, xd = int_input((1, 4, 5, 5), SX, ZX)
    w_q = _w((6, 4, 3, 3))
    w_q.flat[:2] = [-127, 127]
    if case == "weight_zero_point":
        g.add_constant("wq", w_q)
        w = dequantize(g, "wq", "w", F32(0.01), np.int8(3)).outputs[0]
    elif case == "u8_weights":
        g.add_constant("wq", (w_q.astype(np.int16) + 128).astype(np.uint8))
        w = dequantize(g, "wq", "w", F32(0.01), np.uint8(0)).outputs[0]
    elif case == "conv_wrong_axis":
        w = weights(g, "w", w_q, np.linspace(0.01, 0.02, 4).astype(F32), axis=1)
    elif case == "float_weights":
        w = const(g, "w", w_q.astype(F32))
    else:
        w = weights(g, "w", w_q, F32(0.01))
    add(g, Op.CONV, [xd, w], "y", CONV)
    finish(g, "y")
    before = ops(g)
    result = apply(M, g)
    assert result.changed == 0 and ops(g) == before and g.node("y").fused is None
    assert len(result.declined) == 1 and want in reasons(result)[0], reasons(result)


@pytest.mark.parametrize("dtype,zero_point", [(np.uint8, 128), (np.uint8, 100),
                                              (np.int8, -20)])
def test_conv_weights_with_a_zero_point_become_s8_when_they_fit(dtype, zero_point):
    """ONNX Runtime's u8 weights (or any weight zero point): ``w_q − zw`` as an s8 constant
    with zero point 0 when it fits, the same real weights; numerics as for s8 weights."""
    g, xd = int_input((1, 4, 6, 6), SX, ZX)
    w_s8 = RNG.integers(-100, 100, (6, 4, 3, 3))
    w_s8.flat[:2] = [-100, 99]
    g.add_constant("wq", (w_s8 + zero_point).astype(dtype))
    w = dequantize(g, "wq", "w", F32(0.01), dtype(zero_point)).outputs[0]
    add(g, Op.CONV, [xd, w], "conv", CONV)
    _quantized_output(g, "conv")
    before = g.copy()
    result = apply(M, g)
    assert result.changed == 1 and not result.declined
    conv = g.node("conv")
    assert conv.fused.wei_zero_point == 0 and conv.fused.chain == [Scale.of(F32(SX) * F32(0.01))]
    assert np.array_equal(g.constant(conv.inputs[1]), w_s8.astype(np.int8))
    assert g.constant(conv.inputs[1]).dtype == np.int8
    _numerics(before, g)


def test_matmul_u8_weights_per_column_zero_points_become_s8():
    g, xd = int_input((3, 6), SX, ZX)
    zps = np.array([120, 128, 131, 127], np.uint8)
    w_s8 = RNG.integers(-90, 90, (6, 4))
    g.add_constant("wq", (w_s8 + zps).astype(np.uint8))
    g.add_constant("ws", np.linspace(0.01, 0.02, 4).astype(F32))
    g.add_constant("wz", zps)
    from quant_helpers import add as add_node
    add_node(g, Op.DEQUANTIZE_LINEAR, ["wq", "ws", "wz"], "w", DequantizeAttrs(1))
    add(g, Op.MATMUL, [xd, "w"], "y0")
    _quantized_output(g, "y0")
    before = g.copy()
    assert apply(M, g).changed == 1
    mm = g.node("y0")
    assert mm.fused.wei_zero_point == 0
    assert np.array_equal(g.constant(mm.inputs[1]), w_s8.astype(np.int8))
    _numerics(before, g)


@pytest.mark.parametrize("per_column", [False, True])
def test_matmul_u8_weights_with_one_zero_point_become_s8_when_they_fit(per_column):
    """quantize_static's ``weight_type=QUInt8``: symmetric u8 weights, zero point 128 (per
    tensor, or the same for every column) — an s8 constant with zero point 0, so the MatMul
    is an s8 one (vector_matmul_as_conv takes it); weights whose ``w_q − zw`` leaves s8 keep
    their one zero point for the matmul."""
    for zp, fits in ((128, True), (0, False)):
        g, xd = int_input((3, 6), SX, ZX)
        w_s8 = RNG.integers(-90, 90, (6, 4))
        w_s8.flat[0] = 127 if fits else 200
        g.add_constant("wq", (w_s8 + zp).astype(np.uint8))
        g.add_constant("ws", np.linspace(0.01, 0.02, 4).astype(F32) if per_column else F32(0.01))
        g.add_constant("wz", np.full(4, zp, np.uint8) if per_column else np.uint8(zp))
        from quant_helpers import add as add_node
        add_node(g, Op.DEQUANTIZE_LINEAR, ["wq", "ws", "wz"], "w",
                 DequantizeAttrs(1 if per_column else None))
        add(g, Op.MATMUL, [xd, "w"], "y0")
        _quantized_output(g, "y0")
        before = g.copy()
        assert apply(M, g).changed == 1
        mm = g.node("y0")
        if fits:
            assert mm.fused.wei_zero_point == 0
            assert np.array_equal(g.constant(mm.inputs[1]), w_s8.astype(np.int8))
        else:
            assert mm.fused.wei_zero_point == zp
            assert g.constant(mm.inputs[1]).dtype == np.uint8
        _numerics(before, g)


def test_matmul_weights_per_row_declined():
    g, xd = int_input((3, 6), SX, ZX)
    w = weights(g, "w", _w((6, 4)), np.linspace(0.01, 0.02, 6).astype(F32), axis=0)
    add(g, Op.MATMUL, [xd, w], "y")
    result = apply(M, finish(g, "y"))
    assert result.changed == 0 and "along the last axis 1" in reasons(result)[0]


def test_shared_activation_dequantize_stays_for_other_readers():
    g, xd = int_input((1, 4, 5, 5), SX, ZX)
    w = weights(g, "w", _w((6, 4, 3, 3)), F32(0.01))
    add(g, Op.CONV, [xd, w], "conv", CONV)
    add(g, Op.RELU, [xd], "r")
    finish(g, "conv", "r")
    assert apply(M, g).changed == 1
    assert g.producer("xd").op is Op.DEQUANTIZE_LINEAR and g.node("r").inputs == ["xd"]
    assert "w" not in g.values  # the weights' DQ had no other reader


@settings(max_examples=40, deadline=None)
@given(groups=st.sampled_from([1, 2]), stride=st.integers(1, 2), pad=st.integers(0, 2),
       zx=st.sampled_from([0, 1, 128, 255]), sx=st.floats(2.0 ** -12, 1.0, width=32),
       seed=st.integers(0, 2**16))
def test_random_convs_agree_within_float32_rounding(groups, stride, pad, zx, sx, seed):
    """Any conv shape / zero point (saturation edges 0 and 255 included): the int8 node's
    f32 output is within 1e-6 of the |x|·|w| sum (+|bias|) of the float conv's."""
    rng = np.random.default_rng(seed)
    g, xd = int_input((1, 4, 6, 6), sx, zx)
    sw = rng.uniform(1e-3, 1e-2, 6).astype(F32)
    w = weights(g, "w", rng.integers(-127, 128, (6, 4 // groups, 3, 3)).astype(np.int8), sw)
    bias = const(g, "bias", rng.standard_normal(6))
    attrs = ConvAttrs((3, 3), (stride, stride), (pad,) * 4, (1, 1), groups)
    add(g, Op.CONV, [xd, w, bias], "y", attrs)
    finish(g, "y")
    before = g.copy()
    assert apply(M, g).changed == 1
    f = feeds(before, seed)
    b_all = reference(before, f, keep=True)
    a = reference(g, f)["y"]
    magnitude = IMPLS[Op.CONV](before.node("y"), [np.abs(b_all["xd"]), np.abs(b_all["w"]),
                                                  np.abs(before.constant("bias"))])[0]
    assert np.all(np.abs(a - b_all["y"]) <= 1e-6 * magnitude)


def test_grouped_conv_transpose_as_onnxruntime_quantizes_it():
    """quantize_static gives a grouped ConvTranspose w [Cin, Cout/g, k, k] Cout/g scales on
    axis 1 (checked: 3 scales for Cout 6, group 2); move_dequantize tiles them per group.
    (With a bias, onnxruntime 1.x's quantize_static fails on this model: it broadcasts the
    (Cout,) bias against the (Cout/g,) scales — so the model has none.)"""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(F32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=2, strides=[2, 2],
                            pads=[1, 1, 1, 1], output_padding=[1, 1])
    graph = helper.make_graph(
        [node], "deconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 10, 10])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    calib = [{"x": rng.standard_normal((1, 4, 5, 5)).astype(F32)} for _ in range(4)]
    g = import_model(quantize(model, calib))
    original = g.copy()
    run_pipeline(g, until="eliminate_requantize")
    deconv = next(n for n in g if n.op is Op.CONV_TRANSPOSE)
    w_dq = original.producer(original.node(deconv.name).inputs[1])
    x_dq = original.producer(original.node(deconv.name).inputs[0])
    sw, sx = original.constant(w_dq.inputs[1]), original.constant(x_dq.inputs[1])
    assert sw.shape == (3,) and w_dq.attrs.axis == 1
    assert deconv.fused.chain[0] == Scale.of(F32(sx) * np.tile(sw, 2))
    s_out = float(original.constant(original.producer("y").inputs[1]))
    for f in calib:
        most, share = step_diff(reference(g, f)["y"], reference(original, f)["y"], s_out)
        assert most <= 1 and share >= 0.999


def test_depthwise_conv_transpose_per_channel_zero_points():
    """The same correction for a depthwise ConvTranspose (w [C, 1, k, k], group C): C is
    −deconv(zx image, w), position-dependent where the taps overlap; bit-exact."""
    sx = np.array([0.02, 0.05, 0.03, 0.04], F32)
    zx = [3, 200, 0, 90]
    g, xd = int_input((1, 4, 5, 4), sx, zx, axis=1)
    sw = F32(0.003)  # axis 1 of [C, 1, k, k] has one scale: per tensor here
    w_q = _w((4, 1, 3, 3))
    w = weights(g, "w", w_q, sw)
    attrs = ConvTransposeAttrs((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 4)
    add(g, Op.CONV_TRANSPOSE, [xd, w], "deconv", attrs)
    _quantized_output(g, "deconv")
    before = g.copy()
    assert apply(M, g).changed == 1
    node = g.node("deconv")
    assert node.fused.chain[0] == TensorOperand(2, "add") and node.fused.src_zero_point == 0
    f = feeds(before, 0)
    shifted = f["x"].astype(np.int64) - np.array(zx).reshape(1, 4, 1, 1)
    acc = IMPLS[Op.CONV_TRANSPOSE](before.node("deconv"), [shifted, w_q.astype(np.int64)])[0]
    want = (acc.astype(F32) * (sx * sw).reshape(1, -1, 1, 1)).astype(F32)
    np.testing.assert_array_equal(reference(g, f, keep=True)["deconv"], want)
