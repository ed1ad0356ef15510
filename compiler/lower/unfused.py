"""The `unfused` lowering of a fused node: one oneDNN primitive per basic operation.

The int8 compute primitive keeps its int8 kernel and only its zero points, and writes the
exact accumulator as f32 (``acc`` is an int32 that f32 holds exactly below 2^24). Then every
basic operation of ``to_basic(chain)`` (passes/composer.py) runs as its own primitive, in
place on that f32 tensor:

    multiply / add   per tensor: eltwise linear;  per channel: binary mul / add (src1 {1,C,1,1})
    round            eltwise round
    clip             per tensor: eltwise clip;  per channel: binary max then binary min
    activation       eltwise (relu, clip, logistic, tanh, hardswish, …)
    residual sum     reorder r → f32 with src scale / zero point (= s·(r - zp)), binary add
    prelu            per tensor: eltwise relu with alpha = slope;  per channel: numpy
    store            reorder f32 → u8 / s8 (rint, saturate) for an integer output

This is what the fused primitive computes with its attributes, minus the fusion: the `bench`
comparison measures what fusing saves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from qfuse.compiler.lower import no_vnni
from qfuse.compiler.lower.attrs import BuiltAttr, SrcZeroPoint, build_attr, channel_array
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.layouts import (
    any_md,
    const_memory,
    dnnl_type,
    is_slow,
    md_like,
    plain_md,
)
from qfuse.ir import DType, Node, Op
from qfuse.ir.postops import (
    Add,
    Clip,
    Composed,
    Div,
    Eltwise,
    Mul,
    Prelu,
    Round,
    Sum,
    TensorBinary,
)
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    binary,
    eltwise,
)

log = logging.getLogger(__name__)
KINDS = {Op.CONV: "convolution", Op.CONV_TRANSPOSE: "deconvolution"}
F32 = np.float32
Create = Callable[[BuiltAttr, MemoryDesc | None, Composed], tuple[PrimitiveDesc, Memory | None]]


def lower_compute(ctx: LowerContext, node: Node, *, channel_axis: int, create: Create,
                  src_zp: SrcZeroPoint, wei_zp: int, wei_mask: int, src_value: str | None = None,
                  weights_slot: Callable[[PrimitiveDesc], str] | None = None,
                  exact: no_vnni.Exactness | None = None,
                  note: str = "unfused: int8 accumulator as f32") -> None:
    """The int8 primitive (zero points only, f32 dst), then the chain op by op; ``exact``:
    if the implementation oneDNN picks is not exact, the accumulator from split weights
    (no_vnni.py). A float primitive (f32 src and weights) works the same way."""
    y = node.outputs[0]
    shape = ctx.info(y).shape
    channels = shape[channel_axis]
    empty = Composed(channels, DType.F32)
    built = build_attr(empty, ndims=len(shape), channel_axis=channel_axis, wei_mask=wei_mask,
                       dst_type=DataType.f32, src_zp=src_zp, wei_zp=wei_zp)
    made = None
    if exact is not None:  # the implementation oneDNN picks decides (no_vnni.py)
        made = create(built, any_md(shape, DataType.f32), empty)
        if not exact.needed(made[0].impl_name):
            exact = None
        elif exact.shift_src:
            node, src_zp = exact.shift_source()
            built = build_attr(empty, ndims=len(shape), channel_axis=channel_axis,
                               wei_mask=wei_mask, dst_type=DataType.f32, src_zp=src_zp,
                               wei_zp=wei_zp)
            made = None
    if exact is not None and exact.splits:
        plain, unsplit_attr = empty, built

        def unsplit() -> PrimitiveDesc:
            return create(unsplit_attr, any_md(shape, DataType.f32), plain)[0]

        def main_is_slow(main: Composed) -> bool:
            assert exact is not None and exact.halves is not None
            zh = no_vnni.split_zero_point(wei_zp)[0]
            attr = build_attr(main, ndims=len(shape), channel_axis=channel_axis,
                              wei_mask=wei_mask, dst_type=DataType.f32, src_zp=src_zp,
                              wei_zp=zh)
            pd = create(attr, any_md(shape, DataType.f32), main, weights=exact.halves[0])[0]
            return is_slow(pd.impl_name, KINDS.get(node.op, "matmul"))

        # a main primitive that would be slow (a 1x1 conv over a 1x1 image): the halves are
        # added by a binary primitive, as in fused mode
        acc = exact.lower_with_binary(ctx, node, plain, create=create,
                                      channel_axis=channel_axis, wei_mask=wei_mask,
                                      src_zp=src_zp, unsplit=unsplit,
                                      main_is_slow=main_is_slow, into=f"{y}@acc")
        if acc is not None:
            finish_chain(ctx, node, acc, channel_axis)
            return
        empty, create, weights_slot, wei_zp = exact.apply(
            ctx, node, empty, create=create, weights_slot=weights_slot,
            channel_axis=channel_axis, wei_mask=wei_mask, src_zp=src_zp, wei_zp=wei_zp,
            unsplit=unsplit)
        if exact.splits:
            built = build_attr(empty, ndims=len(shape), channel_axis=channel_axis,
                               wei_mask=wei_mask, dst_type=DataType.f32, src_zp=src_zp,
                               wei_zp=wei_zp)
            made = None
    pd, wmem = made if made is not None else create(built, any_md(shape, DataType.f32), empty)
    x = src_value or node.inputs[0]
    args = {int(Arg.SRC): ctx.source(x, pd.src_md), **built.slot_args}
    fixed = dict(built.fixed)
    if weights_slot is not None:
        args[int(Arg.WEIGHTS)] = weights_slot(pd)
    else:
        assert wmem is not None
        fixed[int(Arg.WEIGHTS)] = wmem
    dst_md = pd.dst_md
    assert dst_md is not None
    acc = ctx.temp(f"{y}@acc", dst_md)
    args[int(Arg.DST)] = acc
    kernel = ctx.add_primitive(node.name, pd, args, fixed,
                               info=ctx.info_for(node, note=note))
    if exact is not None:
        exact.record(ctx, kernel)
    finish_chain(ctx, node, acc, channel_axis)


def finish_chain(ctx: LowerContext, node: Node, slot: str, channel_axis: int) -> None:
    """Apply ``node.fused.chain`` op by op to the f32 ``slot``, then store the output."""
    assert node.fused is not None
    y = node.outputs[0]
    yinfo = ctx.info(y)
    basic = node.meta.get("basic")
    assert basic is not None, f"{node}: no basic operations (compose_post_ops)"
    md = ctx.slots[slot].md
    nd, channels = len(yinfo.shape), yinfo.shape[channel_axis]
    for index, op in enumerate(basic):
        name = f"{node.name}:{index}"
        if isinstance(op, Mul | Add):
            alg = "mul" if isinstance(op, Mul) else "add"
            if op.values.size == 1:
                v = float(op.values[0])
                alpha, beta = (v, 0.0) if alg == "mul" else (1.0, v)
                _eltwise(ctx, name, slot, Alg.eltwise_linear, alpha, beta)
            else:
                _binary_const(ctx, name, slot, alg, channel_array(op.values, nd, channel_axis,
                                                                  channels))
        elif isinstance(op, Div):
            _binary_const(ctx, name, slot, "div", channel_array(op.values, nd, channel_axis,
                                                                channels))
        elif isinstance(op, Round):
            _eltwise(ctx, name, slot, Alg.eltwise_round)
        elif isinstance(op, Clip):
            if op.lo.size == 1 and op.hi.size == 1:
                _eltwise(ctx, name, slot, Alg.eltwise_clip, float(op.lo[0]), float(op.hi[0]))
            else:
                _binary_const(ctx, name, slot, "max", channel_array(op.lo, nd, channel_axis,
                                                                    channels))
                _binary_const(ctx, f"{name}b", slot, "min",
                              channel_array(op.hi, nd, channel_axis, channels))
        elif isinstance(op, Eltwise):
            _eltwise(ctx, name, slot, Alg[f"eltwise_{op.alg}"], op.alpha, op.beta)
        elif isinstance(op, Prelu):
            if op.slopes.size == 1:
                _eltwise(ctx, name, slot, Alg.eltwise_relu, float(op.slopes[0]))
            else:
                slot = _prelu_numpy(ctx, name, slot, channel_array(op.slopes, nd, channel_axis,
                                                                   channels))
                md = ctx.slots[slot].md
        elif isinstance(op, TensorBinary):
            # full size: in the chain's layout; broadcast: as is
            value = node.inputs[op.port]
            full = ctx.info(value).shape == md.dims
            r_slot, r_md = dequantized(ctx, ctx.ranked(value, len(yinfo.shape)), 1.0, 0,
                                       md if full else None)
            pd = binary(Alg[f"binary_{op.alg}"], md, r_md, md)
            ctx.add_primitive(name, pd, {int(Arg.SRC_0): slot, int(Arg.SRC_1): r_slot,
                                         int(Arg.DST): slot},
                              info=ctx.info_for(None, note=f"unfused gate of {node}",
                                                post_ops=[f"binary_{op.alg}"]))
        elif isinstance(op, Sum):
            r_slot, r_md = dequantized(ctx, node.inputs[op.port], op.scale, op.zero_point, md)
            pd = binary(Alg.binary_add, md, r_md, md)
            ctx.add_primitive(name, pd, {int(Arg.SRC_0): slot, int(Arg.SRC_1): r_slot,
                                         int(Arg.DST): slot},
                              info=ctx.info_for(None, note=f"unfused residual add of {node}",
                                                post_ops=["binary_add"]))
    dtype = dnnl_type(yinfo.dtype)
    if dtype == DataType.f32:
        ctx.define(y, md, alias=slot)
        return
    out = ctx.define(y, md_like(md, dtype) or plain_md(md.dims, dtype))
    ctx.add_reorder(slot, out, role="op", node=None,
                    note=f"unfused store of {node} to {yinfo.dtype.name}")
    ctx.kernels[-1].info.node = node.name


def dequantized(ctx: LowerContext, value: str, scale: float, zp: int,
                md: MemoryDesc | None = None, *, why: str = "residual") -> tuple[str, MemoryDesc]:
    """A slot holding ``scale·(value - zp)`` in f32 (in ``md``'s layout when given); ``why``:
    what it is for, in the reorder's note."""
    home = ctx.md_of(value)
    target = md_like(md, DataType.f32) if md is not None else None
    target = target or md_like(home, DataType.f32) or plain_md(home.dims, DataType.f32)
    if home.dtype == DataType.f32 and scale == 1.0 and zp == 0:
        slot = ctx.source(value, target)
        return slot, ctx.slots[slot].md
    key = f"{value}@f32({scale:.9g},{zp})"
    if key in ctx.home and ctx.md_of(key) == target:
        return ctx.home[key], target
    slot = ctx.temp(key, target)
    attr = PrimitiveAttr()
    fixed: dict[int, Memory] = {}
    if scale != 1.0:
        attr.set_scales_mask(Arg.SRC, 0)
        fixed[Arg.scales(Arg.SRC)] = Memory.scales(scale)
    if zp:
        attr.set_zero_points_mask(Arg.SRC, 0)
        fixed[Arg.zero_points(Arg.SRC)] = Memory.zero_points(zp)
    ctx.add_reorder(ctx.home_slot(value), slot, attr=attr, fixed=fixed, role="op",
                    note=f"dequantize {why} '{value}' (s={scale:.6g}, zp={zp})")
    ctx.home[key] = slot
    return slot, target


def _eltwise(ctx: LowerContext, name: str, slot: str, alg: Alg, alpha: float = 0.0,
             beta: float = 0.0) -> None:
    md = ctx.slots[slot].md
    pd = eltwise(alg, md, md, alpha=alpha, beta=beta)
    ctx.add_primitive(name, pd, {int(Arg.SRC): slot, int(Arg.DST): slot},
                      info=ctx.info_for(None, note="unfused post-op",
                                        post_ops=[alg.name],
                                        post_op_details=[f"{alg.name}({alpha:.6g}, {beta:.6g})"]))


def _binary_const(ctx: LowerContext, name: str, slot: str, alg: str,
                  values: np.ndarray) -> None:
    md = ctx.slots[slot].md
    operand = const_memory(values, F32)
    pd = binary(Alg[f"binary_{alg}"], md, operand.md, md)
    ctx.add_primitive(name, pd, {int(Arg.SRC_0): slot, int(Arg.DST): slot},
                      {int(Arg.SRC_1): operand},
                      info=ctx.info_for(None, note="unfused post-op",
                                        post_ops=[f"binary_{alg}"]))


def _prelu_numpy(ctx: LowerContext, name: str, slot: str, slopes: np.ndarray) -> str:
    md = ctx.slots[slot].md
    plain = slot
    if not md.is_plain or md.strides != plain_md(md.dims, md.dtype).strides:
        plain = ctx.temp(f"{slot}@plain", plain_md(md.dims, md.dtype))
        ctx.add_reorder(slot, plain)

    def prelu(arrays: list[np.ndarray]) -> list[np.ndarray]:
        x = arrays[0]
        return [np.where(x >= 0, x, x * slopes).astype(F32)]

    ctx.add_numpy(name, prelu, [plain], [plain], ctx.info_for(None, note="unfused prelu"))
    return plain
