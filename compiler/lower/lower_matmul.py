"""MatMul / Gemm → oneDNN matmul.

int8 MatMul (``node.fused`` set): ``acc = Σ (src - zp_src)·(wei - zp_wei)``, then the composed
attributes (attrs.py); oneDNN takes src, weight and dst zero points for matmul (mask 0). The
weights are expanded to src's rank with leading 1s ({.., K, N}); per-column scales use mask
1<<(ndims-1), bias and per-channel post-op operands have dims {1, .., 1, N}.

- Constant weights are reordered once into the layout the primitive picks from ``any``; u8
  weights (oneDNN's int8 matmul takes s8 only) become ``w - 128`` with zero point ``zp - 128``.
- Activation × activation (attention's Q·Kᵀ, P·V): the weights are a runtime tensor, taken in
  its producer's layout; a u8 one is shifted to s8 by a reorder with src zero point 128.
- A src of lower rank than the output is viewed with leading 1s (zero copy).
- Without VNNI/AMX the int8 weights are split so the accumulator stays exact (no_vnni.py;
  runtime weights by two small kernels), and an s8 src is read as u8 + 128 with its zero
  point + 128 (one reorder; exact): oneDNN's GEMM takes u8 sources 2.5x faster there.
  Where ``K · max|x - zp_x| · max|w - zp_w| < 2^24`` (the src's range, the constant weights
  themselves or the runtime weights' range) the node is instead a float32 matmul over
  ``x - zp_x`` and ``w - zp_w``: each product is an integer below 2^16, each partial sum an
  integer below 2^24, which float32 holds exactly in any order, so the accumulator is exact
  with one primitive and no split; the weight scales, bias, post-ops and the store's scale
  and zero point are its post-ops (``as_float_post_ops``: the int8 primitive's roundings),
  and a reorder makes the store's rint and saturation (oneDNN 3.2's f32 matmul writes no
  8-bit dst). Bit-identical to the split; on AVX2, 2 threads: attention's Q·Kᵀ and P·V (K
  = head size or tokens) and an unrolled LSTM's recurrent products (1 row): DeiT-Tiny QDQ
  0.95x, LeViT-128S 0.90x, a BERT-like encoder 0.93x, a CRNN's LSTM 0.97x. Not with a
  run-time src zero point or a residual sum.
- Float MatMul folds the composer's weight scales into constant weights; Gemm with a constant
  B (alpha folded in, ``beta·C`` as the bias) is a float matmul, anything else runs in numpy.
- oneDNN 3.2 has no f32 matmul that writes u8 / s8 with a bias (``dnnl_unimplemented``; a
  float MatMul whose int8 quantization declined, reading a quantized output): such a node
  runs as the f32 matmul with an f32 dst, then its chain op by op (unfused.py), and
  ``inspect`` says so on the kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower import no_vnni, unfused
from qfuse.compiler.lower.attrs import BuiltAttr, as_float_post_ops
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.layouts import any_md, dnnl_type, md_like, plain_md, same_bytes
from qfuse.compiler.lower.lower_compute import (
    composed_for,
    emit,
    scale_weights,
    src_zero_point,
)
from qfuse.ir import DType, Node, Op
from qfuse.ir.ops import GemmAttrs
from qfuse.ir.postops import Composed, Eltwise, Sum
from qfuse.runtime.onednn import (
    Arg,
    DataType,
    DnnlError,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    matmul,
)
from qfuse.runtime.numerics.rounding import F32_EXACT

log = logging.getLogger(__name__)
F32 = np.float32
FLOAT_MATMUL = "float32 matmul"  # in the notes of an int8 node computed in float32


def lower_matmul(ctx: LowerContext, node: Node, *, float_path: bool = True) -> None:
    """The node as oneDNN's matmul (module docstring). ``float_path``: an int8 node may be a
    float32 matmul (without VNNI); should oneDNN find no primitive for that form, what it
    added is undone and the node lowered again without it."""
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    ainfo, binfo, yinfo = ctx.info(a), ctx.info(b), ctx.info(y)
    nd = len(yinfo.shape)
    channels = yinfo.shape[-1]
    integer = ainfo.dtype.is_integer
    if integer and node.fused is None:
        raise UnsupportedModelError(f"node {node}: integer MatMul without a fused output stage")
    if len(ainfo.shape) < 2 or len(binfo.shape) < 2:
        raise UnsupportedModelError(f"node {node}: MatMul of 1-D operands is not supported")
    src_zp = src_zero_point(ctx, node) if integer else 0
    wei_zp = node.fused.wei_zero_point if (node.fused and integer) else 0
    a_dims = (1,) * (nd - len(ainfo.shape)) + ainfo.shape
    b_dims = (1,) * (nd - len(binfo.shape)) + binfo.shape
    bconst = ctx.const(b)
    bvalue = b
    src_value = ctx.ranked(a, nd)  # a src of lower rank: a view with leading 1s
    wtype = DataType.f32
    wslot: Callable[[PrimitiveDesc], str] | None = None
    wei: np.ndarray | None = None
    exact = None
    # an int8 node computed as a float32 matmul over its integer operands (module docstring)
    in_f32 = float_path and integer and _exact_in_f32(ctx, node, src_zp, bconst, wei_zp)
    restore = ctx.checkpoint() if in_f32 else None
    if in_f32:
        src_value, src_zp = _as_f32(ctx, src_value, int(src_zp)), 0  # type: ignore[arg-type]
        if bconst is not None:
            wei = bconst.reshape(b_dims).astype(F32) - F32(wei_zp)
        else:
            bvalue = _as_f32(ctx, ctx.ranked(b, nd), wei_zp)
            wslot = _weights_source(ctx, bvalue)
        wei_zp = 0
    elif integer:
        if (ctx.md_of(src_value).dtype == DataType.s8 and not no_vnni.isa_is_exact()
                and isinstance(src_zp, int)):
            # without VNNI oneDNN's GEMM runs an s8 src 2.5x slower than the same src as
            # u8 + 128 with a zero point ([197, 768]·[768, 3072] on AVX2: 9.9-12.3 ms against
            # 3.7-4.2 ms)
            src_value, src_zp = no_vnni.shifted(ctx, src_value, "s8 src as u8 (no VNNI)"), \
                src_zp + 128
        wtype = DataType.s8
        if bconst is not None:
            wei = bconst.reshape(b_dims)
            if wei.dtype == np.uint8:  # oneDNN takes s8 weights: w - 128 with zp - 128
                wei, wei_zp = (wei.astype(np.int16) - 128).astype(np.int8), wei_zp - 128
        else:
            bvalue, wei_zp = _s8_weights(ctx, b, b_dims, wei_zp)
            wslot = _weights_source(ctx, bvalue)
        exact = no_vnni.for_matmul(ctx, node, wei, None if wei is not None else bvalue)
    elif bconst is not None:
        wei = bconst.astype(F32).reshape(b_dims)
    else:
        bvalue = ctx.ranked(b, nd)
        wslot = _weights_source(ctx, bvalue)

    def create(built: BuiltAttr, dst_md: MemoryDesc | None, comp: Composed, *,
               weights: np.ndarray | None = None, src_md: MemoryDesc | None = None
               ) -> tuple[PrimitiveDesc, Memory | None]:
        assert src_md is None  # a matmul's halves read its own source (no_vnni.Create)
        wei_arr, bias_values = wei if weights is None else weights, comp.bias
        bias_md = None
        if bias_values is not None:
            bias_md = MemoryDesc.from_tag((1,) * (nd - 1) + (channels,), DataType.f32)
        dst_type = DataType.f32 if in_f32 else dnnl_type(yinfo.dtype)
        dst_any = any_md(yinfo.shape, dst_type if dst_md is None else dst_md.dtype)
        home = ctx.md_of(src_value)
        wmd = any_md(b_dims, wtype) if wei_arr is not None else ctx.md_of(bvalue)
        src_any = any_md(a_dims, home.dtype)
        candidates = [(home, dst_md or dst_any, wmd), (src_any, dst_any, wmd),
                      (src_any, dst_any, plain_md(b_dims, wtype))]

        def make(c: tuple[MemoryDesc, MemoryDesc, MemoryDesc]) -> PrimitiveDesc:
            return matmul(c[0], c[2], c[1], bias=bias_md, attr=built.attr)

        pd = ctx.try_layouts("matmul", make, candidates)
        permuted = None if dst_md is not None else _transposed_dst(ctx, y, pd)
        if permuted is not None:
            try:
                strided = make((pd.src_md, permuted, pd.weights_md))
            except DnnlError:
                strided = None
            if strided is not None and strided.impl_name == pd.impl_name:
                pd = strided
        wmem = None if wei_arr is None else ctx.weights(wei_arr, pd.weights_md)
        return pd, wmem

    wei_mask = 1 << (nd - 1)
    renamed = node if src_value == a else _with_input(node, src_value)
    if integer and ctx.options.mode == "unfused":
        unfused.lower_compute(ctx, renamed, channel_axis=nd - 1, src_value=src_value,
                              create=create,
                              src_zp=src_zp, wei_zp=wei_zp, wei_mask=wei_mask,
                              weights_slot=wslot, exact=exact)
        return
    composed = composed_for(ctx, node, channels, yinfo.dtype)
    if in_f32:  # every attribute as the post-ops that round as the int8 primitive does, the
        # store's rint as a last round (an integer then: any f32 → 8-bit reorder stores it as
        # is) and its saturation by that reorder (_store_exact_f32)
        floats = as_float_post_ops(composed)
        rint = [Eltwise("round")] if yinfo.dtype.is_integer else []
        composed = replace(floats, post_ops=[*floats.post_ops, *rint], fired=composed.fired,
                           form=composed.rounding() or None)
    plain = wei
    if not integer and wei is not None:
        wei = scale_weights(wei, composed.wei_scales, (nd - 1,))
        composed = replace(composed, wei_scales=np.ones(1, F32))
    try:
        emit(ctx, renamed, "matmul", composed, channel_axis=nd - 1, wei_mask=wei_mask,
             src_zp=src_zp, wei_zp=wei_zp, scales=integer and not in_f32, create=create,
             weights_slot=wslot, exact=exact)
        if in_f32:
            _store_exact_f32(ctx, node, yinfo.dtype)
    except (UnsupportedModelError, DnnlError) as exc:
        if restore is not None:  # the float32 form declined: the int8 one instead
            restore()
            log.info("node %s: as a float32 matmul: %s; int8 instead", node, exc)
            lower_matmul(ctx, node, float_path=False)
            return
        if integer or node.fused is None or not yinfo.dtype.is_integer \
                or not isinstance(exc, UnsupportedModelError):
            raise
        log.info("node %s: %s; f32 dst, then the chain op by op", node, exc)
        wei = plain  # the chain's own multiply applies the weight scales
        unfused.lower_compute(
            ctx, renamed, channel_axis=nd - 1, src_value=src_value, create=create, src_zp=0,
            wei_zp=0, wei_mask=wei_mask, weights_slot=wslot,
            note=f"f32 matmul, then its chain op by op: oneDNN 3.2 has no f32 matmul "
                 f"writing {yinfo.dtype.name.lower()} with these attributes")


def _exact_in_f32(ctx: LowerContext, node: Node, src_zp: object, wei: np.ndarray | None,
                  wei_zp: int) -> bool:
    """Whether an int8 MatMul whose weights would be split in halves (no VNNI: no_vnni.py)
    runs instead as a float32 matmul over ``x - zp_x`` and ``w - zp_w``. Every product is an
    integer below 2^16 in magnitude and every partial sum below 2^24, so float32 holds them
    exactly, in any summation order, when ``K · max|x - zp_x| · max|w - zp_w| < 2^24``; the
    weight scales, bias and post-ops then round as on the int8 primitive (attrs.py
    ``as_float_post_ops``). Not with a run-time zero point, or a residual sum (it writes the
    residual's 8-bit buffer in place)."""
    fused = node.fused
    if (ctx.options.mode != "fused" or not ctx.options.exact_int8 or no_vnni.isa_is_exact()
            or fused is None or fused.src_zero_point_port is not None
            or not isinstance(src_zp, int)):
        return False
    composed = composed_for(ctx, node, ctx.info(node.outputs[0]).shape[-1],
                            ctx.info(node.outputs[0]).dtype)
    if any(isinstance(op, Sum) for op in composed.post_ops):
        return False
    x_type = ctx.info(node.inputs[0]).dtype
    w_type = ctx.info(node.inputs[1]).dtype if wei is None else DType.from_numpy(wei.dtype)
    if x_type not in (DType.U8, DType.S8) or w_type not in (DType.U8, DType.S8):
        return False
    if wei is not None:
        wide = wei.astype(np.int32)
        if no_vnni.within_safe_range(wide - 128 if wei.dtype == np.uint8 else wide):
            return False  # the int8 primitive is exact as it is, and faster
        w_max = int(np.abs(wide - wei_zp).max(initial=0))
    else:
        w_low, w_high = w_type.range
        w_max = max(wei_zp - w_low, w_high - wei_zp)
    x_low, x_high = x_type.range
    x_max = max(src_zp - x_low, x_high - src_zp)
    return ctx.info(node.inputs[0]).shape[-1] * x_max * w_max < F32_EXACT


def _store_exact_f32(ctx: LowerContext, node: Node, dtype: DType) -> None:
    """After the float32 matmul of an int8 node: its note, and for an 8-bit output the
    store the int8 primitive makes (rint, saturation) as a reorder into the output."""
    kernel = ctx.kernels[-1]  # emit's last: the node's own primitive (no residual sum here)
    assert kernel.info.node == node.name, kernel.name
    how = f"{FLOAT_MATMUL}: integer operands, every partial sum within ±2^24 (no split)"
    ctx.exact_int8[kernel.name] = how
    kernel.info.add_note(f"exact_int8: {how}")
    if not dtype.is_integer:
        return
    y = node.outputs[0]
    acc = ctx.home_slot(y)
    md = md_like(ctx.slots[acc].md, dnnl_type(dtype))
    assert md is not None
    ctx.add_reorder(acc, ctx.define(y, md), role="op",
                    note=f"exact_int8: '{y}' stored as {dtype.name.lower()} (rint, saturation) "
                         f"after a {FLOAT_MATMUL}")


def _as_f32(ctx: LowerContext, value: str, zp: int) -> str:
    """The value ``value - zp`` (an 8-bit value) as float32, in its own layout: one reorder
    (``unfused.dequantized``), shared by every reader."""
    name = f"{value}@f32-{zp}"
    if name not in ctx.home:
        ctx.home[name], _ = unfused.dequantized(ctx, value, 1.0, zp,
                                                why=f"an operand of a {FLOAT_MATMUL}")
    return name


def _transposed_dst(ctx: LowerContext, y: str, pd: PrimitiveDesc) -> MemoryDesc | None:
    """A dst layout in which the one Transpose reading ``y`` is a view (lower_transpose): its
    output then lies row-major (or as its readers want) without a copy. Attention's P·V
    [B, h, N, d] transposed to [B, N, h, d] before the output projection: the matmul writes
    [B, N, h, d] itself (strides of ``acbd``; brgemm takes them). None when y has other
    readers, is a graph output, or the matmul already writes that layout."""
    readers = ctx.graph.consumers(y)
    if len(readers) != 1 or readers[0][0].op is not Op.TRANSPOSE or ctx.is_output(y):
        return None
    transpose = readers[0][0]
    out = transpose.outputs[0]
    if ctx.is_output(out) or pd.dst_md is None:
        return None
    dtype = pd.dst_md.dtype
    wanted = ctx.preferred(out, dtype)
    if wanted is None or not wanted.is_plain:
        wanted = plain_md(ctx.info(out).shape, dtype)
    strides = [0] * len(transpose.attrs.perm)
    for i, axis in enumerate(transpose.attrs.perm):
        strides[axis] = (wanted.strides or ())[i]
    md = MemoryDesc.from_strides(ctx.info(y).shape, dtype, strides)
    return None if same_bytes(md, pd.dst_md) else md


def _weights_source(ctx: LowerContext, value: str) -> Callable[[PrimitiveDesc], str]:
    """Runtime weights: the slot of ``value`` in the layout the matmul chose."""

    def slot(pd: PrimitiveDesc) -> str:
        md = pd.weights_md
        assert md is not None
        return ctx.source(value, md)

    return slot


def _with_input(node: Node, src_value: str) -> Node:
    clone = Node(node.name, node.op, node.attrs, [src_value, *node.inputs[1:]],
                 list(node.outputs), list(node.origin), node.meta, node.fused)
    return clone


def _s8_weights(ctx: LowerContext, b: str, dims: tuple[int, ...], zp: int) -> tuple[str, int]:
    """A runtime weights tensor as s8: u8 is shifted by 128 with a reorder (zero point - 128)."""
    bvalue = ctx.ranked(b, len(dims))
    md = ctx.md_of(bvalue)
    if md.dtype == DataType.s8:
        return bvalue, zp
    if md.dtype != DataType.u8:
        raise UnsupportedModelError(f"node {ctx.current}: int8 MatMul weights are {md.dtype.name}")
    name = f"{b}@s8"
    if name not in ctx.home:
        slot = ctx.temp(name, md_like(md, DataType.s8) or plain_md(dims, DataType.s8))
        attr = PrimitiveAttr().set_zero_points_mask(Arg.SRC, 0)
        ctx.add_reorder(ctx.home_slot(bvalue), slot, attr=attr,
                        fixed={Arg.zero_points(Arg.SRC): Memory.zero_points(128)},
                        note=f"u8 '{b}' shifted to s8 for the matmul weights")
        ctx.home[name] = slot
    return name, zp - 128


def lower_gemm(ctx: LowerContext, node: Node) -> None:
    """Gemm with a constant B (and C broadcast along rows) → f32 matmul; else numpy."""
    attrs: GemmAttrs = node.attrs
    b = ctx.const(node.inputs[1])
    c = ctx.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    n = ctx.info(node.outputs[0]).shape[-1]
    plain_c = c is None or c.size in (1, n) and (c.ndim < 2 or c.shape[0] == 1)
    if attrs.trans_a or b is None or not plain_c or ctx.info(node.inputs[0]).dtype != DType.F32:
        lower_numpy(ctx, node)
        return
    w = (b.T if attrs.trans_b else b).astype(np.float64) * attrs.alpha
    bias = None if c is None else np.broadcast_to(
        c.astype(np.float64).ravel() * attrs.beta, (n,)).astype(F32)
    composed = Composed(n, DType.F32, bias=bias)
    w32 = np.ascontiguousarray(w.astype(F32))
    yinfo = ctx.info(node.outputs[0])

    def create(built: BuiltAttr, dst_md: MemoryDesc | None,
               comp: Composed) -> tuple[PrimitiveDesc, Memory | None]:
        bias_md = None if comp.bias is None else MemoryDesc.from_tag((1, n), DataType.f32)
        home = ctx.md_of(node.inputs[0])
        candidates = [home, any_md(home.dims, DataType.f32)]

        def make(src: MemoryDesc) -> PrimitiveDesc:
            return matmul(src, any_md(w32.shape, DataType.f32),
                          dst_md or any_md(yinfo.shape, DataType.f32), bias=bias_md,
                          attr=built.attr)

        pd = ctx.try_layouts("matmul", make, candidates)
        return pd, ctx.weights(w32, pd.weights_md)

    emit(ctx, node, "matmul", composed, channel_axis=1, wei_mask=2, src_zp=0, wei_zp=0,
         scales=False, create=create)
