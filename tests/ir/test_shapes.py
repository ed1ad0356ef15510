"""Shape rules on tiny hand-built graphs, checked against onnx.shape_inference (and ONNX
Runtime where onnx's inference disagrees with the runtimes: pooling ceil_mode)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from shape_helpers import f32, onnx_shapes, rule

from qfuse.ir import DType, GraphError, Op, QuantParams, TensorInfo
from qfuse.ir.ops import (
    AlphaAttrs,
    AxisAttrs,
    ClipAttrs,
    ConvAttrs,
    ConvTransposeAttrs,
    GeluAttrs,
    GemmAttrs,
    HardSigmoidAttrs,
    PoolAttrs,
)
from qfuse.ir.shapes import SHAPE_RULES

F32 = DType.F32


def test_every_op_has_a_rule() -> None:
    assert set(SHAPE_RULES) == set(Op)


def test_missing_rule_names_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(SHAPE_RULES, Op.RELU)
    with pytest.raises(GraphError, match=r"'n' \(Relu\): no shape rule for op Relu"):
        rule(Op.RELU, None, [f32(1)])


# ------------------------------------------------------------------------- conv and pooling
CONV_CASES = [
    # x shape, w shape, strides, pads, dilations, group
    ((1, 3, 10, 10), (8, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 4, 11, 9), (6, 2, 3, 2), (2, 3), (0, 1, 2, 0), (1, 1), 2),
    ((1, 8, 15, 15), (8, 1, 3, 3), (2, 2), (2, 2, 2, 2), (2, 2), 8),
    ((1, 3, 7), (4, 3, 5), (3,), (1, 0), (1,), 1),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 1), (1, 2, 1), (0, 1, 0, 1, 0, 0), (2, 1, 1), 1),
]


@pytest.mark.parametrize(("x", "w", "strides", "pads", "dilations", "group"), CONV_CASES)
def test_conv_matches_onnx(x: tuple[int, ...], w: tuple[int, ...], strides: tuple[int, ...],
                           pads: tuple[int, ...], dilations: tuple[int, ...], group: int) -> None:
    attrs = ConvAttrs(w[2:], strides, pads, dilations, group)
    (out,) = rule(Op.CONV, attrs, [f32(*x), np.zeros(w, np.float32), np.zeros(w[0], np.float32)])
    expected = onnx_shapes("Conv", [x, np.zeros(w, np.float32)], strides=list(strides),
                           pads=list(pads), dilations=list(dilations), group=group)
    assert out == TensorInfo(expected[0], F32)


def test_conv_channel_mismatch_names_the_node() -> None:
    attrs = ConvAttrs((3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    with pytest.raises(GraphError, match=r"'n' \(Conv\): input has 4 channels"):
        rule(Op.CONV, attrs, [f32(1, 4, 8, 8), np.zeros((8, 3, 3, 3), np.float32)])


def test_conv_bad_bias_and_kernel_too_large() -> None:
    attrs = ConvAttrs((3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    w = np.zeros((8, 3, 3, 3), np.float32)
    with pytest.raises(GraphError, match="bias has shape"):
        rule(Op.CONV, attrs, [f32(1, 3, 8, 8), w, np.zeros(4, np.float32)])
    with pytest.raises(GraphError, match="smaller than the dilated kernel"):
        rule(Op.CONV, attrs, [f32(1, 3, 2, 8), w])


def test_conv_on_integers_accumulates_in_s32_or_keeps_a_fused_type() -> None:
    attrs = ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    x = TensorInfo((1, 3, 4, 4), DType.U8, QuantParams.make(0.1, 3))
    w = np.zeros((2, 3, 1, 1), np.int8)
    (out,) = rule(Op.CONV, attrs, [x, w])
    assert out == TensorInfo((1, 2, 4, 4), DType.S32)
    fused = TensorInfo((1, 2, 4, 4), DType.S8, QuantParams.make(0.5, 0))
    (out,) = rule(Op.CONV, attrs, [x, w], out_info=fused)
    assert out == fused


CONV_T_CASES = [
    # x, w, strides, pads, dilations, output_padding, group
    ((1, 4, 5, 5), (4, 2, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1),
    ((1, 4, 5, 6), (4, 3, 3, 2), (3, 2), (0, 1, 2, 0), (1, 2), (2, 1), 2),
    ((2, 3, 7), (3, 5, 4), (1,), (0, 0), (1,), (0,), 1),
]


@pytest.mark.parametrize(("x", "w", "strides", "pads", "dilations", "out_pad", "group"),
                         CONV_T_CASES)
def test_conv_transpose_matches_onnx(x: tuple[int, ...], w: tuple[int, ...],
                                     strides: tuple[int, ...], pads: tuple[int, ...],
                                     dilations: tuple[int, ...], out_pad: tuple[int, ...],
                                     group: int) -> None:
    attrs = ConvTransposeAttrs(w[2:], strides, pads, dilations, out_pad, group)
    (out,) = rule(Op.CONV_TRANSPOSE, attrs, [f32(*x), np.zeros(w, np.float32)])
    expected = onnx_shapes("ConvTranspose", [x, np.zeros(w, np.float32)], strides=list(strides),
                           pads=list(pads), dilations=list(dilations),
                           output_padding=list(out_pad), group=group)
    assert out.shape == expected[0]
    assert out.shape[1] == w[1] * group


def test_conv_transpose_rejects_large_output_padding() -> None:
    attrs = ConvTransposeAttrs((3, 3), (2, 2), (0,) * 4, (1, 1), (2, 0), 1)
    with pytest.raises(GraphError, match=r"output_padding 2 must be in \[0, "):
        rule(Op.CONV_TRANSPOSE, attrs, [f32(1, 4, 5, 5), np.zeros((4, 2, 3, 3), np.float32)])


POOL_CASES = [
    # size, kernel, stride, pads, dilation
    (5, 2, 2, (0, 0), 1), (6, 3, 2, (1, 1), 1), (7, 3, 2, (0, 1), 1), (8, 2, 3, (1, 1), 1),
    (5, 3, 2, (1, 1), 2), (6, 2, 2, (1, 1), 1), (32, 3, 2, (1, 1), 1), (9, 3, 3, (0, 0), 1),
]


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("op", [Op.MAX_POOL, Op.AVG_POOL])
@pytest.mark.parametrize(("size", "k", "s", "pads", "d"), POOL_CASES)
def test_pool_matches_onnxruntime(op: Op, ceil_mode: bool, size: int, k: int, s: int,
                                  pads: tuple[int, int], d: int) -> None:
    import onnxruntime as ort

    attrs = PoolAttrs((k,), (s,), pads, (d,), ceil_mode)
    (out,) = rule(op, attrs, [f32(1, 2, size)])
    node = helper.make_node(op.value, ["x"], ["y"], kernel_shape=[k], strides=[s],
                            pads=list(pads), dilations=[d], ceil_mode=int(ceil_mode))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 2, size])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.zeros((1, 2, size), np.float32)})[0]
    assert out.shape == got.shape
    if not ceil_mode:
        assert out.shape == onnx_shapes(op.value, [(1, 2, size)], kernel_shape=[k],
                                        strides=[s], pads=list(pads), dilations=[d])[0]


def test_ceil_mode_drops_a_window_starting_in_the_padding() -> None:
    """onnx.shape_inference says 4 here; PyTorch, ONNX Runtime and onnx.reference say 3."""
    (out,) = rule(Op.MAX_POOL, PoolAttrs((2,), (3,), (1, 1), (1,), True), [f32(1, 1, 8)])
    assert out.shape == (1, 1, 3)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 20), k=st.integers(1, 4), s=st.integers(1, 3), d=st.integers(1, 2),
       pb=st.integers(0, 2), pe=st.integers(0, 2))
def test_conv_window_matches_onnx_random(size: int, k: int, s: int, d: int, pb: int,
                                         pe: int) -> None:
    x, w = (1, 1, size), np.zeros((1, 1, k), np.float32)
    attrs = ConvAttrs((k,), (s,), (pb, pe), (d,), 1)
    if size + pb + pe < (k - 1) * d + 1:
        with pytest.raises(GraphError):
            rule(Op.CONV, attrs, [f32(*x), w])
        return
    (out,) = rule(Op.CONV, attrs, [f32(*x), w])
    assert out.shape == onnx_shapes("Conv", [x, w], strides=[s], pads=[pb, pe],
                                    dilations=[d])[0]


def test_max_pool_keeps_quant_and_avg_pool_drops_it() -> None:
    q = QuantParams.make(0.1, 128)
    x = TensorInfo((1, 2, 4, 4), DType.U8, q)
    attrs = PoolAttrs((2, 2), (2, 2), (0,) * 4, (1, 1))
    assert rule(Op.MAX_POOL, attrs, [x]) == [TensorInfo((1, 2, 2, 2), DType.U8, q)]
    assert rule(Op.AVG_POOL, attrs, [x]) == [TensorInfo((1, 2, 2, 2), DType.U8)]
    assert rule(Op.GLOBAL_AVG_POOL, None, [x]) == [TensorInfo((1, 2, 1, 1), DType.U8)]


# ---------------------------------------------------------------------------- Gemm, MatMul
@pytest.mark.parametrize(("ta", "tb"), [(False, False), (True, False), (False, True),
                                        (True, True)])
def test_gemm_transposes_match_onnx(ta: bool, tb: bool) -> None:
    a = (5, 3) if ta else (3, 5)
    b = (4, 5) if tb else (5, 4)
    (out,) = rule(Op.GEMM, GemmAttrs(1.0, 1.0, ta, tb),
                  [f32(*a), np.zeros(b, np.float32), np.zeros(4, np.float32)])
    expected = onnx_shapes("Gemm", [a, np.zeros(b, np.float32)], transA=int(ta), transB=int(tb))
    assert out.shape == expected[0] == (3, 4)


def test_gemm_inner_dim_mismatch() -> None:
    with pytest.raises(GraphError, match=r"'n' \(Gemm\): inner dims differ"):
        rule(Op.GEMM, GemmAttrs(), [f32(3, 5), np.zeros((4, 5), np.float32)])


@pytest.mark.parametrize(("a", "b"), [
    ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (7, 4, 6)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
    ((1, 2, 3), (5, 3, 2)),
])
def test_matmul_batched_broadcast_matches_onnx(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    (out,) = rule(Op.MATMUL, None, [f32(*a), f32(*b)])
    assert out.shape == onnx_shapes("MatMul", [a, b])[0] == np.matmul(np.zeros(a),
                                                                        np.zeros(b)).shape


def test_matmul_bad_batch_broadcast() -> None:
    with pytest.raises(GraphError, match="do not broadcast"):
        rule(Op.MATMUL, None, [f32(2, 3, 4), f32(3, 4, 5)])


# ------------------------------------------------------------------------- elementwise
def test_binary_broadcast_and_error() -> None:
    assert rule(Op.ADD, None, [f32(2, 1, 4), f32(3, 1)]) == [f32(2, 3, 4)]
    with pytest.raises(GraphError, match=r"'n' \(Mul\): shapes \(2, 3\) and \(4,\) do not"):
        rule(Op.MUL, None, [f32(2, 3), f32(4)])
    assert rule(Op.SUM, None, [f32(2, 1), f32(1, 3), f32(3)]) == [f32(2, 3)]


def test_relu_keeps_quant_sigmoid_drops_it() -> None:
    x = TensorInfo((2, 3), DType.U8, QuantParams.make(0.5, 7))
    assert rule(Op.RELU, None, [x]) == [x]
    assert rule(Op.SIGMOID, None, [x]) == [TensorInfo((2, 3), DType.U8)]


def test_prelu_slope_must_broadcast_to_x() -> None:
    assert rule(Op.PRELU, None, [f32(1, 3, 4, 4), np.ones((3, 1, 1), np.float32)]) == [
        f32(1, 3, 4, 4)]
    with pytest.raises(GraphError, match="slope of shape"):
        rule(Op.PRELU, None, [f32(1, 3, 4, 4), np.ones((1, 3, 4, 4, 1), np.float32)])


def test_batch_norm_and_layer_norm_check_parameter_shapes() -> None:
    p = np.ones(3, np.float32)
    assert rule(Op.BATCH_NORM, None, [f32(1, 3, 2, 2), p, p, p, p]) == [f32(1, 3, 2, 2)]
    with pytest.raises(GraphError, match=r"scale has shape \(4,\), want \(3,\)"):
        rule(Op.BATCH_NORM, None, [f32(1, 3, 2, 2), np.ones(4, np.float32), p, p, p])
    from qfuse.ir.ops import LayerNormAttrs

    assert rule(Op.LAYER_NORM, LayerNormAttrs(2), [f32(2, 5, 8), np.ones(8, np.float32)]) == [
        f32(2, 5, 8)]
    with pytest.raises(GraphError, match="scale of shape"):
        rule(Op.LAYER_NORM, LayerNormAttrs(2), [f32(2, 5, 8), np.ones(5, np.float32)])


@pytest.mark.parametrize(("op", "attrs"), [
    (Op.CLIP, ClipAttrs(0.0, 6.0)), (Op.LEAKY_RELU, AlphaAttrs()), (Op.SIGMOID, None),
    (Op.TANH, None), (Op.HARD_SIGMOID, HardSigmoidAttrs()), (Op.HARD_SWISH, None),
    (Op.GELU, GeluAttrs()),
])
def test_unary_ops_keep_shape_and_type_and_drop_quant(op: Op, attrs: object) -> None:
    x = TensorInfo((2, 3, 4), DType.S8, QuantParams.make(0.1, 0))
    assert rule(op, attrs, [f32(2, 3, 4)]) == [f32(2, 3, 4)]
    assert rule(op, attrs, [x]) == [TensorInfo((2, 3, 4), DType.S8)]


@pytest.mark.parametrize("op", [Op.SUB, Op.DIV])
def test_sub_div_broadcast_and_mix_int_with_float(op: Op) -> None:
    assert rule(op, None, [TensorInfo((1, 3), DType.U8), np.ones((2, 1), np.float32)]) == [
        f32(2, 3)]
    with pytest.raises(GraphError, match="inputs mix element types u8, s8"):
        rule(op, None, [TensorInfo((3,), DType.U8), TensorInfo((3,), DType.S8)])


def test_softmax_axis_in_range() -> None:
    assert rule(Op.SOFTMAX, AxisAttrs(2), [f32(2, 3, 4)]) == [f32(2, 3, 4)]
    with pytest.raises(GraphError, match=r"'n' \(Softmax\): axis 3 is out of range for rank 3"):
        rule(Op.SOFTMAX, AxisAttrs(3), [f32(2, 3, 4)])
