"""Data movement: Concat, Split, Slice, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Pad,
Resize, Identity, Dropout (inference: identity), Cast.

Slice follows ONNX on the attribute values: a negative start/end counts from the end, then
start/end are clamped to [0, dim] (step > 0) or to [0, dim-1] / [-1, dim-1] (step < 0), where
an end of -1 *after* clamping means "through index 0" (ir/shapes/layout.py reads them the same
way; an importer that resolves a negative-step slice running to the start must store an end
<= -dim-1, e.g. INT64_MIN as ONNX does, never -1).

Resize (ONNX, as ONNX Runtime computes it): per resized dim with scale ``sc`` (the ``scales``
attribute, or out/in in float32 when only sizes are known) the output index ``o`` maps to the
input coordinate, in float32:

    half_pixel            (o + 0.5) / sc - 0.5
    pytorch_half_pixel    (o + 0.5) / sc - 0.5 if out > 1 else 0
    align_corners         o · (in - 1) / (out - 1) if out > 1 else 0
    asymmetric            o / sc
    tf_half_pixel_for_nearest   (o + 0.5) / sc
    half_pixel_symmetric  in/2 · (1 - out/(in·sc)) + (o + 0.5) / sc - 0.5

nearest picks round_prefer_floor / round_prefer_ceil / floor / ceil of it, clamped to
[0, in-1]; linear clamps the coordinate to [0, in-1] and interpolates between floor and floor+1
(dim by dim, which is N-linear interpolation; bilinear on the last two dims is a special case).
"""

from __future__ import annotations

import math

import numpy as np

from ir.graph import Node
from ir.ops import (
    AxesAttrs,
    AxisAttrs,
    CastAttrs,
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
from runtime.reference.registry import Arrays, impl, need

F32 = np.float32


@impl(Op.CONCAT)
def concat(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: AxisAttrs = node.attrs
    return [np.concatenate([need(args, i) for i in range(len(args))], axis=attrs.axis)]


@impl(Op.SPLIT)
def split(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: SplitAttrs = node.attrs
    x = need(args, 0)
    if sum(attrs.sizes) != x.shape[attrs.axis]:
        raise ValueError(f"split sizes {attrs.sizes} do not add up to {x.shape[attrs.axis]}")
    bounds = np.cumsum(attrs.sizes)[:-1]
    return [part.copy() for part in np.split(x, bounds, axis=attrs.axis)]


def onnx_slice(dim: int, start: int, end: int, step: int) -> slice:
    """The python slice taking what ONNX Slice takes along a dim (module docstring)."""
    if step == 0:
        raise ValueError("slice step 0")
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


@impl(Op.SLICE)
def slice_(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: SliceAttrs = node.attrs
    x = need(args, 0)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(attrs.starts, attrs.ends, attrs.axes, attrs.steps,
                                      strict=True):
        axis = axis + x.ndim if axis < 0 else axis
        index[axis] = onnx_slice(x.shape[axis], start, end, step)
    return [x[tuple(index)].copy()]


@impl(Op.RESHAPE)
def reshape(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: ReshapeAttrs = node.attrs
    return [need(args, 0).reshape(attrs.shape).copy()]


@impl(Op.FLATTEN)
def flatten(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: AxisAttrs = node.attrs
    x = need(args, 0)
    return [x.reshape(math.prod(x.shape[:attrs.axis]), -1).copy()]


@impl(Op.TRANSPOSE)
def transpose(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: TransposeAttrs = node.attrs
    return [np.ascontiguousarray(np.transpose(need(args, 0), attrs.perm))]


@impl(Op.SQUEEZE)
def squeeze(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: AxesAttrs = node.attrs
    x = need(args, 0)
    axes = attrs.axes or tuple(i for i, d in enumerate(x.shape) if d == 1)
    return [np.squeeze(x, axis=axes).copy()]


@impl(Op.UNSQUEEZE)
def unsqueeze(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: AxesAttrs = node.attrs
    return [np.expand_dims(need(args, 0), tuple(attrs.axes)).copy()]


@impl(Op.PAD)
def pad(node: Node, args: Arrays) -> list[np.ndarray]:
    """ONNX Pad: begins then ends per dim; a negative pad crops."""
    attrs: PadAttrs = node.attrs
    x = need(args, 0)
    n = x.ndim
    if len(attrs.pads) != 2 * n:
        raise ValueError(f"{len(attrs.pads)} pads for a rank-{n} input")
    begins, ends = attrs.pads[:n], attrs.pads[n:]
    x = x[tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0))
                for i, (b, e) in enumerate(zip(begins, ends)))]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
    if attrs.mode is PadMode.CONSTANT:
        return [np.pad(x, widths, constant_values=x.dtype.type(attrs.value))]
    return [np.pad(x, widths, mode="reflect" if attrs.mode is PadMode.REFLECT else "edge")]


def _source_coords(mode: str, out: int, size: int, scale: np.float32) -> np.ndarray:
    o = np.arange(out, dtype=F32)
    half = F32(0.5)
    if mode == "half_pixel":
        return (o + half) / scale - half
    if mode == "pytorch_half_pixel":
        return (o + half) / scale - half if out > 1 else np.zeros(out, F32)
    if mode == "align_corners":
        return o * F32(size - 1) / F32(out - 1) if out > 1 else np.zeros(out, F32)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nearest":
        return (o + half) / scale
    if mode == "half_pixel_symmetric":
        adjustment = F32(out) / (F32(size) * scale)
        offset = F32(size) / F32(2) * (F32(1) - adjustment)
        return offset + (o + half) / scale - half
    raise ValueError(f"coordinate_transformation_mode {mode!r} is not supported")


def _nearest(coords: np.ndarray, mode: str, size: int) -> np.ndarray:
    if mode == "round_prefer_floor":
        index = np.where(coords - np.floor(coords) == F32(0.5), np.floor(coords),
                         np.round(coords))
    elif mode == "round_prefer_ceil":
        index = np.floor(coords + F32(0.5))
    elif mode == "floor":
        index = np.floor(coords)
    elif mode == "ceil":
        index = np.ceil(coords)
    else:
        raise ValueError(f"nearest_mode {mode!r} is not supported")
    return np.clip(index, 0, size - 1).astype(np.int64)


@impl(Op.RESIZE)
def resize(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: ResizeAttrs = node.attrs
    x = need(args, 0)
    if len(attrs.sizes) != x.ndim:
        raise ValueError(f"{len(attrs.sizes)} output sizes for a rank-{x.ndim} input")
    if attrs.mode is ResizeMode.LINEAR and x.dtype != F32:
        raise ValueError(f"linear Resize reads float32, got {x.dtype}")
    y = x
    for axis, (size, out) in enumerate(zip(x.shape, attrs.sizes)):
        scale = F32(attrs.scales[axis]) if attrs.scales else F32(out) / F32(size)
        if out == size and scale == F32(1):
            continue
        coords = _source_coords(attrs.coordinate_transformation_mode, out, size, scale)
        if attrs.mode is ResizeMode.NEAREST:
            y = np.take(y, _nearest(coords, attrs.nearest_mode, size), axis=axis)
            continue
        coords = np.clip(coords, F32(0), F32(size - 1))
        low = np.floor(coords).astype(np.int64)
        high = np.minimum(low + 1, size - 1)
        frac = (coords - low.astype(F32)).reshape((-1,) + (1,) * (x.ndim - axis - 1))
        y = np.take(y, low, axis=axis) * (F32(1) - frac) + np.take(y, high, axis=axis) * frac
    return [np.array(y, dtype=x.dtype, copy=True)]


@impl(Op.IDENTITY)
def identity(node: Node, args: Arrays) -> list[np.ndarray]:
    return [need(args, 0).copy()]


@impl(Op.DROPOUT)
def dropout(node: Node, args: Arrays) -> list[np.ndarray]:
    """Inference: the input unchanged, and an all-true mask when the node has that output."""
    x = need(args, 0)
    return [x.copy(), np.ones(x.shape, dtype=bool)][:len(node.outputs)]


@impl(Op.CAST)
def cast(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: CastAttrs = node.attrs
    with np.errstate(invalid="ignore", over="ignore"):
        return [need(args, 0).astype(attrs.to.np)]
