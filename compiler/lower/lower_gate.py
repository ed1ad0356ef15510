"""Activations and Add / Mul, plain or carrying a gate chain (passes/fuse_post_ops.py
``_fuse_gate``).

A plain one is one eltwise / binary primitive (lower_misc). A fused one computes its chain
from x — the op itself is the chain's first item — e.g. SiLU with the gate's quantizer kept,

    x·Q(sigmoid(x))  →  [logistic, quantize, dequantize, mul input 0, quantize]

as a single oneDNN binary primitive: ``x·1 = x`` (exact for every float32, signed zeros and NaN
included; the 1 is a broadcast one-element tensor, so the kernel reads x once for its source,
not twice as ``max(x, x)`` did), then the composed post-ops —
the activation as an eltwise post-op, the quantize as linear/round/clip, ``binary_mul`` reading
x again, and the store's scale and zero point as eltwise linear (attrs.store_post_ops: the
same float32 operations as the int8 store, since the binary primitive takes no dst scale) —
written as u8/s8 with rint and saturation. oneDNN's eltwise primitive has no jit kernel with
binary post-ops (``ref:any``); its binary primitive has (``jit:uni``).

A chain on a dequantized 8-bit source (``fused.src_scale`` set) reads q itself: the binary
primitive is ``q − zp`` (``binary_sub`` with a one-element zp; u8/s8 to f32 exactly) with a first
post-op ``linear(s, 0)`` — ``f32(q − zp)·s``, the DequantizeLinear's own arithmetic — then the
same post-ops, into an 8-bit dst (oneDNN 3.2's jit binary takes an 8-bit source only with an
8-bit dst; the pass makes sure the chain ends in a quantize).

A chain whose first item is an Add / Mul reading a second tensor (a run-time one, or a
constant along other axes than the channels: attention's position bias, a LayerNorm's γ / β
on [N, T, C]) makes that the primitive's own operation, ``x ∘ r`` with r its second operand:
oneDNN's binary primitive broadcasts its operand on jit kernels where a binary *post-op*
with such a broadcast runs on ``ref:any`` (measured: [1, 1, C] on [1, T, C]). A chain
starting with ``x − r`` or ``x / r`` does the same where r as a post-op would run on a
reference kernel and regrouping declines (``_slow_as_post_op``).

When that first operation's second tensor is itself a dequantized 8-bit tensor and both
dequantizes are per tensor with zero point 0 (a residual Add of two symmetric int8 branches:
NNCF's, or u8 after a ReLU), the primitive reads both 8-bit tensors with SRC_0 / SRC_1 scale
attributes — ``f32(q)·s`` each, the DequantizeLinear's own multiply, measured bit-exact on
jit:uni with an 8-bit dst — and the second dequantize is no kernel (``int8_operand``;
lower_quant defers it): Res2Net-50 QDQ 461 → 389 kernels, 8.23 → 7.63 ms.

The unfused mode runs the chain one primitive per basic operation on a copy of x
(unfused.finish_chain).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from qfuse.compiler.lower import lower_binary as binary_ops
from qfuse.compiler.lower import lower_misc, lower_quant, unfused
from qfuse.compiler.lower.attrs import (
    BuiltAttr,
    as_float_post_ops,
    build_attr,
    per_channel_dims,
    tiled_channels,
)
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.layouts import (
    const_memory,
    dense_in_order,
    dnnl_type,
    first_fast,
    grouped_md,
    is_row_major,
    is_slow,
    md_like,
    memory_order_groups,
    plain_md,
    same_bytes,
)
from qfuse.ir import Node, Op
from qfuse.ir.postops import (
    Binary,
    Composed,
    Eltwise,
    TensorBinary,
    channel_in_the_middle,
    one_value,
)
from qfuse.ir.rows import repeat_kernel_pays, repeats
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    DnnlError,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    binary,
    reorder,
)
from qfuse.runtime.onednn.attr import MAX_POST_OPS

log = logging.getLogger(__name__)


def lower_activation(ctx: LowerContext, node: Node) -> None:
    if node.fused is None:
        lower_misc.lower_eltwise(ctx, node)
        return
    lower_gate(ctx, node)


def lower_fake_quantize(ctx: LowerContext, node: Node) -> None:
    """A quantize: with its dequantize (passes/fuse_post_ops.py ``_fuse_fake_quantize``) one
    binary primitive writing the float32 values; plain, lower_quant's kernel."""
    if node.fused is None:
        lower_quant.lower_quantize(ctx, node)
        return
    lower_gate(ctx, node)


def lower_binary(ctx: LowerContext, node: Node) -> None:
    """Add / Mul: a gate chain's first op (x + 3 of x·relu6(x + 3)/6), or plain."""
    if node.fused is None:
        binary_ops.lower_binary(ctx, node)
        return
    lower_gate(ctx, node)


def lower_gate(ctx: LowerContext, node: Node) -> None:
    """The chain as one kernel (``_lower_gate``), or op by op where that kernel, whatever the
    layouts and splits tried, still runs on a reference kernel and the ops alone do not: the
    unfused mode's kernels, the same operations (bit-identical), each a jit kernel — a few
    microseconds each against milliseconds for a reference binary with post-ops."""
    if ctx.options.mode != "fused":
        _lower_gate(ctx, node)
        return
    restore, first = ctx.checkpoint(), len(ctx.kernels)
    _lower_gate(ctx, node)
    slow = [k.impl for k in ctx.kernels[first:] if is_slow(k.impl, k.kind)]
    if not slow:
        return
    restore()
    _op_by_op(ctx, node, f"the chain as one kernel runs on {slow[0]}: op by op")
    if not [k for k in ctx.kernels[first:] if is_slow(k.impl, k.kind)]:
        log.info("node %s: chain op by op (as one kernel on %s)", node, slow[0])
        return
    restore()  # no better op by op
    _lower_gate(ctx, node)


def _chain_layout(ctx: LowerContext, x: str) -> MemoryDesc:
    """The float32 layout a chain on ``x`` runs in: x's own, unless blocked (an f32 conv's
    nChw8c output; the 8-bit dst keeps the source's layout), oneDNN's per-channel bug, or the
    same bytes as row-major (a 1x1 image in acdb strides takes a per-channel binary post-op
    only on ref:any, in abcd on jit)."""
    home = ctx.md_of(x)
    plain = plain_md(home.dims, DataType.f32)
    f32 = md_like(home, DataType.f32)
    if (f32 is None or not f32.is_plain or channel_in_the_middle(f32.dims, f32.strides or ())
            or same_bytes(f32, plain)):
        return plain
    return f32


def _op_by_op(ctx: LowerContext, node: Node, note: str) -> None:
    """The chain one oneDNN primitive an operation on a float32 copy of x (the unfused
    mode's kernels)."""
    x, y = node.inputs[0], node.outputs[0]
    f32 = _chain_layout(ctx, x)
    fused = node.fused
    if fused is not None and fused.src_scale is not None:
        src, _ = unfused.dequantized(ctx, x, fused.src_scale, fused.src_zero_point, f32)
    else:
        src = ctx.source(x, f32)
    work = ctx.temp(f"{y}@chain", f32)
    ctx.add_reorder(src, work, role="op", note=note)
    unfused.finish_chain(ctx, node, work, channel_axis=1)


def _lower_gate(ctx: LowerContext, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    yinfo = ctx.info(y)
    home = ctx.md_of(x)
    f32 = _chain_layout(ctx, x)
    fused = node.fused
    int_source = fused is not None and fused.src_scale is not None
    too_long = _too_long(node) if int_source else ""
    if ctx.options.mode == "unfused" or too_long:
        _op_by_op(ctx, node, too_long or f"unfused copy of the input of {node}")
        return
    composed = node.meta.get("composed")
    assert isinstance(composed, Composed), f"{node}: no composed attributes (compose_post_ops)"
    finish = as_float_post_ops(composed)
    if int_source:
        assert fused is not None and fused.src_scale is not None
        if fused.src_scale != 1.0:  # 1: a per-channel DQ's Shift / Scale start the chain
            finish = replace(finish, post_ops=[Eltwise("linear", float(fused.src_scale), 0.0),
                                               *finish.post_ops])

    def tensor_slot(port: int) -> tuple[str, MemoryDesc]:
        value = node.inputs[port]  # a full-size operand in x's layout; a broadcast one as is
        return unfused.dequantized(ctx, value, 1.0, 0,
                                   f32 if ctx.info(value).shape == yinfo.shape else None)

    both = int8_operand(ctx, node)
    if both is not None and both[3] in ctx.deferred:
        if _both_int8(ctx, node, composed, both, f32, tensor_slot):
            return
        lower_quant.undefer(ctx, both[3])

    first = finish.post_ops[0] if finish.post_ops else None
    own = (not int_source and isinstance(first, TensorBinary) and first.port != 0
           and (first.alg in ("add", "mul") or _slow_as_post_op(ctx, node, finish, f32)))
    if own:  # the chain's first x ∘ r is the primitive's operation (module docstring)
        assert isinstance(first, TensorBinary)
        finish = replace(finish, post_ops=finish.post_ops[1:])
    mine = first if own else None
    assert mine is None or isinstance(mine, TensorBinary)
    if len(finish.post_ops) > MAX_POST_OPS:  # a float32 source's (``_too_long``)
        _in_parts(ctx, node, finish, mine, f32, composed, tensor_slot)
        return
    ports = _operand_ports(finish, mine)
    zp = fused.src_zero_point if int_source and fused is not None else None
    if ports is not None:
        slow = _slow_as_laid_out(ctx, node, finish, mine, ports, f32, zp)
        if ((slow or _may_regroup(ctx, node, ports, f32))
                and _in_memory_order(ctx, node, finish, mine, ports, zp, composed, slow=slow)):
            return
        if slow and not int_source and _split_at_operand(ctx, node, finish, mine, f32,
                                                         composed, tensor_slot):
            return
    src = ctx.source(x, md_like(f32, home.dtype) if int_source else f32)
    built = build_attr(finish, ndims=len(yinfo.shape), channel_axis=1, wei_mask=0,
                       dst_type=DataType.f32, tensor_slot=tensor_slot)
    dst_md = md_like(f32, dnnl_type(yinfo.dtype))
    assert dst_md is not None
    one = plain_md((1,) * len(yinfo.shape), DataType.f32)
    args = {int(Arg.SRC_0): src, int(Arg.DST): ctx.define(y, dst_md), **built.slot_args}
    fixed = dict(built.fixed)
    if own:
        assert isinstance(first, TensorBinary)
        pd, operands, consts = _own_operation(ctx, node, first, src, f32, dst_md, built.attr,
                                              tensor_slot)
        args.update(operands)
        fixed.update(consts)
        names, details = [f"binary_{first.alg}", *built.names], [
            f"binary_{first.alg}(input {first.port}) (the primitive's own)", *built.details]
    else:
        operand = np.ones(one.dims, np.float32)
        if int_source:  # q - zp, then linear(s, 0) first among the post-ops
            assert fused is not None
            operand = np.full(one.dims, fused.src_zero_point, np.float32)
            pd = binary(Alg.binary_sub, ctx.slots[src].md, one, dst_md, attr=built.attr)
        else:
            pd = binary(Alg.binary_mul, f32, one, dst_md, attr=built.attr)
        fixed[int(Arg.SRC_1)] = const_memory(operand)
        names, details = built.names, built.details
    info = ctx.info_for(node, optimizations=list(composed.fired), post_ops=names,
                        post_op_details=details, rounding=composed.rounding())
    ctx.add_primitive(node.name, pd, args, fixed, info=info)


def _slow_as_post_op(ctx: LowerContext, node: Node, finish: Composed,
                     f32: MemoryDesc) -> bool:
    """Does a chain starting with ``x − r`` / ``x / r`` (a float32 source) run on a reference
    kernel with r a binary post-op of ``x·1``? It then takes r as the primitive's own operand,
    as an Add / Mul always does (the same float32 operation; magika's LayerNorm written out,
    ``x − mean`` with the mean [1, 1, C] on [1, T, C]: 11 ms on ``ref:any``)."""
    ports = _operand_ports(finish, None)
    return ports is not None and _slow_as_laid_out(ctx, node, finish, None, ports, f32, None)


def _too_long(node: Node) -> str:
    """Why a chain on a dequantized 8-bit source runs op by op (the unfused mode's kernels,
    the same operations): its post-ops, with the dequantize's multiply, pass oneDNN's limit of
    MAX_POST_OPS a primitive (a float32 source's chain is split instead, ``_in_parts``). ""
    when they fit, or in the unfused mode (no composed attributes)."""
    composed = node.meta.get("composed")
    if not isinstance(composed, Composed):
        return ""
    count = len(as_float_post_ops(composed).post_ops) + 1
    if count <= MAX_POST_OPS:
        return ""
    return (f"the chain of {node} composes to {count} post-ops, more than oneDNN's "
            f"{MAX_POST_OPS}: it runs op by op, on this float32 copy of its input")


def _chain_args(src: str, dst: str, built: BuiltAttr, first: TensorBinary | None,
                operand: np.ndarray | None,
                tensor_slot: Callable[[int], tuple[str, MemoryDesc]]
                ) -> tuple[dict[int, str], dict[int, Memory]]:
    """The slots and constants of a ``_chain_kernel`` primitive reading ``src`` and writing
    ``dst``: its SRC_1 is ``first``'s operand, or the constant ``operand`` (x·1, q − zp)."""
    args = {int(Arg.SRC_0): src, int(Arg.DST): dst, **built.slot_args}
    fixed = dict(built.fixed)
    if first is not None:
        args[int(Arg.SRC_1)] = tensor_slot(first.port)[0]
    else:
        assert operand is not None
        fixed[int(Arg.SRC_1)] = const_memory(operand)
    return args, fixed


def _in_parts(ctx: LowerContext, node: Node, finish: Composed, first: TensorBinary | None,
              f32: MemoryDesc, composed: Composed,
              tensor_slot: Callable[[int], tuple[str, MemoryDesc]]) -> None:
    """A float32 chain with more post-ops than a oneDNN primitive holds (MAX_POST_OPS) as
    several binary kernels of at most that many, each but the last writing the float32 value
    the chain holds where it stops (exact: the next reads it back as it was). GELU's tanh
    form written out, ``x·0.5·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` with a Q/DQ pair after
    each of its nine operations (EfficientViT-L1 QDQ), composes to 45: two kernels."""
    x, y = node.inputs[0], node.outputs[0]
    yinfo = ctx.info(y)
    ops = finish.post_ops
    pieces = [ops[i:i + MAX_POST_OPS] for i in range(0, len(ops), MAX_POST_OPS)]
    src = ctx.source(x, f32)
    why = (f"{len(ops)} post-ops, more than oneDNN's {MAX_POST_OPS} a primitive: the chain "
           f"in {len(pieces)} kernels")
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        dst_md = md_like(f32, dnnl_type(yinfo.dtype)) if last else f32
        assert dst_md is not None
        pd, built, operand = _chain_kernel(replace(finish, post_ops=piece), first,
                                           ctx.slots[src].md, dst_md, len(yinfo.shape),
                                           tensor_slot, None)
        dst = ctx.define(y, dst_md) if last else ctx.temp(f"{y}@part{i}", f32)
        args, fixed = _chain_args(src, dst, built, first, operand, tensor_slot)
        names = built.names if first is None else [f"binary_{first.alg}", *built.names]
        info = ctx.info_for(node, optimizations=list(composed.fired), post_ops=names,
                            post_op_details=built.details, note=why,
                            rounding=composed.rounding() if last else "")
        ctx.add_primitive(node.name if last else f"{node.name}:part{i}", pd, args, fixed,
                          info=info)
        src, first = dst, None


def int8_operand(ctx: LowerContext, node: Node) -> tuple[int, str, float, str] | None:
    """(port, the 8-bit tensor q, its scale, the dequantized value) when ``node``'s gate chain
    reads a dequantized 8-bit source and starts with ``x ∘ DQ(q)``, q of the output's shape,
    both dequantizes per tensor with zero point 0 (NNCF's symmetric s8: a residual Add of two
    quantized branches), into an 8-bit dst: one binary primitive then reads both 8-bit tensors
    with their scales (``_both_int8``) and DQ(q) is no kernel of its own
    (lower_quant.lower_dequantize defers it)."""
    fused = node.fused
    composed = node.meta.get("composed")
    if (fused is None or fused.src_scale is None or fused.src_zero_point != 0
            or node.op not in (Op.ADD, Op.MUL) or ctx.options.mode != "fused"
            or not isinstance(composed, Composed)):
        return None
    chain = as_float_post_ops(composed).post_ops
    first = chain[0] if chain else None
    y = node.outputs[0]
    if (not isinstance(first, TensorBinary) or first.port == 0 or first.alg not in ("add", "mul")
            or not ctx.info(y).dtype.is_quantized):
        return None
    value = node.inputs[first.port]
    dq = ctx.graph.producer(value)
    if dq is None or dq.op is not Op.DEQUANTIZE_LINEAR or ctx.is_output(value):
        return None
    q = dq.inputs[0]
    scale = ctx.const(dq.inputs[1])
    zp = ctx.const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] else None
    if (ctx.const(q) is not None or not ctx.info(q).dtype.is_quantized
            or ctx.info(q).shape != ctx.info(y).shape or scale is None or scale.size != 1
            or (zp is not None and np.any(zp)) or not np.all(np.isfinite(scale))
            or not float(scale.ravel()[0]) > 0):
        return None
    return first.port, q, float(scale.ravel()[0]), value


def _both_int8(ctx: LowerContext, node: Node, composed: Composed,
               taken: tuple[int, str, float, str], f32: MemoryDesc,
               tensor_slot: Callable[[int], tuple[str, MemoryDesc]]) -> bool:
    """``int8_operand``'s chain as ``f32(q₀)·s₀ ∘ f32(q₁)·s₁`` — oneDNN's binary with SRC_0 /
    SRC_1 scales, each the DequantizeLinear's own multiply (measured bit-exact, jit:uni with
    an 8-bit dst) — then the chain's other post-ops; False (nothing emitted) when oneDNN
    would run it on a reference kernel."""
    fused = node.fused
    assert fused is not None and fused.src_scale is not None
    port, q, scale, value = taken
    x, y = node.inputs[0], node.outputs[0]
    finish = as_float_post_ops(composed)
    first = finish.post_ops[0]
    assert isinstance(first, TensorBinary)
    rest = replace(finish, post_ops=finish.post_ops[1:])
    src0 = md_like(f32, ctx.md_of(x).dtype)
    src1 = md_like(f32, dnnl_type(ctx.info(q).dtype))
    dst = md_like(f32, dnnl_type(ctx.info(y).dtype))
    if src0 is None or src1 is None or dst is None:
        return False
    built = build_attr(rest, ndims=len(f32.dims), channel_axis=1, wei_mask=0,
                       dst_type=DataType.f32, tensor_slot=tensor_slot)
    built.attr.set_scales_mask(int(Arg.SRC_0), 0)
    built.attr.set_scales_mask(int(Arg.SRC_1), 0)
    try:
        pd = binary(Alg[f"binary_{first.alg}"], src0, src1, dst, attr=built.attr)
    except DnnlError:
        return False
    if is_slow(pd.impl_name, "binary"):
        return False
    _, _, absorbed = lower_quant.take_deferred(ctx, node, value)
    args = {int(Arg.SRC_0): ctx.source(x, src0), int(Arg.SRC_1): ctx.source(q, src1),
            int(Arg.DST): ctx.define(y, dst), **built.slot_args}
    fixed = {**built.fixed,
             Arg.scales(Arg.SRC_0): Memory.scales(np.array([fused.src_scale], np.float32)),
             Arg.scales(Arg.SRC_1): Memory.scales(np.array([scale], np.float32))}
    info = ctx.info_for(node, optimizations=list(composed.fired),
                        post_ops=[f"binary_{first.alg}", *built.names],
                        post_op_details=[f"binary_{first.alg}(input {port}, 8-bit, scales "
                                         f"{fused.src_scale:.6g} and {scale:.6g}) (the "
                                         f"primitive's own)", *built.details],
                        rounding=composed.rounding())
    info.absorbed += [a for a in absorbed if a not in info.absorbed]
    ctx.add_primitive(node.name, pd, args, fixed, info=info)
    return True


def _chain_kernel(finish: Composed, first: TensorBinary | None, src: MemoryDesc, dst: MemoryDesc,
                  ndims: int, slot_of: Callable[[int], tuple[str, MemoryDesc]],
                  zero_point: int | None, channel_axis: int = 1
                  ) -> tuple[PrimitiveDesc, BuiltAttr, np.ndarray | None]:
    """The chain's binary primitive over descriptors of ``ndims`` dims: ``x ∘ r`` (``first``),
    ``q − zp`` (an 8-bit source) or ``x·1``; with the operand of the last two."""
    built = build_attr(finish, ndims=ndims, channel_axis=channel_axis, wei_mask=0,
                       dst_type=DataType.f32, tensor_slot=slot_of)
    if first is not None:
        return binary(Alg[f"binary_{first.alg}"], src, slot_of(first.port)[1], dst,
                      attr=built.attr), built, None
    one = plain_md((1,) * ndims, DataType.f32)
    if zero_point is not None:
        return (binary(Alg.binary_sub, src, one, dst, attr=built.attr), built,
                np.full(one.dims, zero_point, np.float32))
    return binary(Alg.binary_mul, src, one, dst, attr=built.attr), built, np.ones(one.dims,
                                                                                   np.float32)


def _operand_ports(finish: Composed, first: TensorBinary | None) -> list[int] | None:
    """The inputs the chain reads besides x; None when a post-op is neither eltwise nor binary
    (a per-channel constant one is regrouped with the channels, ``_in_memory_order``)."""
    ports = [] if first is None else [first.port]
    for op in finish.post_ops:
        if isinstance(op, TensorBinary):
            ports.append(op.port)
        elif not isinstance(op, Eltwise | Binary):
            return None
    return ports


def _may_regroup(ctx: LowerContext, node: Node, ports: list[int], f32: MemoryDesc) -> bool:
    """May the chain run regrouped (``_in_memory_order``) for speed, at no copy the plain
    layout does not make too? x's own layout is the one the chain would use, and every
    operand is a constant, a full-size tensor, or a float32 one already dense in x's order."""
    if ctx.options.mode != "fused":
        return False
    home = ctx.md_of(node.inputs[0])
    own = md_like(home, f32.dtype)
    if not home.is_plain or own is None or not same_bytes(own, f32):
        return False
    shape = ctx.info(node.outputs[0]).shape
    for port in ports:
        value = node.inputs[port]
        if ctx.const(value) is not None or ctx.info(value).shape == shape:
            continue
        if value not in ctx.home:
            return False
        md = ctx.md_of(value)
        if (md.dtype != DataType.f32 or len(md.dims) != len(shape)
                or not same_bytes(md, dense_in_order(home, md.dims, DataType.f32))):
            return False
    return True


def _tile_factor(groups: tuple[tuple[int, ...], ...], out: tuple[int, ...],
                 operands: list[tuple[int, ...]], runtime: Sequence[tuple[int, ...]] = ()
                 ) -> int:
    """k > 1 when the last two groups, (outer, inner) elements, run faster as
    (outer/k, k·inner) with the operands broadcast along ``outer`` tiled k times along
    ``inner``: oneDNN 3.2's jit binary walks a broadcast operand row by row at a cost a row.
    Measured at one thread, ``x·g`` quantized with g per channel on channels-last
    [1, 8, 12, 96]: 11.6 µs in rows of 8, 1.9 µs in rows of 256; [1, 24, 24, 48]: 16.9 → 3.5
    (rows of 768); [1, 64, 12, 48]: 12.3 → 4.2; and longer rows still gain on large tensors
    at two threads (PP-OCRv4 det's gate on [1, 96, 120, 160]: 575 µs in rows of 96, 258 in
    rows of 576, 225 in rows of 4608). k is ``ir.rows.repeats`` (rows of at least ``ROW``
    elements); 1 when an operand is full along outer but broadcast along inner, or one of the
    ``runtime`` operands (their dims) would be repeated by a kernel where the chain is too
    small for it (``ir.rows.repeat_kernel_pays``)."""
    if len(groups) < 2:
        return 1
    outer_dim, inner_dim = groups[-2][0], groups[-1][0]
    outer = math.prod(out[i] for i in groups[-2])
    inner = math.prod(out[i] for i in groups[-1])
    if any(d[inner_dim] == 1 and d[outer_dim] != 1 for d in operands):
        return 1
    k = repeats(outer, inner)
    repeated = any(d[outer_dim] == 1 and d[inner_dim] != 1 for d in runtime)
    if k > 1 and repeated and not repeat_kernel_pays(outer, inner):
        return 1  # a run-time operand's repeat is a kernel: worth it for many short rows
    return k


def _slow_as_laid_out(ctx: LowerContext, node: Node, finish: Composed,
                      first: TensorBinary | None, ports: list[int], f32: MemoryDesc,
                      zp: int | None) -> bool:
    """Would the chain's primitive, in the layouts ``lower_gate`` gives it (``zp``: an 8-bit
    source's zero point), run on a reference kernel? (Descriptors only: nothing is emitted.)"""
    yinfo = ctx.info(node.outputs[0])
    if ctx.options.mode != "fused":
        return False
    mds: dict[int, tuple[str, MemoryDesc]] = {}
    for port in ports:
        value = node.inputs[port]
        if ctx.info(value).shape == yinfo.shape:
            mds[port] = ("", f32)
        elif ctx.const(value) is None and value in ctx.home:
            home = ctx.md_of(value)
            mds[port] = ("", md_like(home, DataType.f32) or plain_md(home.dims, DataType.f32))
        else:
            return False
    src = md_like(f32, ctx.md_of(node.inputs[0]).dtype) if zp is not None else f32
    dst = md_like(f32, dnnl_type(yinfo.dtype))
    if src is None or dst is None:
        return False
    try:
        pd, _, _ = _chain_kernel(finish, first, src, dst, len(yinfo.shape), mds.__getitem__, zp)
    except DnnlError:
        return False
    return is_slow(pd.impl_name, "binary")


def _in_memory_order(ctx: LowerContext, node: Node, finish: Composed,
                     first: TensorBinary | None, ports: list[int], zp: int | None,
                     composed: Composed, *, slow: bool) -> bool:
    """``_memory_order_kernel`` emitted at once: False, emitting nothing, when it declines."""
    emit = _memory_order_kernel(ctx, node, finish, first, ports, zp, composed, slow=slow)
    if emit is None:
        return False
    emit()
    return True


# Where a regrouped chain reads (its descriptor, and a callback naming the slot, called when
# the kernel is emitted) and writes (the dtype, a callback naming a slot for a descriptor,
# and the kernel's name): x and y, and the node's name, unless given.
Source = tuple[MemoryDesc, Callable[[], str]]
Target = tuple[DataType, Callable[[MemoryDesc], str], str]


def _memory_order_kernel(ctx: LowerContext, node: Node, finish: Composed,
                         first: TensorBinary | None, ports: list[int], zp: int | None,
                         composed: Composed, *, slow: bool, source: Source | None = None,
                         target: Target | None = None) -> Callable[[], None] | None:
    """The chain over x's own bytes with its dims in memory order, neighbours merged
    (layouts.memory_order_groups): the same operations element for element, so
    bit-identical; operands read in x's dim order (a reorder of a small broadcast one, else as
    ``lower_gate`` would). A per-channel constant post-op needs the channels innermost, a
    group of their own. False, emitting nothing, when the dims do not regroup so, the jit
    kernel declines them, or (``slow`` False) the regrouped kernel would not be faster.

    ``slow``: the layouts ``lower_gate`` picks run on ``ref:any``, e.g. a broadcast operand
    full along two dims (ResNeSt's split attention, [1, 2, C, 1, 1] on [1, 2, C, H, W] of a
    channels-last conv: 4 kernels, 250 ms of 255 on ``ref:any``) or a layout whose innermost
    dim is neither the last nor the channel (a transposed attention head).

    Else, for speed, two cases where oneDNN 3.2's jit binary (with post-ops) walks short rows:
    - a channels-last x whose operands are all full-size or scalars: one dim of all its
      elements. The jit kernel runs the channels as rows in vector-length pieces, the last one
      masked: a hardswish chain on [1, 8, 24, 96] channels-last took 38.8 µs at one thread,
      4.8 µs as one dim ([1, 24, 24, 48]: 29.8 → 6.9; [1, 120, 6, 24]: 13.7 → 4.9);
    - an operand broadcast along the outer dims with rows shorter than ``ROW``: the
      last two groups seen as (outer/k, k·inner) and the operand tiled k times
      (``_tile_factor``): a constant at compile time, a run-time one (a squeeze-excitation
      gate) by a small kernel of its own, ``1·g`` (exact).

    Returns the function that emits the kernel, or None (nothing emitted) when it declines.
    ``source`` / ``target``: the chain reads / writes, instead of x / y, slots the callbacks
    make and name when the kernel is emitted (``_split_at_operand``)."""
    x, y = node.inputs[0], node.outputs[0]
    home = ctx.md_of(x) if source is None else source[0]
    yinfo = ctx.info(y)
    if home.dtype != DataType.f32 and zp is None:
        return None
    ndims = len(yinfo.shape)
    dims = {p: (1,) * (ndims - len(ctx.info(node.inputs[p]).shape))
            + tuple(ctx.info(node.inputs[p]).shape) for p in ports}
    channels = int(yinfo.shape[1]) if ndims > 1 else 1
    per_channel = [op for op in finish.post_ops
                   if isinstance(op, Binary) and not one_value(op.values)]
    if per_channel and (ndims < 2 or any(np.asarray(op.values).size != channels
                                         for op in per_channel)):
        return None
    operands = [*dims.values(), *([per_channel_dims(ndims, 1, channels)] if per_channel else [])]
    groups = memory_order_groups(home, operands)
    if groups is None or (per_channel and groups[-1] != (1,)):
        return None
    out = tuple(home.dims)
    tile = _tile_factor(groups, out, operands, [dims[p] for p in ports
                                                if ctx.const(node.inputs[p]) is None])
    written = _written_tile(groups, out, operands, _repeated_operands(ctx, node))
    tile = written or tile
    if not slow and tile == 1 and (len(groups) > 1 or is_row_major(home)):
        return None
    if per_channel:  # the channels are the last dim of the view, tiled with it
        finish = tiled_channels(finish, channels, tile)
    dst_type = dnnl_type(yinfo.dtype) if target is None else target[0]

    def kernel(lead: int, slot_of: Callable[[int], tuple[str, MemoryDesc]],
               src: MemoryDesc, dst: MemoryDesc
               ) -> tuple[PrimitiveDesc, BuiltAttr, np.ndarray | None]:
        rank = len(groups) + lead
        return _chain_kernel(finish, first, src, dst, rank, slot_of, zp, channel_axis=rank - 1)

    def probe(lead: int) -> tuple[PrimitiveDesc, BuiltAttr, np.ndarray | None]:
        mds = {p: ("", grouped_md(groups, dims[p], DataType.f32, lead, tile)) for p in ports}
        return kernel(lead, mds.__getitem__, grouped_md(groups, out, home.dtype, lead, tile),
                      grouped_md(groups, out, dst_type, lead, tile))

    found = first_fast("binary", (0, 1), probe)
    if found is None:
        return None
    lead = found[0]
    return lambda: _emit_in_order(ctx, node, finish, first, ports, composed, groups, dims,
                                  out, home, dst_type, lead, tile, kernel, source, target)


def _emit_in_order(ctx: LowerContext, node: Node, finish: Composed, first: TensorBinary | None,
                   ports: list[int], composed: Composed, groups: tuple[tuple[int, ...], ...],
                   dims: dict[int, tuple[int, ...]], out: tuple[int, ...], home: MemoryDesc,
                   dst_type: DataType, lead: int, tile: int,
                   kernel: Callable[..., tuple[PrimitiveDesc, BuiltAttr, np.ndarray | None]],
                   source: Source | None, target: Target | None) -> None:
    """The kernel ``_memory_order_kernel`` planned, with its operands laid out."""
    x, y = node.inputs[0], node.outputs[0]

    def view(d: tuple[int, ...], t: DataType, k: int = tile) -> MemoryDesc:
        return grouped_md(groups, d, t, lead, k)

    slots: dict[int, tuple[str, MemoryDesc]] = {}
    order = [i for g in groups for i in g]
    for port in ports:
        value, md = node.inputs[port], view(dims[port], DataType.f32)
        constant = ctx.const(value)
        if constant is not None:  # a constant of its own in the view's order (no writer)
            data = np.asarray(constant, np.float32).reshape(dims[port])
            rest = [i for i in range(data.ndim) if i not in order]
            row = view(dims[port], DataType.f32, 1)
            laid_out = data.transpose(order + rest).reshape(row.dims)
            if _repeated(row, tile):
                laid_out = np.tile(laid_out, tile)
            laid_out = laid_out.reshape(md.dims)
            slots[port] = (ctx.const_slot(f"const:{value}@order", const_memory(laid_out)), md)
            continue
        laid, _ = unfused.dequantized(ctx, value, 1.0, 0,
                                      dense_in_order(home, dims[port], DataType.f32))
        row = view(dims[port], DataType.f32, 1)
        if not _repeated(row, tile):
            slots[port] = (ctx.temp(f"{value}@order", md, alias=laid), md)
            continue
        wide = _repeated_slot(ctx, node, port, md) or _tiled_operand(
            ctx, node, value, ctx.temp(f"{value}@order", row, alias=laid), row, tile)
        slots[port] = (ctx.temp(f"{value}@rows", md, alias=wide), md)
    src = ctx.temp(f"{x}@order", view(out, home.dtype),
                   alias=ctx.home_slot(x) if source is None else source[1]())
    laid_out = dense_in_order(home, out, dst_type)
    whole = ctx.define(y, laid_out) if target is None else target[1](laid_out)
    dst = ctx.temp(f"{whole}@order", view(out, dst_type), alias=whole)
    pd, built, operand = kernel(lead, slots.__getitem__, ctx.slots[src].md, ctx.slots[dst].md)
    args = {int(Arg.SRC_0): src, int(Arg.DST): dst, **built.slot_args}
    fixed = dict(built.fixed)
    names, details = built.names, built.details
    if first is not None:
        args[int(Arg.SRC_1)] = slots[first.port][0]
        names = [f"binary_{first.alg}", *names]
        details = [f"binary_{first.alg}(input {first.port}) (the primitive's own)", *details]
    else:
        assert operand is not None
        fixed[int(Arg.SRC_1)] = const_memory(operand)
    fired = [*composed.fired, "memory_order", *(["tiled_rows"] if tile > 1 else [])]
    info = ctx.info_for(node, optimizations=fired, post_ops=names, post_op_details=details,
                        rounding=composed.rounding())
    ctx.add_primitive(node.name if target is None else target[2], pd, args, fixed, info=info)


def _split_at_operand(ctx: LowerContext, node: Node, finish: Composed,
                      first: TensorBinary | None, f32: MemoryDesc, composed: Composed,
                      tensor_slot: Callable[[int], tuple[str, MemoryDesc]]) -> bool:
    """A chain reading a tensor through a post-op that broadcasts in a way oneDNN 3.2's jit
    binary takes as the primitive's own operation but not as a post-op, in one kernel or
    regrouped. Two kernels then: the chain up to that post-op writes float32 (the values it
    would have held: exact), and that post-op is the second kernel's own operation with the
    rest as its post-ops, regrouped in memory order; the first kernel is regrouped too where
    it must be. False, emitting nothing, when either would still be slow.

    - MobileViTv2's separable attention, ``relu(v)·c`` quantized on both sides with the
      context vector c [1, C, P, 1] broadcast along the N patches of a channels-last v:
      ``ref:any``, 2-5 ms a kernel; then (P, N, C) with c as (P, 1, C).
    - MViTv2's decomposed relative positions, ``a + r_w`` quantized, ``+ r_h``, quantized,
      with r_w [.., kH, 1]... broadcast along kW and r_h along kH of the scores a [B, h, qH,
      qW, kH, kW] (up to 68 ms a kernel): each sum is a kernel's own operation over two or
      three merged dims."""
    index = next((i for i, op in enumerate(finish.post_ops) if isinstance(op, TensorBinary)),
                 None)
    if index is None or (index == 0 and first is None):
        return False
    middle = finish.post_ops[index]
    assert isinstance(middle, TensorBinary)
    head = replace(finish, post_ops=finish.post_ops[:index])
    tail = replace(finish, post_ops=finish.post_ops[index + 1:])
    ports, head_ports = _operand_ports(tail, middle), _operand_ports(head, first)
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.info(y).shape
    if ports is None or head_ports is None or ctx.md_of(x).dtype != DataType.f32:
        return False
    name, note = f"{node.name}:before_{middle.alg}", (
        f"the chain up to its binary_{middle.alg} (input {middle.port}), float32: as one "
        "kernel it runs on a reference kernel")
    made: list[str] = []

    def temp(md: MemoryDesc) -> str:
        made.append(ctx.temp(f"{y}@before_{middle.alg}", md))
        return made[0]

    emit_head = _plain_head(ctx, node, head, first, f32, tensor_slot, name, note, temp)
    head_md = f32
    if emit_head is None:
        emit_head = _memory_order_kernel(ctx, node, head, first, head_ports, None, composed,
                                         slow=True, target=(DataType.f32, temp, name))
        head_md = dense_in_order(ctx.md_of(x), shape, DataType.f32)
    if emit_head is None:
        return False
    head_emitter = emit_head

    def source() -> str:
        head_emitter()
        return made[0]

    emit_tail = _memory_order_kernel(ctx, node, tail, middle, ports, None, composed, slow=True,
                                     source=(head_md, source))
    if emit_tail is None:
        return False
    emit_tail()
    return True


def _plain_head(ctx: LowerContext, node: Node, head: Composed, first: TensorBinary | None,
                f32: MemoryDesc, tensor_slot: Callable[[int], tuple[str, MemoryDesc]],
                name: str, note: str, temp: Callable[[MemoryDesc], str]
                ) -> Callable[[], None] | None:
    """The first part of a split chain as one kernel in the layout ``f32`` (x's), writing a
    float32 slot ``temp`` makes; None when oneDNN runs that on a slow kernel."""
    rank = len(ctx.info(node.outputs[0]).shape)
    try:
        pd, built, operand = _chain_kernel(head, first, f32, f32, rank, tensor_slot, None)
    except DnnlError:
        return None
    if is_slow(pd.impl_name, "binary"):
        return None

    def emit() -> None:
        args, fixed = _chain_args(ctx.source(node.inputs[0], f32), temp(f32), built, first,
                                  operand, tensor_slot)
        ctx.add_primitive(name, pd, args, fixed, info=ctx.info_for(
            node, post_ops=built.names, post_op_details=built.details, note=note))

    return emit


def _repeated(row: MemoryDesc, tile: int) -> bool:
    """Is an operand, seen over the groups untiled (``row``), broadcast along the outer of
    the last two and full along the inner: its row repeated ``tile`` times in the tiled view."""
    return tile > 1 and row.dims[-2] == 1 and row.dims[-1] != 1


def _written_tile(groups: tuple[tuple[int, ...], ...], out: tuple[int, ...],
                  operands: list[tuple[int, ...]], ready: dict[int, tuple[str, int]]) -> int:
    """The repeats the producers of the ``ready`` operands wrote (passes/widen_gate.py chose
    them for these rows), when the view can take them; else 0."""
    if not ready or len(groups) < 2:
        return 0
    outer_dim, inner_dim = groups[-2][0], groups[-1][0]
    times = min(t for _, t in ready.values())
    if (any(d[inner_dim] == 1 and d[outer_dim] != 1 for d in operands)
            or math.prod(out[i] for i in groups[-2]) % times):
        return 0
    return times


def _repeated_operands(ctx: LowerContext, node: Node) -> dict[int, tuple[str, int]]:
    """{port: (the value holding the operand repeated, how many times)} for the run-time
    operands whose producer writes them repeated (passes/widen_gate.py), where that value's
    slot is dense row-major: a view of it is the tiled operand, no kernel between."""
    found = {}
    for port, (value, times) in node.meta.get("repeated_operands", {}).items():
        if value in ctx.home:
            md = ctx.md_of(value)
            if md.is_plain and same_bytes(md, plain_md(md.dims, md.dtype)):
                found[port] = (value, times)
    return found


def _repeated_slot(ctx: LowerContext, node: Node, port: int, md: MemoryDesc) -> str | None:
    """A slot viewing the first ``md.nelems`` values of port's operand written repeated by
    its producer, or None when it is not (enough times)."""
    value = _repeated_operands(ctx, node).get(port, ("", 0))[0]
    whole = ctx.md_of(value) if value else None
    if whole is None or whole.dtype != md.dtype or md.nelems > whole.nelems:
        return None
    return ctx.temp(f"{value}@repeated", plain_md(md.dims, md.dtype), alias=ctx.home_slot(value))


def _tiled_operand(ctx: LowerContext, node: Node, value: str, row_slot: str, row: MemoryDesc,
                   tile: int) -> str:
    """A slot holding the run-time operand ``row`` ([..., 1, n]) repeated ``tile`` times,
    [..., tile, n] (seen by the caller as [..., 1, tile·n]): one reorder from a view of the
    row with stride 0 along the repeats, as lower_misc.lower_expand copies (the same bytes)."""
    dims = (*row.dims[:-2], tile, row.dims[-1])
    strides = (*(row.strides or ())[:-2], 0, 1)
    view = ctx.temp(f"{value}@repeat", MemoryDesc.from_strides(dims, DataType.f32, strides),
                    alias=row_slot)
    plain = plain_md(dims, DataType.f32)
    slot = ctx.temp(f"{value}@tiled", plain)
    ctx.add_primitive(f"{node.name}:tile:{value}", reorder(ctx.slots[view].md, plain),
                      {int(Arg.SRC): view, int(Arg.DST): slot},
                      info=ctx.info_for(node, note=f"'{value}' repeated {tile} times: the "
                                        "chain reads it in rows of "
                                        f"{tile * row.dims[-1]} (module _tile_factor)"))
    return slot


def _own_operation(ctx: LowerContext, node: Node, first: TensorBinary, src: str,
                   f32: MemoryDesc, dst_md: MemoryDesc, attr: PrimitiveAttr,
                   tensor_slot: Callable[[int], tuple[str, MemoryDesc]]
                   ) -> tuple[PrimitiveDesc, dict[int, str], dict[int, Memory]]:
    """The binary primitive ``x ∘ r`` carrying the chain's post-ops (module docstring), with
    the slots and constants it reads: r as oneDNN broadcasts it on jit; a constant r stored
    broadcast where that broadcast is ref:any only (lower_binary.stored_broadcast); else the
    operation alone into f32 (jit without post-ops) and the chain as ``x·1`` on that."""
    alg = Alg[f"binary_{first.alg}"]
    slot, md = tensor_slot(first.port)
    shape = tuple(f32.dims)
    pd = binary(alg, f32, md, dst_md, attr=attr)
    if not is_slow(pd.impl_name, "binary"):
        return pd, {int(Arg.SRC_0): src, int(Arg.SRC_1): slot}, {}
    wide = binary_ops.stored_broadcast(ctx.const(node.inputs[first.port]), tuple(md.dims), shape)
    if wide is not None:
        stored = binary(alg, f32, f32, dst_md, attr=attr)
        if not is_slow(stored.impl_name, "binary"):
            return stored, {int(Arg.SRC_0): src}, {int(Arg.SRC_1): ctx.weights(wide, f32)}
    alone = binary(alg, f32, md, f32)
    if is_slow(alone.impl_name, "binary"):
        return pd, {int(Arg.SRC_0): src, int(Arg.SRC_1): slot}, {}
    inner = ctx.temp(f"{node.outputs[0]}@{first.alg}", f32)
    ctx.add_primitive(f"{node.name}:{first.alg}", alone,
                      {int(Arg.SRC_0): src, int(Arg.SRC_1): slot, int(Arg.DST): inner},
                      info=ctx.info_for(node, note="the chain's first operation alone: with "
                                        f"post-ops it runs on {pd.impl_name}"))
    one = plain_md((1,) * len(shape), DataType.f32)
    return (binary(Alg.binary_mul, f32, one, dst_md, attr=attr), {int(Arg.SRC_0): inner},
            {int(Arg.SRC_1): const_memory(np.ones(one.dims, np.float32))})
