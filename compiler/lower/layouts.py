"""Memory layouts: descriptors the lowering builds, compares and re-views.

A *plain* descriptor has strides and no inner blocks (numpy can view it); *row-major* is the
plain layout numpy and the user expect. oneDNN's int8 convolutions on this machine pick
channels-last (nhwc), its f32 ones channels-last or 16-channel blocks.

``nocopy_strides`` is numpy's no-copy reshape rule applied to a strided layout: a Reshape of a
channels-last tensor that splits or merges dims which are contiguous *in memory* is a view with
other strides, not a reorder (ShuffleNet's channel shuffle splits C of an nhwc tensor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import numpy as np

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.ir import DType, Op, TensorInfo
from qfuse.runtime.onednn import DataType, DnnlError, FormatTag, Memory, MemoryDesc

DNNL_TYPES = {DType.F32: DataType.f32, DType.S32: DataType.s32, DType.S8: DataType.s8,
              DType.U8: DataType.u8, DType.F16: DataType.f16}
CHANNELS_LAST = {3: FormatTag.nwc, 4: FormatTag.nhwc, 5: FormatTag.ndhwc}
T = TypeVar("T")
R = TypeVar("R")


def const_memory(values: object, dtype: object = None) -> Memory:
    """A plain memory over a private, writeable, C-contiguous copy of ``values``."""
    return Memory.from_array(np.array(values, dtype=dtype, order="C", copy=True))


def dnnl_type(dtype: DType) -> DataType:
    try:
        return DNNL_TYPES[dtype]
    except KeyError:
        raise UnsupportedModelError(f"element type {dtype.name} has no oneDNN type") from None


def row_major(dims: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def is_row_major(md: MemoryDesc) -> bool:
    return md.is_plain and (md.nelems == 1 or _dense_strides(md) == _dense(row_major(md.dims),
                                                                           md.dims))


def gapless(md: MemoryDesc) -> bool:
    """A plain layout without gaps: its bytes are its elements in some order."""
    return md.is_plain and md.size == md.nelems * md.numpy_dtype.itemsize


def _dense(strides: Sequence[int], dims: Sequence[int]) -> tuple[int, ...]:
    # size-1 dims may carry any stride: ignore them in comparisons
    return tuple(s for s, d in zip(strides, dims, strict=True) if d != 1)


def _dense_strides(md: MemoryDesc) -> tuple[int, ...]:
    return _dense(md.strides or (), md.dims)


def same_bytes(a: MemoryDesc, b: MemoryDesc) -> bool:
    """Two plain descriptors of one memory layout: they differ at most in the strides of
    size-1 dims (oneDNN compares those too, e.g. nchw and nhwc of a 1x1 image)."""
    return (a.is_plain and b.is_plain and a.dims == b.dims and a.dtype == b.dtype
            and _dense_strides(a) == _dense_strides(b))


def is_host(info: TensorInfo) -> bool:
    """A value oneDNN cannot describe (int64, bool, float64, int16, ..., rank 0, empty): it lives in
    a *host slot*, a flat u8 buffer that only numpy and island kernels read and write."""
    return info.dtype not in DNNL_TYPES or not info.shape or 0 in info.shape


def host_md(shape: Sequence[int], dtype: np.dtype) -> MemoryDesc:
    """The flat u8 descriptor over a host value's bytes (Slot.host gives its numpy type)."""
    return plain_md((max(1, math.prod(shape)) * np.dtype(dtype).itemsize,), DataType.u8)


def plain_md(dims: Sequence[int], dtype: DataType) -> MemoryDesc:
    return MemoryDesc.from_strides(tuple(dims), dtype, row_major(dims))


def md_like(md: MemoryDesc, dtype: DataType) -> MemoryDesc | None:
    """The same (non-blocked) layout with another data type; None for blocked layouts."""
    if md.dtype == dtype:
        return md
    if not md.is_plain:
        return None
    return MemoryDesc.from_strides(md.dims, dtype, md.strides or ())


def channels_last(dims: Sequence[int], dtype: DataType) -> MemoryDesc:
    tag = CHANNELS_LAST.get(len(dims))
    return MemoryDesc.from_tag(tuple(dims), dtype, tag) if tag else plain_md(dims, dtype)


def any_md(dims: Sequence[int], dtype: DataType) -> MemoryDesc:
    return MemoryDesc.from_tag(tuple(dims), dtype, FormatTag.any)


def is_slow(impl: str, kind: str) -> bool:
    """Implementations not to settle for when another layout is possible: reference ones,
    also wrapped (a deconvolution on ``conv:any+ref:any``), and GEMM-based convolutions."""
    return ("ref:" in impl or impl.startswith("ref")
            or (kind in ("convolution", "deconvolution") and "gemm" in impl))


def first_fast(kind: str, candidates: Iterable[T], make: Callable[[T], R]
               ) -> tuple[T, R] | None:
    """The first candidate whose primitive oneDNN implements on a kernel that is not slow
    (``make(candidate)`` returns it, or a tuple whose first item is its PrimitiveDesc), with
    what ``make`` returned; None when every candidate is refused or slow."""
    for candidate in candidates:
        try:
            made = make(candidate)
        except DnnlError:
            continue
        pd = made[0] if isinstance(made, tuple) else made
        if not is_slow(pd.impl_name, kind):  # type: ignore[attr-defined]
            return candidate, made
    return None


RESHAPES = (Op.RESHAPE, Op.FLATTEN, Op.SQUEEZE, Op.UNSQUEEZE)
QUANTIZERS = (Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR, Op.FAKE_QUANTIZE)


def nocopy_strides(dims: Sequence[int], strides: Sequence[int],
                   new_dims: Sequence[int]) -> tuple[int, ...] | None:
    """Element strides that view a (dims, strides) layout as ``new_dims`` without copying,
    or None when the regrouped dims are not contiguous (numpy's _attempt_nocopy_reshape)."""
    old = [(d, s) for d, s in zip(dims, strides, strict=True) if d != 1]
    od, os_ = [d for d, _ in old], [s for _, s in old]
    out = [0] * len(new_dims)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new_dims) and oi < len(od):
        n_size, o_size = new_dims[ni], od[oi]
        while n_size != o_size:
            if n_size < o_size:
                if nj >= len(new_dims):
                    return None
                n_size *= new_dims[nj]
                nj += 1
            else:
                if oj >= len(od):
                    return None
                o_size *= od[oj]
                oj += 1
        for k in range(oi, oj - 1):
            if os_[k] != od[k + 1] * os_[k + 1]:
                return None
        out[nj - 1] = os_[oj - 1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new_dims[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    last = out[ni - 1] if ni > 0 else 1
    for k in range(ni, len(new_dims)):
        out[k] = last
    return unit_strides_like_tags(new_dims, out)


def unit_strides_like_tags(dims: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """``strides`` with each size-1 dim's stride set as a oneDNN format tag sets it for a dim
    in that logical place: the extent of the non-unit dims logically inside it,
    ``max(stride·dim)`` over them (1 when there are none). A unit dim's stride addresses
    nothing, but oneDNN 3.2 reads it when it orders the dims: a view (1, 82, 400) strides
    (82, 1, 82) of a channels-last tensor — the unit dim tying with an outer one — sends a
    binary primitive to ``ref:any`` (measured: YOLOv8n's requantizations before its head
    Concat, 15 % of the run), while (32800, 1, 82), what the tag ``acb`` gives, runs
    ``jit:uni``. Applied to views only: descriptors made from a tag keep the tag's strides
    (nhwc gives a trailing unit W the stride C, nchw 1), and a binary whose src and dst
    disagree on them runs ``ref:any``."""
    out = list(strides)
    for k, d in enumerate(dims):
        if d == 1:
            inner = [strides[j] * dims[j] for j in range(k + 1, len(dims)) if dims[j] != 1]
            out[k] = max(inner, default=1)
    return tuple(out)


def strided(dims: Sequence[int], dtype: DataType,
             strides: Sequence[int] | None) -> MemoryDesc | None:
    if strides is None:
        return None
    try:
        return MemoryDesc.from_strides(tuple(dims), dtype, tuple(strides))
    except DnnlError:
        return None


def ordered_strides(dims: Sequence[int], order: Sequence[int]) -> list[int]:
    """Element strides that lay ``dims`` out densely with ``order`` (every axis once)
    outermost first."""
    out = [0] * len(dims)
    step = 1
    for i in reversed(order):
        out[i] = step
        step *= dims[i]
    return out


def dim_order(strides: Sequence[int]) -> list[int]:
    """The dims in memory order: outermost (largest stride) first, equal strides (size-1
    dims) by index."""
    return sorted(range(len(strides)), key=lambda i: (-strides[i], i))


def dense_in_order(md: MemoryDesc, dims: Sequence[int],
                   dtype: DataType | None = None) -> MemoryDesc:
    """``dims`` densely laid out in ``md``'s dimension order (outermost = largest stride), of
    ``md``'s element type unless ``dtype`` is given."""
    order = dim_order(md.strides or (0,) * len(dims))
    return MemoryDesc.from_strides(tuple(dims), md.dtype if dtype is None else dtype,
                                   ordered_strides(dims, order))


def memory_order_groups(md: MemoryDesc, operands: Sequence[Sequence[int]]
                        ) -> tuple[tuple[int, ...], ...] | None:
    """The dims of a dense plain ``md`` in memory order (outermost first, size-1 dims left
    out), neighbours grouped while every operand — dims broadcast from md's, each 1 or md's —
    is full along both or broadcast along both. An elementwise kernel over md and operands
    laid out densely in md's order (``dense_in_order``) is the same kernel, element for
    element, over one dim per group (``grouped_md``). None when md has gaps or blocks, an
    operand does not broadcast to it, or every dim is 1."""
    if not md.is_plain:
        return None
    dims, strides = md.dims, md.strides or ()
    order = [i for i in dim_order(strides) if dims[i] != 1]
    step = 1
    for i in reversed(order):
        if strides[i] != step:
            return None
        step *= dims[i]
    if not order or any(len(op) != len(dims) or any(o not in (1, d) for o, d in zip(
            op, dims, strict=True)) for op in operands):
        return None
    groups: list[tuple[list[int], tuple[bool, ...]]] = []
    for i in order:
        pattern = tuple(op[i] == 1 for op in operands)
        if groups and groups[-1][1] == pattern:
            groups[-1][0].append(i)
        else:
            groups.append(([i], pattern))
    return tuple(tuple(g) for g, _ in groups)


def grouped_md(groups: Sequence[Sequence[int]], dims: Sequence[int], dtype: DataType,
               lead: int = 0, tile: int = 1) -> MemoryDesc:
    """``dims`` (md's or an operand's) seen over ``groups`` (``memory_order_groups``),
    row-major, after ``lead`` leading 1s. ``tile`` > 1: the last two groups, (outer, inner),
    seen as (outer/tile, tile·inner) — the same bytes for md's dims, and for an operand
    broadcast along outer its row repeated ``tile`` times (the caller lays it out so)."""
    grouped = [math.prod(dims[i] for i in g) for g in groups]
    if tile > 1 and grouped[-1] != 1:
        grouped[-1] *= tile
        if grouped[-2] != 1:
            grouped[-2] //= tile
    return plain_md((1,) * lead + tuple(grouped), dtype)


def axis_innermost(md: MemoryDesc, axis: int) -> MemoryDesc:
    """``md``'s dims densely laid out with ``axis`` innermost (stride 1) and the other dims in
    row-major order: oneDNN's jit softmax needs the softmax axis innermost in memory and runs
    ``ref:any`` otherwise. Row-major, not ``md``'s order: the last axis then gives nchw and
    the channel axis nhwc, the layouts oneDNN's per-channel post-ops handle — with an
    (N, H, C, W) order taken from a channels-last source (a softmax over W), the per-channel
    binary post-op of the kernel after it computed wrong values (tests/fuzz seed 8843)."""
    dims = md.dims
    axis = axis + len(dims) if axis < 0 else axis
    strides = row_major(dims)
    order = [i for i in dim_order(strides) if i != axis]
    return MemoryDesc.from_strides(tuple(dims), md.dtype,
                                   ordered_strides(dims, [*order, axis]))


def repeating_views(source: MemoryDesc, region: MemoryDesc) -> tuple[MemoryDesc, MemoryDesc]:
    """(source, region) of a nearest enlargement by whole factors as equal-dims views: each
    spatial dim of size ``n`` enlarged ``k`` times is split into (n, k), the source's k-dim
    with stride 0."""
    dims, src_strides = list(region.dims[:2]), list((source.strides or ())[:2])
    dst_strides = list((region.strides or ())[:2])
    for size, out, src_stride, dst_stride in zip(source.dims[2:], region.dims[2:],
                                                 (source.strides or ())[2:],
                                                 (region.strides or ())[2:]):
        factor = out // size
        dims += [size, factor]
        src_strides += [src_stride, 0]
        dst_strides += [dst_stride * factor, dst_stride]
    return (MemoryDesc.from_strides(dims, source.dtype, src_strides),
            MemoryDesc.from_strides(dims, region.dtype, dst_strides))
