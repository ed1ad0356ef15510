"""Data movement: Concat, Split, Slice, Gather, Reshape, Flatten, Transpose, Squeeze, Unsqueeze,
Pad, Cast. Every index input (split sizes, starts/ends, target shapes, axes, pads) must be a
constant after folding; the IR stores them resolved: non-negative axes, Reshape without 0 or
-1, Slice clamped as ONNX clamps (ends for a negative step that runs through index 0 are
``-(dim + 1)``, which Python slicing and ONNX both read as "past the beginning").
"""

from __future__ import annotations

import math

import numpy as np

from qfuse.compiler.onnx_import.context import ONNX_TO_DTYPE, Context, NodeView, onnx_type_name
from qfuse.ir.ops import (
    AxesAttrs,
    AxisAttrs,
    CastAttrs,
    DepthToSpaceAttrs,
    ExpandAttrs,
    NoAttrs,
    Op,
    PadAttrs,
    PadMode,
    ReshapeAttrs,
    SliceAttrs,
    SplitAttrs,
    TransposeAttrs,
)
from qfuse.ir.shapes.layout import slice_range


def _axis(ctx: Context, node: NodeView, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ctx.malformed(node, f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def _axes(ctx: Context, node: NodeView, values: object, rank: int) -> tuple[int, ...]:
    axes = [_axis(ctx, node, int(a), rank) for a in np.asarray(values).reshape(-1).tolist()]
    if len(set(axes)) != len(axes):
        raise ctx.malformed(node, f"axes {axes} repeat an axis")
    return tuple(axes)


def _ints(values: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1).tolist()]


def concat(ctx: Context, node: NodeView) -> None:
    if "axis" not in node.attrs:
        raise ctx.malformed(node, "axis is required")
    rank = ctx.input_info(node, 0).rank
    axis = _axis(ctx, node, int(node.attrs["axis"]), rank)
    ctx.emit(node, Op.CONCAT, [i for i in node.inputs if i], AxisAttrs(axis))


def split(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    axis = _axis(ctx, node, int(node.attr("axis", 0)), x.rank)
    dim, count = x.shape[axis], len(node.outputs)
    given = ctx.optional_const(node, 1, "split") if ctx.opset >= 13 else None
    if given is not None:
        sizes = _ints(given)
    elif "split" in node.attrs:
        sizes = [int(v) for v in node.attrs["split"]]
    elif "num_outputs" in node.attrs:
        parts = int(node.attrs["num_outputs"])
        if parts != count or parts < 1:
            raise ctx.malformed(node, f"num_outputs={parts} but {count} outputs")
        chunk = math.ceil(dim / parts)
        sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
    else:
        if dim % count:
            raise ctx.malformed(node, f"dim {axis} of size {dim} does not split into {count} "
                                      f"equal parts")
        sizes = [dim // count] * count
    if len(sizes) != count or sum(sizes) != dim or min(sizes) < 0:
        raise ctx.malformed(node, f"split sizes {sizes} do not cut dim {axis} of size {dim} "
                                  f"into {count} outputs")
    ctx.emit(node, Op.SPLIT, node.inputs[:1], SplitAttrs(axis, tuple(sizes)),
             outputs=list(node.outputs))


def slice_(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    starts = _ints(ctx.const(node, 1, "starts"))
    ends = _ints(ctx.const(node, 2, "ends"))
    axes_in = ctx.optional_const(node, 3, "axes")
    steps_in = ctx.optional_const(node, 4, "steps")
    axes = _axes(ctx, node, axes_in, x.rank) if axes_in is not None else tuple(range(len(starts)))
    steps = _ints(steps_in) if steps_in is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.malformed(node, "starts, ends, axes and steps differ in length")
    resolved_starts, resolved_ends = [], []
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        if step == 0:
            raise ctx.malformed(node, f"step 0 on axis {axis}")
        indices = slice_range(x.shape[axis], start, end, step)
        resolved_starts.append(indices.start)
        resolved_ends.append(indices.stop if indices.stop >= 0 else -(x.shape[axis] + 1))
    attrs = SliceAttrs(tuple(resolved_starts), tuple(resolved_ends), axes, tuple(steps))
    ctx.emit(node, Op.SLICE, node.inputs[:1], attrs)


# a Gather of constant 1-D indices in at most this many runs of consecutive ones is a Concat of
# their Slices (a channel permutation: RGB → BGR, a Focus stem's block order); more stay a float
# island
MAX_GATHER_RUNS = 16


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """``indices`` as runs of consecutive ones, ``(start, end)`` each, in order."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _gather_runs(ctx: Context, node: NodeView, axis: int, runs: list[tuple[int, int]]) -> None:
    """A Gather whose indices are ``runs``: one Slice per run (a view where the run is
    contiguous in memory) and a Concat of them along ``axis``."""
    parts = []
    for start, end in runs:
        part = ctx.graph.unique_name(f"{node.outputs[0]}@{start}:{end}")
        ctx.emit(node, Op.SLICE, node.inputs[:1], SliceAttrs((start,), (end,), (axis,), (1,)),
                 outputs=[part])
        parts.append(part)
    ctx.emit(node, Op.CONCAT, parts, AxisAttrs(axis))


def gather(ctx: Context, node: NodeView) -> None:
    """Gather with constant indices that pick one index or a run of consecutive ones is a
    Slice (ONNX spec: ``out[..., j, ...] = data[..., indices[j], ...]`` along ``axis``), plus a
    Squeeze of ``axis`` for a scalar index: PyTorch writes ``x[:, 0]`` (a class token) and
    ``qkv[0]`` / ``unbind`` (attention's q, k, v) so. Bit-exact: the values are moved, not
    computed. Indices of rank > 1 reshape the run. 1-D indices in a few runs of consecutive ones
    (out of order, repeated: a channel permutation) are a Concat of the runs' Slices. Other
    indices (run-time ones: an embedding's token ids; many runs) are a Gather node, one numpy
    kernel (lower_misc.lower_gather)."""
    x = ctx.input_info(node, 0)
    axis = _axis(ctx, node, int(node.attr("axis", 0)), x.rank)
    if not ctx.is_const(node.input(1)):
        ctx.emit(node, Op.GATHER, node.inputs[:2], AxisAttrs(axis))
        return
    indices = np.asarray(ctx.const(node, 1, "indices"))
    dim = x.shape[axis]
    flat = [int(i) for i in indices.reshape(-1).tolist()]
    if not flat:
        raise ctx.unsupported(node, f"indices of shape {indices.shape}")
    if any(not -dim <= i < dim for i in flat):
        raise ctx.malformed(node, f"indices {flat} are out of range for dim {axis} of size {dim}")
    first = flat[0] % dim
    if [i % dim for i in flat] != list(range(first, first + len(flat))):
        runs = _runs([i % dim for i in flat])
        if indices.ndim != 1 or len(runs) > MAX_GATHER_RUNS:
            ctx.emit(node, Op.GATHER, node.inputs[:2], AxisAttrs(axis))
            return
        _gather_runs(ctx, node, axis, runs)
        return
    attrs = SliceAttrs((first,), (first + len(flat),), (axis,), (1,))
    if indices.ndim == 1:
        ctx.emit(node, Op.SLICE, node.inputs[:1], attrs)
        return
    sliced = ctx.graph.unique_name(f"{node.outputs[0]}@slice")
    ctx.emit(node, Op.SLICE, node.inputs[:1], attrs, outputs=[sliced])
    if indices.ndim == 0:
        ctx.emit(node, Op.SQUEEZE, [sliced], AxesAttrs((axis,)))
        return
    # indices of rank > 1 (torch.export's as_strided after a global pool: arange(C) shaped
    # [1, C, 1, 1]): the run, reshaped to ``x.shape[:axis] + indices.shape + ...``
    shape = (*x.shape[:axis], *indices.shape, *x.shape[axis + 1:])
    ctx.emit(node, Op.RESHAPE, [sliced], ReshapeAttrs(shape))


def reshape(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    target = _ints(ctx.const(node, 1, "shape"))
    allow_zero = bool(node.attr("allowzero", 0))
    shape: list[int] = []
    for i, d in enumerate(target):
        if d == 0 and not allow_zero:
            if i >= x.rank:
                raise ctx.malformed(node, f"shape {target} copies dim {i} from a rank "
                                          f"{x.rank} input")
            d = x.shape[i]
        elif d == 0:
            raise ctx.unsupported(node, f"shape {target} with allowzero=1 makes an empty tensor")
        elif d < -1:
            raise ctx.malformed(node, f"shape {target} has a dim {d}")
        shape.append(d)
    if shape.count(-1) > 1:
        raise ctx.malformed(node, f"shape {target} has more than one -1")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or x.size % known:
            raise ctx.malformed(node, f"cannot reshape {x.shape} to {target}")
        shape[shape.index(-1)] = x.size // known
    ctx.emit(node, Op.RESHAPE, node.inputs[:1], ReshapeAttrs(tuple(shape)))


def flatten(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    axis = int(node.attr("axis", 1))
    if not -x.rank <= axis <= x.rank:
        raise ctx.malformed(node, f"axis {axis} is out of range for rank {x.rank}")
    ctx.emit(node, Op.FLATTEN, node.inputs[:1], AxisAttrs(axis + x.rank if axis < 0 else axis))


def transpose(ctx: Context, node: NodeView) -> None:
    rank = ctx.input_info(node, 0).rank
    perm = tuple(int(p) for p in node.attr("perm", range(rank - 1, -1, -1)))
    if sorted(perm) != list(range(rank)):
        raise ctx.malformed(node, f"perm {list(perm)} is not a permutation of {rank} axes")
    ctx.emit(node, Op.TRANSPOSE, node.inputs[:1], TransposeAttrs(perm))


def _axes_input(ctx: Context, node: NodeView) -> object | None:
    if ctx.opset >= 13:
        return ctx.optional_const(node, 1, "axes")
    return node.attr("axes")


def squeeze(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    given = _axes_input(ctx, node)
    if given is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = _axes(ctx, node, given, x.rank)
    for a in axes:
        if x.shape[a] != 1:
            raise ctx.malformed(node, f"cannot squeeze axis {a} of size {x.shape[a]}")
    ctx.emit(node, Op.SQUEEZE, node.inputs[:1], AxesAttrs(tuple(sorted(axes))))


def unsqueeze(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    given = _axes_input(ctx, node)
    if given is None:
        raise ctx.malformed(node, "axes are required")
    count = np.asarray(given).size
    axes = _axes(ctx, node, given, x.rank + count)
    ctx.emit(node, Op.UNSQUEEZE, node.inputs[:1], AxesAttrs(tuple(sorted(axes))))


def pad(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    mode = str(node.attr("mode", "constant"))
    try:
        pad_mode = PadMode(mode)
    except ValueError as exc:
        raise ctx.unsupported(node, f"mode '{mode}' is not supported (constant, reflect, "
                                    f"edge are)") from exc
    pads = _ints(ctx.const(node, 1, "pads"))
    value_in = ctx.optional_parameter(node, 2, "constant_value")
    axes_in = ctx.optional_const(node, 3, "axes")
    axes = _axes(ctx, node, axes_in, x.rank) if axes_in is not None else tuple(range(x.rank))
    if len(pads) != 2 * len(axes):
        raise ctx.malformed(node, f"{len(pads)} pads for {len(axes)} axes")
    full = [0] * (2 * x.rank)
    for i, axis in enumerate(axes):
        full[axis], full[x.rank + axis] = pads[i], pads[len(axes) + i]
    if not any(full):  # nothing to pad (torchvision's Swin pads to a window multiple): a copy
        ctx.emit(node, Op.IDENTITY, node.inputs[:1], NoAttrs())
        return
    value = 0.0
    if value_in is not None and value_in.size:
        if value_in.size != 1:
            raise ctx.malformed(node, f"constant_value must be a scalar, got {value_in.shape}")
        value = float(value_in.reshape(()))
    ctx.emit(node, Op.PAD, node.inputs[:1], PadAttrs(tuple(full), pad_mode, value))


def depth_to_space(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    b = int(node.attr("blocksize", 0))
    mode = node.attr("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if x.rank != 4 or b < 1 or x.shape[1] % (b * b):
        raise ctx.malformed(node, f"blocksize {b} does not divide the channels of {x.shape} "
                                  "into blocks (a 4-D input with C a multiple of blocksize²)")
    if mode not in ("DCR", "CRD"):
        raise ctx.malformed(node, f"mode {mode!r} is neither DCR nor CRD")
    ctx.emit(node, Op.DEPTH_TO_SPACE, node.inputs[:1], DepthToSpaceAttrs(b, mode))


def space_to_depth(ctx: Context, node: NodeView) -> None:
    """SpaceToDepth as ONNX defines it
    (https://onnx.ai/onnx/operators/onnx__SpaceToDepth.html): a Reshape to
    ``[N, C, H/b, b, W/b, b]``, a Transpose by ``[0, 3, 5, 1, 2, 4]`` (mode "DCR", the default;
    "CRD", opset 28: ``[0, 1, 3, 5, 2, 4]``) and a Reshape to ``[N, C·b², H/b, W/b]`` — two
    views and one reorder (a YOLOX-style "Focus" stem)."""
    x = ctx.input_info(node, 0)
    b = int(node.attr("blocksize", 0))
    mode = node.attr("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if x.rank != 4 or b < 1 or x.shape[2] % b or x.shape[3] % b:
        raise ctx.malformed(node, f"blocksize {b} does not tile the spatial dims of {x.shape} "
                                  "(a 4-D input with H and W multiples of blocksize)")
    if mode not in ("DCR", "CRD"):
        raise ctx.malformed(node, f"mode {mode!r} is neither DCR nor CRD")
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    n, c, h, w = x.shape
    blocks = ctx.graph.unique_name(f"{node.outputs[0]}@blocks")
    moved = ctx.graph.unique_name(f"{node.outputs[0]}@moved")
    ctx.emit(node, Op.RESHAPE, node.inputs[:1], ReshapeAttrs((n, c, h // b, b, w // b, b)),
             outputs=[blocks])
    ctx.emit(node, Op.TRANSPOSE, [blocks], TransposeAttrs(perm), outputs=[moved])
    ctx.emit(node, Op.RESHAPE, [moved], ReshapeAttrs((n, c * b * b, h // b, w // b)))


def expand(ctx: Context, node: NodeView) -> None:
    """Expand with a constant shape: ONNX's bidirectional broadcast of x's shape and ``shape``
    (https://onnx.ai/onnx/operators/onnx__Expand.html) resolved here; an output of x's own
    shape is an Identity."""
    x = ctx.input_info(node, 0)
    requested = _ints(ctx.const(node, 1, "shape"))
    try:
        out = tuple(int(d) for d in np.broadcast_shapes(x.shape, tuple(requested)))
    except ValueError as exc:
        raise ctx.malformed(node, f"shape {requested} does not broadcast with the input's "
                                  f"{x.shape}") from exc
    if out == x.shape:
        ctx.emit(node, Op.IDENTITY, node.inputs[:1], NoAttrs())
        return
    ctx.emit(node, Op.EXPAND, node.inputs[:1], ExpandAttrs(out))


def tile(ctx: Context, node: NodeView) -> None:
    """Tile with constant repeats (https://onnx.ai/onnx/operators/onnx__Tile.html):
    ``y[i] = x[i mod s]`` over each dim of size ``s`` repeated ``r`` times, which is x seen
    with a dim of size 1 before each repeated one, broadcast to ``r`` there (an Expand: one
    reorder from a view striding 0 over the repeats) and read back with each pair of dims
    merged (a Reshape of the dense result). Every repeat 1 is an Identity."""
    x = ctx.input_info(node, 0)
    repeats = _ints(ctx.const(node, 1, "repeats"))
    if len(repeats) != x.rank:
        raise ctx.malformed(node, f"{len(repeats)} repeats for an input of rank {x.rank}")
    if any(r < 0 for r in repeats):
        raise ctx.malformed(node, f"repeats {repeats} must not be negative")
    if all(r == 1 for r in repeats):
        ctx.emit(node, Op.IDENTITY, node.inputs[:1], NoAttrs())
        return
    if any(r == 0 for r in repeats):
        raise ctx.unsupported(node, f"repeats {repeats} give an empty tensor")
    split: list[int] = []
    expanded: list[int] = []
    for size, r in zip(x.shape, repeats, strict=True):
        split += [1, size] if r != 1 else [size]
        expanded += [r, size] if r != 1 else [size]
    viewed = ctx.graph.unique_name(f"{node.outputs[0]}@split")
    broadcast = ctx.graph.unique_name(f"{node.outputs[0]}@repeated")
    ctx.emit(node, Op.RESHAPE, node.inputs[:1], ReshapeAttrs(tuple(split)), outputs=[viewed])
    ctx.emit(node, Op.EXPAND, [viewed], ExpandAttrs(tuple(expanded)), outputs=[broadcast])
    ctx.emit(node, Op.RESHAPE, [broadcast],
             ReshapeAttrs(tuple(s * r for s, r in zip(x.shape, repeats, strict=True))))


def cast(ctx: Context, node: NodeView) -> None:
    to = int(node.attr("to", 0))
    if to not in ONNX_TO_DTYPE:
        raise ctx.unsupported(node, f"cast to {onnx_type_name(to)} is not supported")
    if ctx.input_info(node, 0).dtype == ONNX_TO_DTYPE[to]:
        # A cast to the type it has is the identity (torch.onnx writes one after each
        # QuantizeLinear of a PyTorch-quantized model: quint8 -> UINT8).
        ctx.emit(node, Op.IDENTITY, node.inputs[:1], NoAttrs())
        return
    ctx.emit(node, Op.CAST, node.inputs[:1], CastAttrs(ONNX_TO_DTYPE[to]))
