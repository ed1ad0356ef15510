"""Reduce* → oneDNN reduction, LRN → oneDNN LRN (float32; u8/s8 ReduceMax / ReduceMin, which
pick one of their inputs, in their own type; other integer ones run in numpy).

Reductions. oneDNN's reduction reduces src over the dims where dst has size 1 (dst has src's
rank: the keepdims shape; without keepdims the output slot is a row-major view of it). Its
algorithms (oneDNN 3.2 dev guide, "Reduction"; p and eps are the primitive's parameters)
against ONNX's definitions (https://onnx.ai/onnx/operators/, Reduce*):

    ReduceMean       Σx / R                reduction_mean
    ReduceSum        Σx                    reduction_sum
    ReduceProd       Πx                    reduction_mul
    ReduceMax / Min  max / min             reduction_max / reduction_min
    ReduceL1         Σ|x|                  norm_lp_sum, p=1, eps=0: (Σ|x|^1 + 0)^(1/1)
    ReduceL2         √(Σx²)                norm_lp_sum, p=2, eps=0: (Σ|x|² + 0)^(1/2)
    ReduceSumSquare  Σx²                   norm_lp_power_p_sum, p=2, eps=0: Σ|x|² + 0

(norm_lp_max takes max(Σ|x|^p, eps) instead of the sum with eps: with eps=0 and Σ|x|^p ≥ 0
the same value; the _sum forms are used.) oneDNN 3.2 has no jit kernel for the norm_lp
algorithms (jit_uni_reduction.cpp: max, min, sum, mul, mean): on ``ref:any`` (scalar loops)
one ReduceL2 of torch's ``F.normalize`` took 12 ms of Swin-V2-T's run (measured, AVX2, 2
threads). So they run as two jit kernels (``norm_by_sum`` in inspect): an eltwise kernel
writes |x| (ReduceL1) or x² (L2, SumSquare) into a buffer of its own, laid out with the
reduced axes innermost, and the jit ``reduction_sum`` reads it, with ReduceL2's square root
as its eltwise_sqrt post-op. Each x² is rounded to float32 before it is summed, as in
ref:any's loop. oneDNN sums in float32 in its own order: results
differ from the float64 reference (runtime/reference/ops_reduce.py) by sum rounding,
bounded relative to Σ|x| (tests/compiler/test_lower_reduce.py states the tolerance); max and
min are exact. oneDNN's jit reduction (``jit:avx2`` here) takes row-major src and dst with the
reduced dims innermost (jit_uni_reduction.cpp: plain tags, reduced dims trailing); other axes
run ``ref:any`` (scalar loops). So x is then reordered with its reduced axes innermost and the
jit kernel reads it as the permuted dims; the kept dims keep their order, so its output bytes
are the row-major output (``reduced_axes_innermost`` in inspect).

Reduced axes in the middle (``avg_pooling`` in inspect). When x's layout has the reduced
axes as one strided run with kept dims below it (a channels-last image reduced over H and
W, tokens [1, N, C] reduced over N), a float ReduceMean / Sum / L1 / L2 / SumSquare is an
average pooling of window r (the reduced count) over x's own bytes seen as (n, c, r), with
``·r`` (and L2's square root) as eltwise post-ops and |x| or x² an eltwise kernel in x's
layout first: no reorder. ConvNeXt-V2-Atto NNCF 0.86x, Swin-V2-CR-T QDQ 0.96x (2 threads,
AVX2, outputs identical: the sums are quantized after); the sum is float32 in another order
and ``/r·r`` rounds twice more, within the same bound.

LRN. ONNX: ``y = x / (bias + alpha/size · Σ x²)^beta`` over channels c - floor((size-1)/2) ..
c + ceil((size-1)/2). oneDNN ``lrn_across_channels`` computes ``x · (k + alpha/n · Σ x²)^-beta``
over c - (n-1)/2 .. c + (n-1)/2 (ref_lrn.cpp: ``half_size = (size - 1) / 2``, both sides),
dividing by n either way: the same for odd sizes with k = bias, n = size. For an even size
oneDNN's window has size - 1 channels, one fewer than ONNX's, so even sizes run in numpy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.attrs import DTYPE_SIZE
from qfuse.compiler.lower.layouts import (
    first_fast,
    is_host,
    is_slow,
    memory_order_groups,
    nocopy_strides,
    ordered_strides,
    plain_md,
)
from qfuse.ir import DType, Node, Op
from qfuse.ir.ops import LrnAttrs, ReduceAttrs
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    DnnlError,
    MemoryDesc,
    PostOps,
    PrimitiveAttr,
    PrimitiveDesc,
    binary,
    eltwise,
    lrn,
    pooling,
    reduction,
)

log = logging.getLogger(__name__)

# op -> (algorithm, p, eps)
REDUCTIONS: dict[Op, tuple[Alg, float, float]] = {
    Op.REDUCE_MEAN: (Alg.reduction_mean, 0.0, 0.0),
    Op.REDUCE_SUM: (Alg.reduction_sum, 0.0, 0.0),
    Op.REDUCE_PROD: (Alg.reduction_mul, 0.0, 0.0),
    Op.REDUCE_MAX: (Alg.reduction_max, 0.0, 0.0),
    Op.REDUCE_MIN: (Alg.reduction_min, 0.0, 0.0),
    Op.REDUCE_L1: (Alg.reduction_norm_lp_sum, 1.0, 0.0),
    Op.REDUCE_L2: (Alg.reduction_norm_lp_sum, 2.0, 0.0),
    Op.REDUCE_SUM_SQUARE: (Alg.reduction_norm_lp_power_p_sum, 2.0, 0.0),
}
# ReduceL1 / L2 / SumSquare as a jit sum: op -> (eltwise before the sum, post-op after it)
NORM_BY_SUM: dict[Op, tuple[Alg, Alg | None]] = {
    Op.REDUCE_L1: (Alg.eltwise_abs, None),
    Op.REDUCE_L2: (Alg.eltwise_square, Alg.eltwise_sqrt),
    Op.REDUCE_SUM_SQUARE: (Alg.eltwise_square, None),
}


def _float_only(ctx: LowerContext, node: Node) -> bool:
    return all(ctx.info(v).dtype is DType.F32 for v in [*node.inputs, *node.outputs] if v)


def _int8_pick(ctx: LowerContext, node: Node) -> bool:
    """ReduceMax / Min of u8 or s8 into the same type (passes/propagate_dequantize moved the
    dequantize after it): the picked element itself, exact."""
    types = {ctx.info(v).dtype for v in [*node.inputs, *node.outputs] if v}
    return node.op in (Op.REDUCE_MAX, Op.REDUCE_MIN) and types in ({DType.U8}, {DType.S8})


def lower_reduce(ctx: LowerContext, node: Node) -> None:
    if _over_ones(ctx, node):
        return
    int8 = _int8_pick(ctx, node)
    if not int8 and not _float_only(ctx, node):
        lower_numpy(ctx, node, note="integer reduction other than an int8 max / min")
        return
    attrs: ReduceAttrs = node.attrs
    alg, p, eps = REDUCTIONS[node.op]
    x, y = node.inputs[0], node.outputs[0]
    home = ctx.md_of(x)
    kept = tuple(1 if i in attrs.axes else d for i, d in enumerate(home.dims))
    dtype = home.dtype if int8 else DataType.f32
    dst_md = plain_md(kept, dtype)

    def make(md: MemoryDesc) -> PrimitiveDesc:
        return reduction(alg, md, dst_md, p=p, eps=eps)

    shape = ctx.info(y).shape
    if _across_slices(ctx, node, dtype, kept):
        return
    if not int8 and node.op in AS_AVERAGE and _as_avg_pooling(ctx, node):
        return
    pd = ctx.try_layouts("reduction", make, [home, plain_md(home.dims, dtype)])
    if is_slow(pd.impl_name, "reduction"):
        if node.op in NORM_BY_SUM and _norm_by_sum(ctx, node, kept):
            return
        if node.op is Op.REDUCE_MAX and _as_max_pooling(ctx, node, dtype):
            return
        if _reduced_innermost(ctx, node, alg, p, eps, dtype, kept):
            return
    src_md = pd.src_md
    assert src_md is not None
    src = ctx.source(x, src_md)
    if shape == kept:
        dst = ctx.define(y, dst_md)
    else:  # keepdims=0: the row-major output seen with the kept dims (same bytes)
        dst = ctx.temp(f"{y}@kept", dst_md, alias=ctx.define(y, plain_md(shape, dtype)))
    ctx.add_primitive(node.name, pd, {int(Arg.SRC): src, int(Arg.DST): dst},
                      info=ctx.info_for(node))


def _over_ones(ctx: LowerContext, node: Node) -> bool:
    """A ReduceMax / Min / Prod / Mean / Sum whose reduced axes all have size 1 (oneDNN's
    reduction refuses a dst of src's dims; silero-vad's ReduceMean over its one output) is its
    input: max, min and the product of one value are that value, a view; the sum and the mean
    are ``x + 0`` (a float32 -0 becomes +0, as numpy's and oneDNN's sums start from 0), one
    eltwise_linear(1, 0) kernel. False for other reductions and host values."""
    attrs: ReduceAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    info = ctx.info(x)
    if (node.op not in (Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_PROD, Op.REDUCE_MEAN,
                        Op.REDUCE_SUM)
            or any(info.shape[a] != 1 for a in attrs.axes) or is_host(info)
            or ctx.const(x) is not None):
        return False
    shape = ctx.info(y).shape
    if node.op in (Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_PROD) or info.dtype is not DType.F32:
        ctx.home[y] = ctx.view(x, shape, base=y)
        return True
    src = ctx.plain_source(x)
    md = ctx.slots[src].md
    dst = ctx.temp(f"{y}@same", md, alias=ctx.define(y, plain_md(shape, DataType.f32)))
    ctx.add_primitive(node.name, eltwise(Alg.eltwise_linear, md, md, alpha=1.0, beta=0.0),
                      {int(Arg.SRC): src, int(Arg.DST): dst},
                      info=ctx.info_for(node, note="over axes of size 1: x + 0"))
    return True


# a reduction over one short axis as a binary primitive over its slices: op -> its algorithm
ACROSS_SLICES = {Op.REDUCE_SUM: Alg.binary_add, Op.REDUCE_MEAN: Alg.binary_add,
                 Op.REDUCE_MAX: Alg.binary_max, Op.REDUCE_MIN: Alg.binary_min}
MAX_SLICES = 4


def _slices(node: Node, dims: tuple[int, ...]) -> tuple[int, int] | None:
    """(the reduced axis, its size) when ``_across_slices`` takes the reduction: one axis of
    2 to MAX_SLICES elements (a ReduceMean of 2 or 4 only, where ·1/k is /k exactly)."""
    attrs: ReduceAttrs = node.attrs
    if node.op not in ACROSS_SLICES or len(attrs.axes) != 1:
        return None
    k = dims[attrs.axes[0]]
    if not 2 <= k <= MAX_SLICES or (node.op is Op.REDUCE_MEAN and k not in (2, 4)):
        return None
    return attrs.axes[0], k


def _across_slices(ctx: LowerContext, node: Node, dtype: DataType,
                   kept: tuple[int, ...]) -> bool:
    """A reduction over one axis of 2 to MAX_SLICES elements as one binary primitive over
    x's slices along it, ``x[.., 0, ..] ∘ x[.., 1, ..]`` and the rest as binary post-ops
    (ReduceMean then ·1/k, for k 2 or 4 only, where ·1/k is /k exactly): views of x's own
    bytes, no reorder. SKNet and ResNeSt sum their radix-2 branches so; the jit reduction read
    rows of 2 elements, after a reorder that put them innermost (SKNet-18: 0.4 ms each for
    400 K elements, 3.3 ms of its 16). Max and min are exact; a sum of 2 rounds once, as
    float64 then float32 does; of 3 or 4, in order, within the tolerance of any float32 sum
    (module docstring). False when x is not dense with that axis outside the others' order
    (the slices would not be laid out alike) or the jit binary declines."""
    attrs: ReduceAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    found = _slices(node, ctx.info(x).shape)
    if found is None:
        return False
    axis, k = found
    src = ctx.home_slot(x)
    md = ctx.slots[src].md
    if not md.is_plain or md.dtype != dtype:
        return False
    strides = md.strides or ()
    slice_md = MemoryDesc.from_strides(kept, dtype, strides)
    if strides[axis] != math.prod(kept) or memory_order_groups(slice_md, []) is None:
        return False  # each slice must be one dense run (probe_reduce asks for that layout)
    post_ops = PostOps()
    for _ in range(2, k):
        post_ops.append_binary(ACROSS_SLICES[node.op], slice_md)
    if node.op is Op.REDUCE_MEAN:
        post_ops.append_eltwise(Alg.eltwise_linear, 1.0 / k, 0.0)
    attr = PrimitiveAttr()
    if len(post_ops):
        attr.set_post_ops(post_ops)
    made = first_fast("binary", [slice_md], lambda md: binary(ACROSS_SLICES[node.op], md, md,
                                                              md, attr=attr))
    if made is None:
        return False
    pd = made[1]
    step = strides[axis] * DTYPE_SIZE[dtype]
    views = [ctx.temp(f"{x}@slice{i}", slice_md, alias=src, offset=i * step) for i in range(k)]
    y_strides = strides if attrs.keepdims else tuple(
        st for i, st in enumerate(strides) if i != axis)
    out = ctx.define(y, MemoryDesc.from_strides(ctx.info(y).shape, dtype, y_strides))
    dst = out if attrs.keepdims else ctx.temp(f"{y}@kept", slice_md, alias=out)
    args = {int(Arg.SRC_0): views[0], int(Arg.SRC_1): views[1], int(Arg.DST): dst}
    for i in range(2, k):
        args[Arg.post_op(i - 2, Arg.SRC_1)] = views[i]
    ctx.add_primitive(node.name, pd, args,
                      info=ctx.info_for(node, optimizations=["across_slices"]))
    return True


def probe_reduce(ctx: LowerContext, node: Node, port: int, dtype: DataType
                 ) -> MemoryDesc | None:
    """The layout ``_across_slices`` reads: the reduced axis outermost, each slice dense,
    channels-last when a slice is an image (ResNeSt's [1, 2, C, H, W] view of a channels-last
    convolution: its dequantize writes the radix outermost instead of a reorder after it)."""
    dims = ctx.info(node.inputs[0]).shape
    found = _slices(node, dims)
    if port != 0 or found is None:
        return None
    axis = found[0]
    rest = [i for i in range(len(dims)) if i != axis]
    if len(rest) >= 3:  # channels-last: the first non-batch dim innermost
        rest = [rest[0], *rest[2:], rest[1]]
    return MemoryDesc.from_strides(dims, dtype, ordered_strides(dims, [axis, *rest]))


def _reduced_innermost(ctx: LowerContext, node: Node, alg: Alg, p: float, eps: float,
                       dtype: DataType, kept: tuple[int, ...]) -> bool:
    """The jit reduction for axes that are not the trailing ones: x reordered so the reduced
    axes are innermost (one reorder), the primitive reading that buffer as a row-major tensor
    of the permuted dims and writing the kept dims' row-major bytes (the size-1 dims do not
    move anything: the output is already in place). False when the jit kernel declines that
    too (the ref: one found first is used then)."""
    x = node.inputs[0]
    dims = ctx.info(x).shape
    order, strides = _innermost_order(node, dims)
    moved_dims = tuple(dims[a] for a in order)
    moved_kept = tuple(kept[a] for a in order)
    try:
        pd = reduction(alg, plain_md(moved_dims, dtype), plain_md(moved_kept, dtype), p=p,
                       eps=eps)
    except DnnlError:
        return False
    if is_slow(pd.impl_name, "reduction"):
        return False
    src = ctx.source(x, MemoryDesc.from_strides(dims, dtype, strides))
    _reduce_moved(ctx, node, pd, src, moved_dims, moved_kept, dtype, "reduced_axes_innermost")
    return True


def _reduce_moved(ctx: LowerContext, node: Node, pd: PrimitiveDesc, src: str,
                  moved_dims: tuple[int, ...], moved_kept: tuple[int, ...], dtype: DataType,
                  optimization: str) -> None:
    """The reduction kernel reading ``src`` (x's dims laid out with the reduced axes
    innermost) as a row-major tensor of the permuted dims, and writing the kept dims'
    row-major bytes, which are the output's (its reduced dims have size 1)."""
    x, y = node.inputs[0], node.outputs[0]
    view = ctx.temp(f"{x}@reduce_order", plain_md(moved_dims, dtype), alias=src)
    out = ctx.define(y, plain_md(ctx.info(y).shape, dtype))
    dst = ctx.temp(f"{y}@reduce_order", plain_md(moved_kept, dtype), alias=out)
    ctx.add_primitive(node.name, pd, {int(Arg.SRC): view, int(Arg.DST): dst},
                      info=ctx.info_for(node, optimizations=[optimization]))


def _as_max_pooling(ctx: LowerContext, node: Node, dtype: DataType) -> bool:
    """ReduceMax over one axis R with the dims after it unit-stride in x's layout: a max
    pooling of window R over x seen as (outer, inner, R) channels-last, inner the channels.
    Hiera's mask-unit attention takes the max over 4 query strides of an s8 [1, h, 49, 4, 16,
    d] tensor: oneDNN's reduction has no jit kernel for a middle axis (``ref:any``, 2 kernels
    near 20 ms each), its int8 max pooling has. The max picks an element: exact. False when
    the dims do not merge so or the pooling is not jit either."""
    attrs: ReduceAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    src = ctx.home_slot(x)
    md = ctx.slots[src].md
    if len(attrs.axes) != 1 or not md.is_plain or md.dtype != dtype:
        return False
    axis, dims, strides = attrs.axes[0], md.dims, md.strides or ()
    n, c, r = math.prod(dims[:axis]), math.prod(dims[axis + 1:]), dims[axis]
    outer = nocopy_strides(dims[:axis], strides[:axis], (n,))  # the dims seen as one
    inner = nocopy_strides(dims[axis + 1:], strides[axis + 1:], (c,))
    if outer is None or inner is None or inner[0] != 1:
        return False
    view = MemoryDesc.from_strides((n, c, r), dtype, (outer[0], 1, strides[axis]))
    kept = MemoryDesc.from_strides((n, c, 1), dtype, (c, 1, c))
    try:
        pd = pooling(Alg.pooling_max, view, kept, kernel=(r,), strides=(r,))
    except DnnlError:
        return False
    if is_slow(pd.impl_name, "pooling"):
        return False
    out = ctx.define(y, plain_md(ctx.info(y).shape, dtype))
    ctx.add_primitive(node.name, pd, {int(Arg.SRC): ctx.temp(f"{x}@windows", view, alias=src),
                                      int(Arg.DST): ctx.temp(f"{y}@windows", kept, alias=out)},
                      info=ctx.info_for(node, optimizations=["max_pooling"]))
    return True


# float reductions an average pooling computes: op -> the eltwise before it (|x|, x²) or None
AS_AVERAGE: dict[Op, Alg | None] = {Op.REDUCE_MEAN: None, Op.REDUCE_SUM: None,
                                    **{op: before for op, (before, _) in NORM_BY_SUM.items()}}


def _pooling_view(md: MemoryDesc, axes: Sequence[int]
                  ) -> tuple[MemoryDesc, MemoryDesc, int] | None:
    """x laid out as ``md`` seen as (n, c, r) with c unit-stride and r the reduced elements,
    the (n, c, 1) row-major view of the kept dims' output bytes, and r; None unless the
    reduced dims merge into one strided run, the kept dims below it in memory (at least one)
    into the unit-stride c, those above it into n, and n's dims come before c's in the
    output's order."""
    dims, strides = md.dims, md.strides
    if strides is None or not md.is_plain:
        return None
    reduced = [a for a in range(len(dims)) if a in axes and dims[a] > 1]
    kept = [a for a in range(len(dims)) if a not in axes and dims[a] > 1]
    if not reduced:
        return None
    step = min(strides[a] for a in reduced)
    inner = [a for a in kept if strides[a] < step]
    outer = [a for a in kept if strides[a] > step]
    if inner and outer and max(outer) > min(inner):
        return None

    def merged(group: list[int], axis_order: bool) -> tuple[int, int] | None:
        if not group:
            return 1, 1
        by_stride = sorted(group, key=lambda a: -strides[a])
        if axis_order and by_stride != sorted(group):
            return None  # the output is row-major in the kept dims' axis order
        size = math.prod(dims[a] for a in by_stride)
        seen = nocopy_strides([dims[a] for a in by_stride], [strides[a] for a in by_stride],
                              (size,))
        return None if seen is None else (size, seen[0])

    runs = merged(outer, True), merged(inner, True), merged(reduced, False)
    if not inner or None in runs or runs[1][1] != 1:
        return None  # (reduced axes innermost: the jit reduction reads them as they are)
    (n, n_stride), (c, _), (r, r_stride) = runs  # type: ignore[misc]
    if not outer:  # one n: the stride a dense (n, c, r) would have (jit pooling wants it)
        n_stride = r * r_stride
    return (MemoryDesc.from_strides((n, c, r), md.dtype, (n_stride, 1, r_stride)),
            MemoryDesc.from_strides((n, c, 1), md.dtype, (c, 1, c)), r)


def _as_avg_pooling(ctx: LowerContext, node: Node) -> bool:
    """A float ReduceMean / Sum / L1 / L2 / SumSquare whose reduced axes are not innermost
    in x's layout as an average pooling over x's own bytes (``_pooling_view``), the sum then
    ``·r`` and L2's square root its eltwise post-ops, L1's |x| and the squares an eltwise
    kernel in x's layout before it: oneDNN's jit reduction reads only the reduced axes
    innermost, so these would otherwise reorder x first (ConvNeXt-V2's global response
    normalization, ReduceL2 over the image of a channels-last 1x160x56x56 f32 tensor: a
    0.29 ms reorder and the square, then the sum). Sums differ from the reduction's by the
    rounding of float32 sums in another order and of the ``/r·r`` (module docstring). False
    when the view does not apply (among others, reduced axes innermost: the jit reduction
    reads those as they are) or the pooling is not jit."""
    attrs: ReduceAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    src = ctx.home_slot(x)
    md = ctx.slots[src].md
    if md.dtype != DataType.f32:
        return False
    view = _pooling_view(md, attrs.axes)
    if view is None:
        return False
    windows, kept, r = view
    post_ops = PostOps()
    if node.op is not Op.REDUCE_MEAN:
        post_ops.append_eltwise(Alg.eltwise_linear, float(r), 0.0)
    if node.op is Op.REDUCE_L2:
        post_ops.append_eltwise(Alg.eltwise_sqrt)
    attr = PrimitiveAttr()
    if len(post_ops):
        attr.set_post_ops(post_ops)
    before = AS_AVERAGE[node.op]
    try:
        pd = pooling(Alg.pooling_avg_exclude_padding, windows, kept, kernel=(r,),
                     strides=(r,), attr=attr)
        pre_pd = eltwise(before, md) if before is not None else None
    except DnnlError:
        return False
    if is_slow(pd.impl_name, "pooling") or (pre_pd is not None and
                                            is_slow(pre_pd.impl_name, "eltwise")):
        return False
    if pre_pd is not None:
        what = before.name.removeprefix("eltwise_")  # abs or square
        powered = ctx.temp(f"{x}@{what}", md)
        ctx.add_primitive(f"{node.name}:{what}", pre_pd,
                          {int(Arg.SRC): src, int(Arg.DST): powered},
                          info=ctx.info_for(node, optimizations=["avg_pooling"]))
        src = powered
    out = ctx.define(y, plain_md(ctx.info(y).shape, md.dtype))
    ctx.add_primitive(node.name, pd, {int(Arg.SRC): ctx.temp(f"{x}@windows", windows, alias=src),
                                      int(Arg.DST): ctx.temp(f"{y}@windows", kept, alias=out)},
                      info=ctx.info_for(node, optimizations=["avg_pooling"]))
    return True


def _innermost_order(node: Node, dims: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """(axis order with the reduced axes last, the strides that lay x out in that order)."""
    attrs: ReduceAttrs = node.attrs
    order = [a for a in range(len(dims)) if a not in attrs.axes] + list(attrs.axes)
    return order, ordered_strides(dims, order)


def _norm_by_sum(ctx: LowerContext, node: Node, kept: tuple[int, ...]) -> bool:
    """ReduceL1 / L2 / SumSquare as |x| or x² (an eltwise kernel writing a buffer of its own
    with the reduced axes innermost) and the jit reduction_sum over that buffer (L2: with
    eltwise_sqrt as its post-op). False when either kernel would not be jit."""
    before, after = NORM_BY_SUM[node.op]
    x = node.inputs[0]
    dims = ctx.info(x).shape
    order, strides = _innermost_order(node, dims)
    moved_dims = tuple(dims[a] for a in order)
    moved_kept = tuple(kept[a] for a in order)
    f32 = DataType.f32
    attr = PrimitiveAttr()
    if after is not None:
        attr.set_post_ops(PostOps().append_eltwise(after))
    laid_out = MemoryDesc.from_strides(dims, f32, strides)
    try:
        sum_pd = reduction(Alg.reduction_sum, plain_md(moved_dims, f32), plain_md(moved_kept, f32),
                           attr=attr)
        pre_pd = eltwise(before, laid_out)
    except DnnlError:
        return False
    if is_slow(sum_pd.impl_name, "reduction") or is_slow(pre_pd.impl_name, "eltwise"):
        return False
    what = before.name.removeprefix("eltwise_")  # abs or square
    powered = ctx.temp(f"{x}@{what}", laid_out)
    ctx.add_primitive(f"{node.name}:{what}", pre_pd,
                      {int(Arg.SRC): ctx.source(x, laid_out), int(Arg.DST): powered},
                      info=ctx.info_for(node, optimizations=["norm_by_sum"]))
    _reduce_moved(ctx, node, sum_pd, powered, moved_dims, moved_kept, f32, "norm_by_sum")
    return True


def lower_lrn(ctx: LowerContext, node: Node) -> None:
    attrs: LrnAttrs = node.attrs
    if not _float_only(ctx, node):
        lower_numpy(ctx, node, note="integer LRN")
        return
    if attrs.size % 2 == 0:
        lower_numpy(ctx, node, note=(
            f"even size {attrs.size}: oneDNN's LRN window is c ± {(attrs.size - 1) // 2} "
            f"({attrs.size - 1} channels), ONNX's c - {(attrs.size - 1) // 2} .. "
            f"c + {attrs.size // 2} ({attrs.size})"))
        return
    x, y = node.inputs[0], node.outputs[0]
    home = ctx.md_of(x)

    def make(md: MemoryDesc) -> PrimitiveDesc:
        return lrn(md, md, local_size=attrs.size, alpha=attrs.alpha, beta=attrs.beta,
                   k=attrs.bias)

    pd = ctx.try_layouts("lrn", make, [home, plain_md(home.dims, DataType.f32)])
    src_md = pd.src_md
    assert src_md is not None
    src = ctx.source(x, src_md)
    # never in place: each output reads its neighbours' inputs
    ctx.add_primitive(node.name, pd, {int(Arg.SRC): src, int(Arg.DST): ctx.define(y, src_md)},
                      info=ctx.info_for(node))

