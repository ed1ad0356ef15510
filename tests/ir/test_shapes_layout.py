"""Shape rules of data-movement ops and Resize, and how quantization follows them."""

from __future__ import annotations

import numpy as np
import pytest
from shape_helpers import f32, onnx_shapes, rule

from qfuse.ir import DType, GraphError, Op, QuantParams, TensorInfo
from qfuse.ir.ops import (
    AxesAttrs,
    AxisAttrs,
    PadAttrs,
    PadMode,
    ReshapeAttrs,
    ResizeAttrs,
    ResizeMode,
    SliceAttrs,
    SplitAttrs,
    TransposeAttrs,
)

U8 = DType.U8
PER_T = QuantParams.make(0.25, 128)
PER_C = QuantParams.make([0.1, 0.2, 0.3], [0, 1, 2], axis=1)


def u8(*shape: int, quant: QuantParams | None = PER_T) -> TensorInfo:
    return TensorInfo(tuple(shape), U8, quant)


# ------------------------------------------------------------------------------- Split
@pytest.mark.parametrize(("shape", "axis", "sizes"), [
    ((2, 6, 4), 1, (1, 2, 3)), ((5, 4), 0, (2, 3)), ((3, 9), 1, (3, 3, 3)),
])
def test_split_matches_onnx(shape: tuple[int, ...], axis: int, sizes: tuple[int, ...]) -> None:
    outs = rule(Op.SPLIT, SplitAttrs(axis, sizes), [f32(*shape)], n_out=len(sizes))
    expected = onnx_shapes("Split", [shape, np.array(sizes, np.int64)], n_out=len(sizes),
                           axis=axis)
    assert [o.shape for o in outs] == expected


def test_split_sizes_must_add_up() -> None:
    with pytest.raises(GraphError, match=r"'n' \(Split\): split sizes \(2, 2\) do not add up"):
        rule(Op.SPLIT, SplitAttrs(1, (2, 2)), [f32(1, 5)], n_out=2)


def test_split_takes_the_channel_scales() -> None:
    outs = rule(Op.SPLIT, SplitAttrs(1, (1, 2)), [u8(1, 3, 2, quant=PER_C)], n_out=2)
    assert outs[0].quant == QuantParams(PER_C.scale[:1], (0,), None)
    assert outs[1].quant == QuantParams(PER_C.scale[1:], (1, 2), 1)
    outs = rule(Op.SPLIT, SplitAttrs(2, (1, 1)), [u8(1, 3, 2, quant=PER_C)], n_out=2)
    assert outs[0].quant == PER_C


# ------------------------------------------------------------------------------- Slice
SLICE_CASES = [
    # shape, starts, ends, axes, steps
    ((10, 8), (2,), (7,), (0,), (1,)),
    ((10, 8), (-3,), (100,), (0,), (1,)),
    ((10, 8), (-100,), (-2,), (1,), (2,)),
    ((10, 8), (8,), (1,), (0,), (-2,)),
    ((10, 8), (-1,), (-100,), (0,), (-1,)),
    ((10, 8), (100,), (-100,), (1,), (-3,)),
    ((4, 6, 8), (1, 0), (3, 8), (-1, 1), (2, 3)),
    ((10,), (5,), (2,), (0,), (1,)),
]


@pytest.mark.parametrize(("shape", "starts", "ends", "axes", "steps"), SLICE_CASES)
def test_slice_matches_onnx_and_numpy(shape: tuple[int, ...], starts: tuple[int, ...],
                                      ends: tuple[int, ...], axes: tuple[int, ...],
                                      steps: tuple[int, ...]) -> None:
    (out,) = rule(Op.SLICE, SliceAttrs(starts, ends, axes, steps), [f32(*shape)])
    consts = [np.array(v, np.int64) for v in (starts, ends, axes, steps)]
    assert out.shape == onnx_shapes("Slice", [shape, *consts])[0]
    index = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        index[a] = slice(s, e, st)
    assert out.shape == np.zeros(shape)[tuple(index)].shape


def test_slice_of_channels_keeps_their_scales_in_order() -> None:
    (out,) = rule(Op.SLICE, SliceAttrs((2,), (-4,), (1,), (-2,)), [u8(1, 3, quant=PER_C)])
    assert out.quant == QuantParams((PER_C.scale[2], PER_C.scale[0]), (2, 0), 1)


def test_slice_step_zero_is_an_error() -> None:
    with pytest.raises(GraphError, match="step 0"):
        rule(Op.SLICE, SliceAttrs((0,), (1,), (0,), (0,)), [f32(3)])


# ------------------------------------------------------------- Reshape, Flatten, Transpose
def test_reshape_checks_size_and_tracks_the_channel_axis() -> None:
    x = u8(2, 3, 4, quant=PER_C)
    (out,) = rule(Op.RESHAPE, ReshapeAttrs((2, 1, 3, 2, 2)), [x])
    assert out.shape == (2, 1, 3, 2, 2) and out.quant == QuantParams(PER_C.scale,
                                                                     PER_C.zero_point, 2)
    (out,) = rule(Op.RESHAPE, ReshapeAttrs((6, 4)), [x])
    assert out.quant is None and out.dtype is U8
    (out,) = rule(Op.RESHAPE, ReshapeAttrs((24,)), [u8(2, 3, 4)])
    assert out.quant == PER_T
    with pytest.raises(GraphError, match=r"cannot reshape \(2, 3, 4\)"):
        rule(Op.RESHAPE, ReshapeAttrs((5, 5)), [x])


def test_flatten() -> None:
    assert rule(Op.FLATTEN, AxisAttrs(2), [f32(2, 3, 4, 5)]) == [f32(6, 20)]
    assert rule(Op.FLATTEN, AxisAttrs(0), [f32(2, 3)]) == [f32(1, 6)]
    (out,) = rule(Op.FLATTEN, AxisAttrs(1), [u8(1, 3, 1, 1, quant=PER_C)])
    assert out.shape == (1, 3) and out.quant == PER_C


def test_transpose_moves_the_channel_axis() -> None:
    (out,) = rule(Op.TRANSPOSE, TransposeAttrs((0, 2, 3, 1)), [u8(1, 3, 4, 5, quant=PER_C)])
    assert out.shape == (1, 4, 5, 3) and out.quant is not None and out.quant.axis == 3
    with pytest.raises(GraphError, match="not a permutation"):
        rule(Op.TRANSPOSE, TransposeAttrs((0, 0)), [f32(2, 2)])


def test_squeeze_unsqueeze() -> None:
    (out,) = rule(Op.SQUEEZE, AxesAttrs((0, 2)), [u8(1, 3, 1, quant=PER_C)])
    assert out.shape == (3,) and out.quant == QuantParams(PER_C.scale, PER_C.zero_point, 0)
    with pytest.raises(GraphError, match="cannot squeeze axis 1 of size 3"):
        rule(Op.SQUEEZE, AxesAttrs((1,)), [f32(1, 3)])
    (out,) = rule(Op.UNSQUEEZE, AxesAttrs((0, 3)), [u8(2, 3, quant=QuantParams.make(
        [1.0, 2.0, 3.0], 0, axis=1))])
    assert out.shape == (1, 2, 3, 1) and out.quant is not None and out.quant.axis == 2
    assert rule(Op.UNSQUEEZE, AxesAttrs((-1,)), [f32(2)]) == [f32(2, 1)]


# ----------------------------------------------------------------------------- Concat, Pad
def test_concat_shapes_and_quant() -> None:
    assert rule(Op.CONCAT, AxisAttrs(1), [f32(1, 2, 4), f32(1, 3, 4)]) == [f32(1, 5, 4)]
    with pytest.raises(GraphError, match=r"'n' \(Concat\): input 1"):
        rule(Op.CONCAT, AxisAttrs(1), [f32(1, 2, 4), f32(1, 3, 5)])
    same = rule(Op.CONCAT, AxisAttrs(1), [u8(1, 2), u8(1, 3)])[0]
    assert same.quant == PER_T
    other = QuantParams.make(0.5, 128)
    assert rule(Op.CONCAT, AxisAttrs(1), [u8(1, 2), u8(1, 3, quant=other)])[0].quant is None
    joined = rule(Op.CONCAT, AxisAttrs(1), [u8(2, 3, quant=PER_C), u8(2, 3, quant=PER_C)])[0]
    assert joined.quant is not None and len(joined.quant.scale) == 6


def test_pad_shapes_modes_and_quant() -> None:
    (out,) = rule(Op.PAD, PadAttrs((0, 0, 1, 2, 0, 0, 3, 4)), [u8(1, 3, 4, 4, quant=PER_C)])
    assert out.shape == (1, 3, 8, 10) and out.quant == PER_C
    (out,) = rule(Op.PAD, PadAttrs((0, 1, 0, 0)), [u8(1, 3, quant=PER_C)])
    assert out.shape == (1, 4) and out.quant is None
    with pytest.raises(GraphError, match="reflect pads"):
        rule(Op.PAD, PadAttrs((0, 4, 0, 0), PadMode.REFLECT), [f32(1, 4)])
    assert rule(Op.PAD, PadAttrs((0, -1, 0, 0)), [f32(1, 4)]) == [f32(1, 3)]


# ---------------------------------------------------------------------------------- Resize
def test_resize_matches_onnx_and_keeps_quant_for_nearest() -> None:
    scales = np.array([1, 1, 2, 1.5], np.float32)
    expected = onnx_shapes("Resize", [(1, 3, 5, 6), np.zeros(0, np.float32), scales],
                           mode="nearest")
    attrs = ResizeAttrs(ResizeMode.NEAREST, (1, 3, 10, 9), (1.0, 1.0, 2.0, 1.5))
    (out,) = rule(Op.RESIZE, attrs, [u8(1, 3, 5, 6, quant=PER_C)])
    assert out.shape == expected[0] and out.quant == PER_C
    linear = ResizeAttrs(ResizeMode.LINEAR, (1, 3, 10, 9), (1.0, 1.0, 2.0, 1.5))
    assert rule(Op.RESIZE, linear, [u8(1, 3, 5, 6)])[0].quant is None
    with pytest.raises(GraphError, match="3 output sizes for an input of rank 4"):
        rule(Op.RESIZE, ResizeAttrs(ResizeMode.NEAREST, (1, 3, 10), ()), [f32(1, 3, 5, 6)])


def test_identity_dropout_keep_everything() -> None:
    x = u8(2, 3, quant=PER_C)
    assert rule(Op.IDENTITY, None, [x]) == [x]
    assert rule(Op.DROPOUT, None, [x]) == [x]
