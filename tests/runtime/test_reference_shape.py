"""Data-movement ops vs ONNX Runtime: exact (they move or pick values; Resize linear within
reference_harness.FLOAT_TOL)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reference_harness import Case, compare, randn

from qfuse.ir.ops import (
    AxesAttrs,
    AxisAttrs,
    CastAttrs,
    NoAttrs,
    Op,
    PadAttrs,
    PadMode,
    ReshapeAttrs,
    ResizeAttrs,
    ResizeMode,
    SliceAttrs,
    SplitAttrs,
    TransposeAttrs,
)
from qfuse.ir.types import DType

I64 = np.int64
INT64_MIN, INT64_MAX = np.iinfo(I64).min, np.iinfo(I64).max


def _x(*shape: int, seed: int = 0) -> np.ndarray:
    return randn(np.random.default_rng(seed), *shape)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat(axis: int) -> None:
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    compare(Case("Concat", {"axis": axis}, Op.CONCAT, AxisAttrs(axis),
                 {f"x{i}": _x(*s, seed=i) for i, s in enumerate(shapes)}))


@pytest.mark.parametrize("axis, sizes", [(1, (2, 3, 1)), (0, (1, 3)), (2, (5,))])
def test_split(axis: int, sizes: tuple[int, ...]) -> None:
    shape = [4, 6, 5]
    shape[axis] = sum(sizes)
    compare(Case("Split", {"axis": axis}, Op.SPLIT, SplitAttrs(axis, sizes),
                 {"x": _x(*shape)}, {"split": np.array(sizes, I64)}, order=["x"],
                 onnx_order=["x", "split"], n_outputs=len(sizes)))


SLICES = [
    # starts, ends, axes, steps (raw ONNX values; the reference applies ONNX's rules)
    ((1,), (4,), (1,), (1,)),
    ((0, 1), (INT64_MAX, -1), (0, 2), (2, 1)),
    ((-1,), (INT64_MIN,), (1,), (-1,)),  # full reversal, through index 0
    ((5,), (1,), (1,), (-2,)),
    ((-2,), (-6,), (2,), (-1,)),
    ((4,), (-1,), (1,), (-1,)),  # raw -1 end = dim-1: empty
    ((10,), (0,), (1,), (-3,)),  # start clamped to dim-1
    ((-100,), (100,), (0,), (1,)),
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
def test_slice(starts: tuple[int, ...], ends: tuple[int, ...], axes: tuple[int, ...],
               steps: tuple[int, ...]) -> None:
    constants = {"starts": np.array(starts, I64), "ends": np.array(ends, I64),
                 "axes": np.array(axes, I64), "steps": np.array(steps, I64)}
    compare(Case("Slice", {}, Op.SLICE, SliceAttrs(starts, ends, axes, steps),
                 {"x": _x(3, 7, 6)}, constants, order=["x"],
                 onnx_order=["x", "starts", "ends", "axes", "steps"]))


@pytest.mark.parametrize("onnx_shape, shape", [((0, -1), (2, 12)), ((-1,), (24,)),
                                               ((2, 3, 2, 2), (2, 3, 2, 2)), ((4, 0, 0), (4, 3, 2))])
def test_reshape(onnx_shape: tuple[int, ...], shape: tuple[int, ...]) -> None:
    x = _x(2, 3, 4) if onnx_shape[0] != 4 else _x(4, 3, 2)
    compare(Case("Reshape", {}, Op.RESHAPE, ReshapeAttrs(shape), {"x": x},
                 {"shape": np.array(onnx_shape, I64)}, order=["x"],
                 onnx_order=["x", "shape"]))


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_flatten(axis: int) -> None:
    compare(Case("Flatten", {"axis": axis}, Op.FLATTEN, AxisAttrs(axis), {"x": _x(2, 3, 4)}))


@pytest.mark.parametrize("perm", [(0, 2, 3, 1), (3, 2, 1, 0), (1, 0, 2, 3)])
def test_transpose(perm: tuple[int, ...]) -> None:
    compare(Case("Transpose", {"perm": list(perm)}, Op.TRANSPOSE, TransposeAttrs(perm),
                 {"x": _x(2, 3, 4, 5)}))


@pytest.mark.parametrize("axes", [(0,), (0, 3), (3,)])
def test_squeeze(axes: tuple[int, ...]) -> None:
    compare(Case("Squeeze", {}, Op.SQUEEZE, AxesAttrs(axes), {"x": _x(1, 3, 4, 1)},
                 {"axes": np.array(axes, I64)}, order=["x"], onnx_order=["x", "axes"]))


@pytest.mark.parametrize("axes", [(0,), (1, 4), (0, 1, 5)])
def test_unsqueeze(axes: tuple[int, ...]) -> None:
    compare(Case("Unsqueeze", {}, Op.UNSQUEEZE, AxesAttrs(axes), {"x": _x(2, 3, 4)},
                 {"axes": np.array(axes, I64)}, order=["x"], onnx_order=["x", "axes"]))


@pytest.mark.parametrize("mode", list(PadMode))
@pytest.mark.parametrize("pads", [(0, 1, 2, 0, 0, 1, 3, 1), (0, 0, 1, 0, 0, 0, 0, 3),
                                  (0, 0, -1, 2, 0, 0, 1, -2)])
def test_pad(mode: PadMode, pads: tuple[int, ...]) -> None:
    value = 1.5 if mode is PadMode.CONSTANT else 0.0
    constants = {"pads": np.array(pads, I64), "value": np.float32(value)}
    compare(Case("Pad", {"mode": mode.value}, Op.PAD, PadAttrs(pads, mode, value),
                 {"x": _x(1, 2, 4, 5)}, constants, order=["x"],
                 onnx_order=["x", "pads", "value"]))


NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
TRANSFORMS = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]


def _resize_case(mode: ResizeMode, transform: str, nearest: str, in_shape: tuple[int, ...],
                 scales: tuple[float, ...] | None, sizes: tuple[int, ...] | None) -> Case:
    onnx_attrs = {"mode": mode.value, "coordinate_transformation_mode": transform}
    if mode is ResizeMode.NEAREST:
        onnx_attrs["nearest_mode"] = nearest
    if scales is not None:
        out = tuple(math.floor(i * s) for i, s in zip(in_shape, scales))
        constants = {"scales": np.array(scales, np.float32)}
        order = ["x", "", "scales"]
        attrs = ResizeAttrs(mode, out, tuple(float(np.float32(s)) for s in scales), transform,
                            nearest)
    else:
        assert sizes is not None
        constants = {"sizes": np.array(sizes, I64)}
        order = ["x", "", "", "sizes"]
        attrs = ResizeAttrs(mode, sizes, (), transform, nearest)
    x = np.arange(math.prod(in_shape), dtype=np.float32).reshape(in_shape)
    x = x * np.float32(0.37) - np.float32(3)
    return Case("Resize", onnx_attrs, Op.RESIZE, attrs, {"x": x}, constants, order=["x"],
                onnx_order=order)


@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("scales, sizes", [((1, 1, 2, 2), None), ((1, 1, 0.5, 0.5), None),
                                           ((1, 1, 1.5, 0.75), None), (None, (1, 2, 7, 3)),
                                           (None, (1, 2, 1, 9))])
def test_resize_nearest(nearest: str, transform: str, scales: tuple[float, ...] | None,
                        sizes: tuple[int, ...] | None) -> None:
    compare(_resize_case(ResizeMode.NEAREST, transform, nearest, (1, 2, 4, 6), scales, sizes))


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("scales, sizes", [((1, 1, 2, 2), None), ((1, 1, 0.5, 0.5), None),
                                           ((1, 1, 1.5, 0.75), None), (None, (1, 2, 7, 3)),
                                           (None, (1, 2, 1, 9))])
def test_resize_linear(transform: str, scales: tuple[float, ...] | None,
                       sizes: tuple[int, ...] | None) -> None:
    compare(_resize_case(ResizeMode.LINEAR, transform, "", (1, 2, 4, 6), scales, sizes))


def test_identity_dropout_cast() -> None:
    x = _x(2, 3) * np.float32(100)
    compare(Case("Identity", {}, Op.IDENTITY, NoAttrs(), {"x": x}))
    compare(Case("Dropout", {}, Op.DROPOUT, NoAttrs(), {"x": x}))
    compare(Case("Dropout", {}, Op.DROPOUT, NoAttrs(), {"x": x}, n_outputs=2))
    for to in (DType.S32, DType.S8, DType.U8, DType.F16, DType.BOOL):
        y = x if to not in (DType.S8, DType.U8) else np.clip(x, 0, 100)
        compare(Case("Cast", {"to": _onnx_type(to)}, Op.CAST,
                     CastAttrs(to), {"x": y}))


def _onnx_type(dtype: DType) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(dtype.np)


@pytest.mark.parametrize("reflect", [True, False])
def test_mirrored_is_numpy_pad(reflect: bool) -> None:
    """ops_shape.mirrored (a take of source rows per axis) is numpy.pad's reflect / edge for
    pads shorter than their axis, on random shapes and widths, every dtype byte kept."""
    from qfuse.runtime.reference.ops_shape import mirrored

    rng = np.random.default_rng(7)
    for _ in range(300):
        shape = tuple(int(n) for n in rng.integers(1, 7, rng.integers(1, 5)))
        widths = [(int(rng.integers(0, n if reflect else 5)),
                   int(rng.integers(0, n if reflect else 5))) for n in shape]
        x = rng.standard_normal(shape).astype(np.float32)
        want = np.pad(x, widths, mode="reflect" if reflect else "edge")
        got = mirrored(x, widths, reflect)
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32),
                                                          want.view(np.uint32))
