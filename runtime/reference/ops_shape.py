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

When no dim changes size the input is copied (ONNX Runtime does too). nearest leaves a dim of
scale 1 and unchanged size alone and elsewhere picks round_prefer_floor / round_prefer_ceil /
floor / ceil of the coordinate, clamped to [0, in-1].

linear is bit-exact with ONNX Runtime's float32 kernel (``upsample.cc``
``SetupUpsampleBilinear`` / ``UpsampleBilinear`` / ``UpsampleTrilinear``; checked by
tests/runtime/test_reference_ort_kernels.py). Per interpolated axis, in float32: ``c`` = the
coordinate (``o`` itself when the axis's scale is exactly 1) clamped to [0, in-1],
``lo = min(int(c), in-1)``, ``hi = min(lo+1, in-1)``, ``w_lo = |c - hi|``, ``w_hi = |c - lo|``
(both 0.5 when lo == hi; ``1 - frac`` would round differently). The output is the sum over
the 2^m corners, the last axis varying fastest, of ``(w_last · ... · w_first) · x[corner]``,
added left to right — bilinear: ``dx2·dy2·X11 + dx1·dy2·X21 + dx2·dy1·X12 + dx1·dy1·X22``.
The axes interpolated together are ONNX Runtime's: all of a rank-2 or rank-3 input, dims 2-3
of a rank-4 input whose first two scales are 1 (dims 1-2 if the first and last are), dims 2-4
of a rank-5 input; an axis of scale 1 among them still contributes its (0/1 or 0.5/0.5)
weights. Other layouts, which ONNX Runtime rejects, interpolate every axis that changes, by the
same formula.

cubic is bit-exact with ONNX Runtime's ``ResizeBiCubic`` (the importer admits what that kernel
takes: float32, 2-D or 4-D with N and C not scaled; checked by
tests/runtime/test_reference_ort_kernels.py). Per axis (H, W), in float32: ``c`` = the
coordinate (``o`` itself when the scale is exactly 1), ``s = c - floor(c)``, and Keys' kernel
with ``a = cubic_coeff_a`` at distances ``s + 1, s, 1 - s, 2 - s`` gives the weights of input
rows (columns) ``floor(c) - 1 .. floor(c) + 2``, each index clamped to [0, in - 1]. With
``exclude_outside`` the weights of indices outside are 0 and each weight is divided by their
sum. Each input row is interpolated along W first, ``((0 + (w0/Σ)·x0) + (w1/Σ)·x1) + ...``,
then those four results along H, ``((0 + (r0·v0)/Σ) + (r1·v1)/Σ) + ...`` (Σ = 1 without
exclude_outside, so the divisions are exact).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from qfuse.ir.graph import Node
from qfuse.ir.ops import (
    AxesAttrs,
    AxisAttrs,
    CastAttrs,
    DepthToSpaceAttrs,
    ExpandAttrs,
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
from qfuse.runtime.onednn.reference import resampling_nearest_index
from qfuse.runtime.reference.registry import Arrays, impl, need

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


@impl(Op.EXPAND)
def expand(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: ExpandAttrs = node.attrs
    return [np.broadcast_to(need(args, 0), attrs.shape).copy()]


@impl(Op.DEPTH_TO_SPACE)
def depth_to_space(node: Node, args: Arrays) -> list[np.ndarray]:
    """ONNX's definition: a reshape to 6-D, a transpose, a reshape back."""
    attrs: DepthToSpaceAttrs = node.attrs
    x = need(args, 0)
    n, c, h, w = x.shape
    b = attrs.blocksize
    if attrs.mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [np.ascontiguousarray(t).reshape(n, c // (b * b), h * b, w * b)]


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
    if 0 in x.shape or (attrs.mode is PadMode.REFLECT
                        and any(max(w) >= n for w, n in zip(widths, x.shape))):
        # reflected more than once, or nothing to repeat
        return [np.pad(x, widths, mode="reflect" if attrs.mode is PadMode.REFLECT else "edge")]
    return [mirrored(x, widths, attrs.mode is PadMode.REFLECT)]


def mirrored(x: np.ndarray, widths: Sequence[tuple[int, int]], reflect: bool) -> np.ndarray:
    """``numpy.pad(x, widths, mode="reflect" or "edge")`` for pads shorter than their axis (one
    reflection), as one ``take`` of the source rows per padded axis: the same values, about
    a third of numpy.pad's time on small arrays (11 → 3 us for a 512-sample signal padded
    by 32 on each side, silero-vad's STFT)."""
    for axis, rows in mirror_rows(x.shape, widths, reflect):
        x = np.take(x, rows, axis=axis)
    return x


def mirror_rows(shape: Sequence[int], widths: Sequence[tuple[int, int]], reflect: bool
                ) -> list[tuple[int, np.ndarray]]:
    """Per padded axis, the source rows a reflect / edge pad (shorter than the axis) reads in
    output order: ``mirrored`` takes them; a lowering computes them once."""
    found = []
    for axis, ((b, e), n) in enumerate(zip(widths, shape)):
        if not b and not e:
            continue
        if reflect:
            rows = np.concatenate([np.arange(b, 0, -1), np.arange(n),
                                   np.arange(n - 2, n - 2 - e, -1)])
        else:
            rows = np.concatenate([np.zeros(b, np.intp), np.arange(n), np.full(e, n - 1, np.intp)])
        found.append((axis, rows))
    return found


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


def _linear_axes(scales: list[np.float32], rank: int) -> tuple[int, ...] | None:
    """The axes ONNX Runtime interpolates together (upsample.cc), or None if it has no kernel."""
    one = [s == F32(1) for s in scales]
    if rank in (2, 3):
        return tuple(range(rank))
    if rank == 4 and one[0] and one[1]:
        return (2, 3)
    if rank == 4 and one[0] and one[3]:
        return (1, 2)
    if rank == 5 and one[0] and one[1]:
        return (2, 3, 4)
    return None


def _linear_taps(mode: str, out: int, size: int, scale: np.float32) -> tuple[np.ndarray, ...]:
    """``SetupUpsampleBilinear`` for one axis: low / high index and their float32 weights."""
    coords = np.arange(out, dtype=F32)
    if scale != F32(1):
        coords = _source_coords(mode, out, size, scale)
    coords = np.maximum(F32(0), np.minimum(coords, F32(size - 1)))
    low = np.minimum(coords.astype(np.int64), size - 1)
    high = np.minimum(low + 1, size - 1)
    w_low = np.abs(coords - high.astype(F32))  # ORT's d2 weighs the low tap
    w_high = np.abs(coords - low.astype(F32))
    same = low == high
    return (low, high, np.where(same, F32(0.5), w_low).astype(F32),
            np.where(same, F32(0.5), w_high).astype(F32))


def resize_scales(attrs: ResizeAttrs, shape: tuple[int, ...]) -> list[np.float32]:
    """The float32 scale of each dim: the ``scales`` attribute, else out / in."""
    return [F32(attrs.scales[a]) if attrs.scales else F32(out) / F32(size)
            for a, (size, out) in enumerate(zip(shape, attrs.sizes))]


def nearest_indices(attrs: ResizeAttrs, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """The input index nearest Resize takes for each output index along ``axis``; None when
    the axis is left alone (scale 1, size unchanged)."""
    size, out = shape[axis], attrs.sizes[axis]
    scale = resize_scales(attrs, shape)[axis]
    if out == size and scale == F32(1):
        return None
    coords = _source_coords(attrs.coordinate_transformation_mode, out, size, scale)
    return _nearest(coords, attrs.nearest_mode, size)


def onednn_nearest_mismatch(attrs: ResizeAttrs, shape: tuple[int, ...]) -> str | None:
    """Why oneDNN's nearest resampling of ``shape`` would read other input elements than the
    nearest Resize ``attrs`` (None: ONNX's source index on every output index of every dim;
    the lowering runs oneDNN then, compiler/lower/lower_resize.py)."""
    modes = f"{attrs.coordinate_transformation_mode}/{attrs.nearest_mode}"
    for axis, (size, out) in enumerate(zip(shape, attrs.sizes, strict=True)):
        theirs = nearest_indices(attrs, shape, axis)
        if theirs is None:
            theirs = np.arange(size)
        ours = np.arange(size) if axis < 2 else resampling_nearest_index(size, out)
        if ours.shape != theirs.shape:
            return f"dim {axis} is resized ({size} → {out}): oneDNN resamples spatial dims only"
        wrong = np.flatnonzero(ours != theirs)
        if wrong.size:
            o = int(wrong[0])
            return (f"nearest {modes}, dim {axis} {size} → {out}: output {o} reads input "
                    f"{int(theirs[o])}, oneDNN's nearest would read {int(ours[o])} "
                    f"({wrong.size} of {out} indices differ)")
    return None


def whole_factor_enlargement(shape: Sequence[int], out: Sequence[int]) -> bool:
    """``shape`` → ``out`` enlarges only spatial dims (N and C kept, rank 3 or more), each by a
    whole factor: a nearest Resize there (where oneDNN's indices are ONNX's) reads source
    index ``o // k`` at output ``o`` of a dim enlarged k times, so it is a copy from a view of
    the source repeating each element (compiler/lower/layouts.py ``repeating_views``)."""
    return (len(shape) >= 3 and tuple(shape[:2]) == tuple(out[:2])
            and tuple(shape) != tuple(out)
            and all(o % i == 0 for o, i in zip(out[2:], shape[2:])))


def linear_taps(attrs: ResizeAttrs, shape: tuple[int, ...]
                ) -> dict[int, tuple[np.ndarray, ...]]:
    """Per interpolated axis (in order): low / high input index and their float32 weights."""
    scales = resize_scales(attrs, shape)
    axes = _linear_axes(scales, len(shape))
    if axes is None:
        axes = tuple(i for i, (size, out) in enumerate(zip(shape, attrs.sizes))
                     if out != size or scales[i] != F32(1))
    return {a: _linear_taps(attrs.coordinate_transformation_mode, attrs.sizes[a], shape[a],
                            scales[a]) for a in axes}


def _resize_linear(x: np.ndarray, attrs: ResizeAttrs) -> np.ndarray:
    """Bi-/trilinear Resize in float32, term by term as ONNX Runtime (ops_shape docstring)."""
    taps = linear_taps(attrs, x.shape)
    axes = tuple(taps)
    y = None
    # Corners with the last axis varying fastest; weight = w_last · ... · w_first, left to right.
    for corner in itertools.product((0, 1), repeat=len(axes)):
        picked, weight = x, None
        for a, bit in zip(axes, corner):
            picked = np.take(picked, taps[a][bit], axis=a)
        for a, bit in reversed(list(zip(axes, corner))):
            w = taps[a][2 + bit].reshape((-1,) + (1,) * (x.ndim - a - 1))
            weight = w if weight is None else weight * w
        term = weight * picked
        y = term if y is None else y + term
    return x.copy() if y is None else y


def _keys_weights(s: np.ndarray, a: np.float32) -> np.ndarray:
    """Keys' cubic convolution weights (ONNX Runtime's ``GetCubicCoeffs``, float32) of the
    four taps at distances ``s + 1, s, 1 - s, 2 - s``: shape (len(s), 4)."""
    one, two, three, five, eight, four = (F32(v) for v in (1, 2, 3, 5, 8, 4))
    far = [s + one, two - s]  # the outer taps: a|x|³ - 5a|x|² + 8a|x| - 4a
    near = [s, one - s]  # the inner taps: (a + 2)|x|³ - (a + 3)|x|² + 1
    outer = [((a * d - five * a) * d + eight * a) * d - four * a for d in far]
    inner = [((a + two) * d - (a + three)) * d * d + one for d in near]
    return np.stack([outer[0], inner[0], inner[1], outer[1]], axis=1).astype(F32)


def cubic_taps(attrs: ResizeAttrs, size: int, out: int, scale: np.float32
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One axis of bicubic Resize: the four input indices of each output index (clamped),
    their float32 weights, and the weights' sum per output index (1 unless exclude_outside)."""
    coords = np.arange(out, dtype=F32)
    if scale != F32(1):
        coords = _source_coords(attrs.coordinate_transformation_mode, out, size, scale)
    floor = np.floor(coords)
    weights = _keys_weights((coords - floor).astype(F32), F32(attrs.cubic_coeff_a))
    index = floor.astype(np.int64)[:, None] + np.arange(-1, 3)
    total = np.ones(out, F32)
    if attrs.exclude_outside:
        weights = np.where((index < 0) | (index >= size), F32(0), weights).astype(F32)
        total = np.zeros(out, F32)
        for k in range(4):
            total += weights[:, k]  # summed left to right
    return np.clip(index, 0, size - 1), weights, total


class CubicResize:
    """Bicubic Resize of the last two dims of a float32 array of ``shape`` (module
    docstring), its taps computed once: one 4-tap pass per axis over row-major copies (each
    gather picks whole rows). The lowering keeps one per node (compile time); ``resize``
    makes one per call."""

    def __init__(self, attrs: ResizeAttrs, shape: tuple[int, ...]) -> None:
        h, w = shape[-2:]
        out_h, out_w = attrs.sizes[-2:]
        scales = resize_scales(attrs, shape)
        self.rows, self.row_w, row_sum = cubic_taps(attrs, h, out_h, scales[-2])
        cols, col_w, col_sum = cubic_taps(attrs, w, out_w, scales[-1])
        self.cols, self.col_w = cols, (col_w / col_sum[:, None]).astype(F32)
        self.row_sum = row_sum[:, None] if attrs.exclude_outside else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        across = np.ascontiguousarray(np.swapaxes(x, -1, -2))  # (..., W, H): columns as rows
        t = None
        for k in range(4):
            term = np.take(across, self.cols[:, k], axis=-2)
            term *= self.col_w[:, k, None]
            t = term + F32(0) if t is None else np.add(t, term, out=t)  # ORT starts from +0
        assert t is not None
        along = np.ascontiguousarray(np.swapaxes(t, -1, -2))  # (..., H, out W)
        y = None
        for k in range(4):
            term = np.take(along, self.rows[:, k], axis=-2)
            term *= self.row_w[:, k, None]
            if self.row_sum is not None:
                term /= self.row_sum
            y = term + F32(0) if y is None else np.add(y, term, out=y)
        assert y is not None
        return y


@impl(Op.RESIZE)
def resize(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: ResizeAttrs = node.attrs
    x = need(args, 0)
    if len(attrs.sizes) != x.ndim:
        raise ValueError(f"{len(attrs.sizes)} output sizes for a rank-{x.ndim} input")
    if attrs.mode is not ResizeMode.NEAREST and x.dtype != F32:
        raise ValueError(f"{attrs.mode.value} Resize reads float32, got {x.dtype}")
    if tuple(attrs.sizes) == x.shape:
        return [x.copy()]  # ONNX Runtime copies when no dim changes size, whatever the scales
    if attrs.mode is ResizeMode.LINEAR:
        return [np.ascontiguousarray(_resize_linear(x, attrs), dtype=F32)]
    if attrs.mode is ResizeMode.CUBIC:
        if x.ndim not in (2, 4) or tuple(attrs.sizes[:-2]) != x.shape[:-2]:
            raise ValueError(f"cubic Resize of {x.shape} to {attrs.sizes}: 2-D, or 4-D with "
                             "N and C unchanged")
        return [CubicResize(attrs, x.shape)(x)]
    y = x
    for axis in range(x.ndim):
        index = nearest_indices(attrs, x.shape, axis)
        if index is not None:
            y = np.take(y, index, axis=axis)
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
