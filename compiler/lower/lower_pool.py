"""MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool → oneDNN pooling (a global pool
is one window over all spatial dims).

Geometry: ONNX dilation d is oneDNN's d - 1; ceil_mode adds the extra end padding its last
window needs to ``padding_r`` (max pooling never selects a padded tap; average pooling excluding
padding counts only real taps; average pooling *including* padding with a ceil_mode extra would
count taps ONNX does not, so that one case runs in numpy: the float op's reference, or for an
int8 pooling with a fused chain its fused semantics, fallback.py).

int8 max pooling: u8 → u8 / s8 → s8 (jit_int, channels-last; plain nchw int8 is ``ref:any``).
Where oneDNN would run it on ``jit_int:avx2`` over more than 32 channels that are not a
multiple of 32 (about ten times slower than 32 more channels, docs/onednn.md "Pitfalls"), the
integers are converted to f32, pooled by the f32 kernel and stored back: the same maximum,
bit-exact (``_channel_tail_is_slow``).

int8 average pooling with a fused chain (``acc = avg(q - zp)``, then the chain): oneDNN's int8
pooling only writes its src data type and has no scale attributes, but applies post-ops in f32
to the average before its store ``saturate(rint(·))`` (measured: tests/compiler/
test_lower_pool.py). So the composed attributes become post-ops:

    avg(q)·w + (b - zp·w)          eltwise linear (per tensor) or binary mul / add (per channel)
    post-ops of the chain           as composed
    x·(1/dst_scale) + dst_zp        eltwise linear, then the pooling's own rounding store

Border windows of 2 or 4 taps make exact half-integer averages; when the output scale equals
the input's, oneDNN rounds those ties half to even exactly, while the reference's float chain
(avg in float64, ·s, FakeQuantize formula) lands a hair off the tie: ~0.6-1 % of inception's
pooled values differ by 1 LSB (tests/compiler/test_lower_zoo.py).

This keeps one jit_int kernel (u8 → u8 with post-ops picks ``jit_int:avx512_core``; pooling
u8 → f32 is not implemented at all). When the output type differs from the input's, when
padding is counted with a non-zero zero point, or in `unfused` mode, the pooling runs in f32 on
the dequantized input instead: reorder (src zero point) → f32 pooling → chain → reorder. A
chain with a residual add runs op by op after the f32 pooling (unfused.finish_chain): a sum
post-op adds what the dst held before, and the pooling's dst is a fresh buffer (found by
tests/fuzz, seed 5396: the residual was dropped, up to 133 LSB).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower import unfused
from qfuse.compiler.lower.attrs import build_attr
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.layouts import (
    any_md,
    channels_last,
    dnnl_type,
    is_slow,
    md_like,
    plain_md,
)
from qfuse.compiler.lower.lower_compute import composed_for
from qfuse.ir import DType, Node, Op
from qfuse.ir.ops import PoolAttrs
from qfuse.ir.postops import Binary, Composed, Eltwise, PostOp, Sum
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    pooling,
)
from qfuse.runtime.reference.ops_nn import window_out

log = logging.getLogger(__name__)
F32 = np.float32
# an int8 pooling's channel tail on jit_int:avx2 is worth the f32 route from this many output
# pixels on (``_channel_tail_is_slow``)
TAIL_MIN_PIXELS = 1024


def _geometry(node: Node, shape: tuple[int, ...]) -> tuple[dict, bool] | None:
    """oneDNN pooling arguments and whether ceil_mode added end padding."""
    if node.op in (Op.GLOBAL_AVG_POOL, Op.GLOBAL_MAX_POOL):
        return {"kernel": shape[2:]}, False
    attrs: PoolAttrs = node.attrs
    n = len(attrs.kernel_shape)
    pads_r, extra = [], False
    for i in range(n):
        size, k, s, d = shape[2 + i], attrs.kernel_shape[i], attrs.strides[i], \
            attrs.dilations[i]
        out = window_out(size, k, s, d, attrs.pads[i], attrs.pads[n + i], attrs.ceil_mode)
        need = (out - 1) * s + (k - 1) * d + 1 - size - attrs.pads[i]
        extra |= need > attrs.pads[n + i]
        pads_r.append(max(need, 0) if attrs.ceil_mode else attrs.pads[n + i])
    return {"kernel": attrs.kernel_shape, "strides": attrs.strides,
            "padding_l": attrs.pads[:n], "padding_r": tuple(pads_r),
            "dilation": tuple(d - 1 for d in attrs.dilations)}, extra


def _alg(node: Node) -> Alg:
    if node.op in (Op.MAX_POOL, Op.GLOBAL_MAX_POOL):
        return Alg.pooling_max
    if node.op is Op.AVG_POOL and node.attrs.count_include_pad:
        return Alg.pooling_avg_include_padding
    return Alg.pooling_avg_exclude_padding


def lower_pool(ctx: LowerContext, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    xinfo, yinfo = ctx.info(x), ctx.info(y)
    geometry, extra = _geometry(node, xinfo.shape)  # type: ignore[misc]
    alg = _alg(node)
    if extra and alg == Alg.pooling_avg_include_padding:
        lower_numpy(ctx, node, note="ceil_mode with count_include_pad: oneDNN would count the "
                                    "ceil_mode end taps, ONNX does not")
        return
    integer = xinfo.dtype.is_integer
    if node.fused is None or not integer:
        if node.fused is not None:
            raise ValueError(f"node {node}: a fused float pooling is not expected")
        if integer and alg == Alg.pooling_max and _channel_tail_is_slow(
                ctx, x, yinfo.shape, alg, geometry, dnnl_type(yinfo.dtype)):
            _max_pool_in_f32(ctx, node, alg, geometry)
            return
        _pool(ctx, node, x, alg, geometry, PrimitiveAttr(), {}, dnnl_type(yinfo.dtype))
        return
    composed = composed_for(ctx, node, xinfo.shape[1], yinfo.dtype)
    zp = node.fused.src_zero_point
    counted_pad = alg == Alg.pooling_avg_include_padding and any(geometry.get("padding_l", ()))
    same_type = xinfo.dtype == yinfo.dtype
    if (ctx.options.mode == "unfused" or not same_type or (counted_pad and zp)
            or any(isinstance(p, Sum) for p in composed.post_ops)):
        _pool_in_f32(ctx, node, alg, geometry, composed)
        return
    posts = _prefix(composed, zp) + list(composed.post_ops)
    if composed.dst_scale is not None or composed.dst_zero_point:
        inv = 1.0 if composed.dst_scale is None else float(F32(1.0) / F32(composed.dst_scale))
        posts.append(Eltwise("linear", inv, float(composed.dst_zero_point)))
    as_posts = Composed(composed.channels, DType.F32, post_ops=posts, fired=composed.fired)
    built = build_attr(as_posts, ndims=len(yinfo.shape), channel_axis=1, wei_mask=0,
                       dst_type=DataType.f32, scales=False)
    if _int8_pool_is_slow(ctx, x, yinfo.shape, alg, geometry, built.attr,
                          dnnl_type(yinfo.dtype)):
        _pool_in_f32(ctx, node, alg, geometry, composed)
        return
    _pool(ctx, node, x, alg, geometry, built.attr, built.fixed, dnnl_type(yinfo.dtype),
          built.names, composed.fired, rounding=composed.rounding())


def _prefix(composed: Composed, zp: int) -> list[PostOp]:
    """avg(q)·w + (b - zp·w) as post-ops."""
    w = composed.wei_scales.astype(np.float64)
    b = np.zeros(1) if composed.bias is None else composed.bias.astype(np.float64)
    shift = (b - zp * w).astype(F32)
    if w.size == 1 and shift.size == 1 or np.unique(shift).size == 1 and w.size == 1:
        if float(w[0]) == 1.0 and float(shift.flat[0]) == 0.0:
            return []
        return [Eltwise("linear", float(F32(w[0])), float(shift.flat[0]))]
    out: list[PostOp] = []
    if w.size > 1 or float(w[0]) != 1.0:
        out.append(Binary("mul", w.astype(F32)))
    out.append(Binary("add", shift))
    return out


def _pool(ctx: LowerContext, node: Node, x: str, alg: Alg, geometry: dict,
          attr: PrimitiveAttr, fixed: dict[int, Memory], dst_type: DataType,
          post_names: list[str] | None = None, fired: list[str] | None = None, *,
          define_as: str | None = None, rounding: str = "") -> str:
    """One pooling primitive reading ``x``; its dst becomes ``define_as`` (default: output)."""
    yinfo = ctx.info(node.outputs[0])
    home = ctx.md_of(x)
    candidates = [home, channels_last(home.dims, home.dtype)]

    def make(src: MemoryDesc) -> PrimitiveDesc:
        return pooling(alg, src, any_md(yinfo.shape, dst_type), attr=attr, **geometry)

    pd = ctx.try_layouts("pooling", make, candidates)
    args = {int(Arg.SRC): ctx.source(x, pd.src_md)}
    dst_md = pd.dst_md
    assert dst_md is not None
    target = define_as or node.outputs[0]
    args[int(Arg.DST)] = ctx.define(target, dst_md) if define_as is None else ctx.temp(
        target, dst_md)
    info = ctx.info_for(node, post_ops=list(post_names or []), optimizations=list(fired or []),
                        rounding=rounding)
    ctx.add_primitive(node.name, pd, args, fixed, info=info)
    return args[int(Arg.DST)]


def _int8_pool_impl(ctx: LowerContext, x: str, out_dims: tuple[int, ...], alg: Alg,
                    geometry: dict, attr: PrimitiveAttr, dst_type: DataType) -> str | None:
    """The implementation oneDNN gives the int8 pooling ``_pool`` would create (its best
    layout), None when it has none at all."""
    home = ctx.md_of(x)

    def make(src: MemoryDesc) -> PrimitiveDesc:
        return pooling(alg, src, any_md(out_dims, dst_type), attr=attr, **geometry)

    try:
        pd = ctx.try_layouts("pooling", make, [home, channels_last(home.dims, home.dtype)])
    except UnsupportedModelError:
        return None
    return pd.impl_name


def _int8_pool_is_slow(ctx: LowerContext, x: str, out_dims: tuple[int, ...], alg: Alg,
                       geometry: dict, attr: PrimitiveAttr, dst_type: DataType) -> bool:
    """Whether the best layout ``_pool`` could pick still gives a slow implementation: oneDNN
    3.2's jit int8 pooling needs enough channels for a vector (measured here: a u8 global
    average pool over 8 channels is ``ref:any``, 16 channels ``jit_int:sse41``, 32
    ``jit_int:avx2``), while f32 pooling is jit for any channel count (and takes the pooling
    oneDNN has no int8 one for)."""
    impl = _int8_pool_impl(ctx, x, out_dims, alg, geometry, attr, dst_type)
    return impl is None or is_slow(impl, "pooling")


def _channel_tail_is_slow(ctx: LowerContext, x: str, out_dims: tuple[int, ...], alg: Alg,
                          geometry: dict, dst_type: DataType) -> bool:
    """Whether oneDNN 3.2 would run this int8 pooling on ``jit_int:avx2`` over more than 32
    channels that are not a multiple of 32: its channel tail takes about ten times the whole
    pooling (measured, 2 threads, a 2x2 max pool on 24x160: 48 channels 0.60–0.73 ms, 64
    channels 0.07 ms, 40, 72, 120 and 144 alike, average pooling too), where the f32 pooling
    of the same values and the two conversions take 0.05 ms (48 channels) to 0.14 ms (120).
    The tail costs about 0.19 us per output pixel, the route two kernels more: on small maps
    (GoogLeNet's 528 channels on 14x14, PP-OCR cls's 200 channels on 1x48) the running plan
    was 1–4 % slower with it, so only outputs of at least ``TAIL_MIN_PIXELS`` pixels."""
    channels = out_dims[1]
    if channels <= 32 or channels % 32 == 0 or math.prod(out_dims[2:]) < TAIL_MIN_PIXELS:
        return False
    impl = _int8_pool_impl(ctx, x, out_dims, alg, geometry, PrimitiveAttr(), dst_type)
    return impl == "jit_int:avx2"


def _max_pool_in_f32(ctx: LowerContext, node: Node, alg: Alg, geometry: dict) -> None:
    """An int8 max pooling as f32: the integers converted (exactly), pooled, stored back — a
    maximum of the same values, so the same integers (``_channel_tail_is_slow``)."""
    x, y = node.inputs[0], node.outputs[0]
    home = ctx.md_of(x)
    src, _ = unfused.dequantized(ctx, x, 1.0, 0, channels_last(home.dims, DataType.f32),
                                 why="for the f32 max pooling of")
    name = f"{x}@f32"
    ctx.home[name] = src
    pooled = _pool(ctx, node, name, alg, geometry, PrimitiveAttr(), {}, DataType.f32,
                   define_as=f"{y}@pooled")
    _store(ctx, node, pooled, PrimitiveAttr(), {}, "")


def _store(ctx: LowerContext, node: Node, pooled: str, attr: PrimitiveAttr,
           fixed: dict[int, Memory], rounding: str) -> None:
    """The reorder writing the f32 pooling's result ``pooled`` as the node's int8 output."""
    y = node.outputs[0]
    md = ctx.slots[pooled].md
    dtype = dnnl_type(ctx.info(y).dtype)
    out = ctx.define(y, md_like(md, dtype) or plain_md(md.dims, dtype))
    kernel = ctx.add_reorder(pooled, out, attr=attr, fixed=fixed, role="op", node=None,
                             note=f"store of {node}")
    kernel.info.node = node.name
    kernel.info.rounding = rounding


def _pool_in_f32(ctx: LowerContext, node: Node, alg: Alg, geometry: dict,
                 composed: Composed) -> None:
    """int8 pooling through f32 (module docstring)."""
    assert node.fused is not None
    x, y = node.inputs[0], node.outputs[0]
    yinfo = ctx.info(y)
    zp = node.fused.src_zero_point
    deq, _ = unfused.dequantized(ctx, x, 1.0, zp)
    name = f"{x}@dq{zp}"
    ctx.home[name] = deq
    if ctx.options.mode == "unfused" or any(isinstance(p, Sum) for p in composed.post_ops):
        # a residual add: oneDNN's sum post-op adds what dst held, and this f32 dst is a
        # temporary; the chain runs op by op instead (the residual dequantized, then added)
        slot = _pool(ctx, node, name, alg, geometry, PrimitiveAttr(), {}, DataType.f32,
                     define_as=f"{y}@pooled")
        unfused.finish_chain(ctx, node, slot, 1)
        return
    posts = _prefix(composed, 0) + list(composed.post_ops)
    as_posts = Composed(composed.channels, DType.F32, post_ops=posts)
    built = build_attr(as_posts, ndims=len(yinfo.shape), channel_axis=1, wei_mask=0,
                       dst_type=DataType.f32, scales=False)
    dtype = dnnl_type(yinfo.dtype)
    if dtype == DataType.f32:
        _pool(ctx, node, name, alg, geometry, built.attr, built.fixed, DataType.f32,
              built.names, composed.fired)
        return
    pooled = _pool(ctx, node, name, alg, geometry, built.attr, built.fixed, DataType.f32,
                   built.names, composed.fired, define_as=f"{y}@pooled")
    attr = PrimitiveAttr()
    fixed: dict[int, Memory] = {}
    if composed.dst_scale is not None:
        attr.set_scales_mask(Arg.DST, 0)
        fixed[Arg.scales(Arg.DST)] = Memory.scales(composed.dst_scale)
    if composed.dst_zero_point:
        attr.set_zero_points_mask(Arg.DST, 0)
        fixed[Arg.zero_points(Arg.DST)] = Memory.zero_points(composed.dst_zero_point)
    _store(ctx, node, pooled, attr, fixed, composed.rounding())


def probe_int8_pool(ctx: LowerContext, node: Node, port: int,
                    dtype: DataType) -> MemoryDesc | None:
    """int8 pooling runs channels-last (a plain nchw int8 pooling is ``ref:any``)."""
    if port != 0 or dtype not in (DataType.u8, DataType.s8):
        return None
    return channels_last(ctx.info(node.inputs[0]).shape, dtype)
