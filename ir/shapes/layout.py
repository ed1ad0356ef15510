"""Shape rules of the data-movement ops.

All of them keep x's element type. They keep its quantization parameters too (they move
values without arithmetic); per-axis parameters follow their axis when it can be tracked:
Transpose permutes it, Squeeze/Unsqueeze shift it, Reshape/Flatten keep it when the channel
dim survives as a whole dim, Slice/Split select the channels they keep, Concat along the
channel axis concatenates them. When the axis cannot be tracked (Reshape merging the channel
dim, Pad padding it) the output has no QuantParams. Concat keeps per-tensor parameters only
when every input has the same ones.
"""

from __future__ import annotations

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import (
    AxesAttrs,
    AxisAttrs,
    DepthToSpaceAttrs,
    ExpandAttrs,
    PadAttrs,
    PadMode,
    ReshapeAttrs,
    SliceAttrs,
    SplitAttrs,
    TransposeAttrs,
)
from qfuse.ir.shapes._common import (
    fail,
    keep_quant,
    norm_axis,
    required,
    reshape_axis,
    single_channel,
    take_channels,
)
from qfuse.ir.types import QuantParams, TensorInfo


def _axis(x: TensorInfo) -> int | None:
    return None if x.quant is None else x.quant.axis


def expand(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: ExpandAttrs = node.attrs
    x = required(graph, node, 0)
    out = tuple(attrs.shape)
    ok = len(out) >= x.rank and all(
        d in (1, o) for d, o in zip(x.shape, out[len(out) - x.rank:], strict=True))
    if not ok:
        raise fail(node, f"input of shape {x.shape} does not broadcast to {out}")
    return [keep_quant(x, out, -1 if len(out) == x.rank else None)]


def depth_to_space(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: DepthToSpaceAttrs = node.attrs
    x = required(graph, node, 0)
    b = attrs.blocksize
    if x.rank != 4 or b < 1 or x.shape[1] % (b * b):
        raise fail(node, f"input {x.shape} is not [N, C, H, W] with C a multiple of {b}²")
    if attrs.mode not in ("DCR", "CRD"):
        raise fail(node, f"mode {attrs.mode!r} is neither DCR nor CRD")
    n, c, h, w = x.shape
    # per-channel quantization does not survive: each output channel mixes b² of them
    return [keep_quant(x, (n, c // (b * b), h * b, w * b), None)]


def concat(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: AxisAttrs = node.attrs
    infos = [required(graph, node, i) for i in range(len(node.inputs))]
    first = infos[0]
    axis = norm_axis(node, attrs.axis, first.rank)
    for i, info in enumerate(infos[1:], 1):
        if info.rank != first.rank or info.dtype != first.dtype or any(
            a != b for d, (a, b) in enumerate(zip(info.shape, first.shape)) if d != axis
        ):
            raise fail(node, f"input {i} {info} does not concatenate with input 0 {first} "
                             f"on axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(i.shape[axis] for i in infos)
    quants = [i.quant for i in infos]
    quant: QuantParams | None = None
    if all(q is not None and q.axis == axis for q in quants):
        quant = QuantParams(tuple(s for q in quants for s in q.scale),  # type: ignore[union-attr]
                            tuple(z for q in quants for z in q.zero_point),  # type: ignore[union-attr]
                            axis)
    elif all(q == quants[0] for q in quants):
        quant = quants[0]
    return [TensorInfo(tuple(shape), first.dtype, quant)]


def split(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: SplitAttrs = node.attrs
    x = required(graph, node, 0)
    axis = norm_axis(node, attrs.axis, x.rank)
    if len(attrs.sizes) != len(node.outputs):
        raise fail(node, f"{len(attrs.sizes)} split sizes for {len(node.outputs)} outputs")
    if min(attrs.sizes, default=0) < 0 or sum(attrs.sizes) != x.shape[axis]:
        raise fail(node, f"split sizes {attrs.sizes} do not add up to dim {axis} of size "
                         f"{x.shape[axis]}")
    out, start = [], 0
    for size in attrs.sizes:
        shape = x.shape[:axis] + (size,) + x.shape[axis + 1:]
        info = TensorInfo(shape, x.dtype, x.quant)
        if _axis(x) == axis:
            info = TensorInfo(shape, x.dtype, take_channels(x.quant, range(start, start + size)))  # type: ignore[arg-type]
        out.append(info)
        start += size
    return out


def slice_range(dim: int, start: int, end: int, step: int) -> range:
    """The indices ONNX Slice takes along one dim (negative starts/ends count from the end,
    then clamped to [0, dim] for step > 0 or [-1, dim - 1] for step < 0)."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return range(start, end, step)


def slice_(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: SliceAttrs = node.attrs
    x = required(graph, node, 0)
    n = len(attrs.axes)
    if not len(attrs.starts) == len(attrs.ends) == len(attrs.steps) == n:
        raise fail(node, "starts, ends, axes and steps differ in length")
    axes = [norm_axis(node, a, x.rank) for a in attrs.axes]
    if len(set(axes)) != n:
        raise fail(node, f"axes {attrs.axes} repeat an axis")
    shape = list(x.shape)
    quant = x.quant
    for axis, start, end, step in zip(axes, attrs.starts, attrs.ends, attrs.steps, strict=True):
        if step == 0:
            raise fail(node, f"step 0 on axis {axis}")
        indices = slice_range(x.shape[axis], start, end, step)
        shape[axis] = len(indices)
        if quant is not None and quant.axis == axis:
            quant = take_channels(quant, indices)
    return [TensorInfo(tuple(shape), x.dtype, quant)]


def _product(shape: tuple[int, ...]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def _reshaped(node: Node, x: TensorInfo, shape: tuple[int, ...]) -> TensorInfo:
    if min(shape, default=0) < 0 or _product(shape) != x.size:
        raise fail(node, f"cannot reshape {x.shape} ({x.size} elements) to {shape}")
    axis = _axis(x)
    return keep_quant(x, shape, -1 if axis is None else reshape_axis(x.shape, shape, axis))


def reshape(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: ReshapeAttrs = node.attrs
    return [_reshaped(node, required(graph, node, 0), tuple(attrs.shape))]


def flatten(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: AxisAttrs = node.attrs
    x = required(graph, node, 0)
    if not 0 <= attrs.axis <= x.rank:
        raise fail(node, f"axis {attrs.axis} is out of range [0, {x.rank}]")
    shape = (_product(x.shape[:attrs.axis]), _product(x.shape[attrs.axis:]))
    return [_reshaped(node, x, shape)]


def transpose(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: TransposeAttrs = node.attrs
    x = required(graph, node, 0)
    if sorted(attrs.perm) != list(range(x.rank)):
        raise fail(node, f"perm {attrs.perm} is not a permutation of the {x.rank} axes")
    shape = tuple(x.shape[p] for p in attrs.perm)
    axis = _axis(x)
    return [keep_quant(x, shape, -1 if axis is None else attrs.perm.index(axis))]


def squeeze(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: AxesAttrs = node.attrs
    x = required(graph, node, 0)
    axes = {norm_axis(node, a, x.rank) for a in attrs.axes}
    for a in sorted(axes):
        if x.shape[a] != 1:
            raise fail(node, f"cannot squeeze axis {a} of size {x.shape[a]}")
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    axis = _axis(x)
    if axis is not None and axis in axes:
        return [TensorInfo(shape, x.dtype, single_channel(x.quant))]  # type: ignore[arg-type]
    moved = -1 if axis is None else axis - sum(1 for a in axes if a < axis)
    return [keep_quant(x, shape, moved)]


def unsqueeze(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: AxesAttrs = node.attrs
    x = required(graph, node, 0)
    rank = x.rank + len(attrs.axes)
    axes = {norm_axis(node, a, rank) for a in attrs.axes}
    if len(axes) != len(attrs.axes):
        raise fail(node, f"axes {attrs.axes} repeat an axis")
    shape, kept, src = [], [], iter(range(x.rank))
    for i in range(rank):
        if i in axes:
            shape.append(1)
        else:
            kept.append(i)
            shape.append(x.shape[next(src)])
    axis = _axis(x)
    return [keep_quant(x, tuple(shape), -1 if axis is None else kept[axis])]


def pad(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: PadAttrs = node.attrs
    x = required(graph, node, 0)
    if len(attrs.pads) != 2 * x.rank:
        raise fail(node, f"{len(attrs.pads)} pads for an input of rank {x.rank} "
                         f"(want {2 * x.rank})")
    shape = []
    for i, d in enumerate(x.shape):
        begin, end = attrs.pads[i], attrs.pads[x.rank + i]
        if attrs.mode is PadMode.REFLECT and (max(begin, end) >= d):
            raise fail(node, f"reflect pads ({begin}, {end}) on axis {i} need a dim larger "
                             f"than {max(begin, end)}, got {d}")
        if attrs.mode is PadMode.EDGE and d == 0 and (begin or end):
            raise fail(node, f"edge pads on empty axis {i}")
        if d + begin + end < 0:
            raise fail(node, f"pads ({begin}, {end}) on axis {i} of size {d} leave a negative "
                             f"size")
        shape.append(d + begin + end)
    axis = _axis(x)
    padded = axis is not None and (attrs.pads[axis] or attrs.pads[x.rank + axis])
    return [keep_quant(x, tuple(shape), None if padded else -1)]
