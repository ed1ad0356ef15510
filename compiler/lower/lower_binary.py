"""Add / Sub / Mul / Div / Max / Min of two tensors (and Sum of two) → oneDNN's binary
primitive. src0 has the output's shape (Add and Mul swap their operands when only the second
does), src1 broadcasts from its dims (ranks padded with 1s), as oneDNN 3.2's jit kernel takes
it (docs/onednn.md, "Pitfalls"): per tensor, per channel or along leading dims. Others run on
views or stored copies that the jit kernel takes: a row-wise operand on the bytes seen with
fewer dims (``collapsed_dims``), a constant operand stored expanded (``stored_broadcast``: a
second operand; ``_first_operand_stored``: a first one, ``1 / x``). Element for element the
same operations, so bit-exact.
"""

from __future__ import annotations

import math

import numpy as np

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.layouts import const_memory, first_fast, is_slow, md_like, plain_md
from qfuse.compiler.lower.lower_misc import (
    F32,
    _computed_channels_last,
    _float_inputs,
    _in_place_or_new,
)
from qfuse.ir import Node, Op
from qfuse.runtime.onednn import Alg, Arg, DataType, Memory, MemoryDesc, PrimitiveDesc, binary

# Largest constant a binary operand is expanded to (from a broadcast oneDNN runs on ref:any).
BROADCAST_CONSTANT_BYTES = 64 << 20
BINARY = {Op.ADD: Alg.binary_add, Op.SUB: Alg.binary_sub, Op.MUL: Alg.binary_mul,
          Op.DIV: Alg.binary_div, Op.SUM: Alg.binary_add, Op.MAX: Alg.binary_max,
          Op.MIN: Alg.binary_min}


def stored_broadcast(operand: np.ndarray | None, dims: tuple[int, ...],
                     out: tuple[int, ...]) -> np.ndarray | None:
    """A constant operand of ``dims`` broadcast to ``out`` and stored so, float32: oneDNN 3.2's
    jit binary takes a src1 broadcast per tensor, per channel or not at all; another broadcast
    (Swin's attention mask, [1, 64, 1, 49, 49] added to [1, 64, 3, 49, 49]) runs on ref:any.
    The same sums, on jit. None when not a constant, already full size, or the stored copy
    would pass BROADCAST_CONSTANT_BYTES."""
    too_big = math.prod(out) * 4 > BROADCAST_CONSTANT_BYTES
    if operand is None or tuple(dims) == tuple(out) or too_big:
        return None
    return np.ascontiguousarray(np.broadcast_to(
        np.asarray(operand, F32).reshape(dims), out))


def lower_binary(ctx: LowerContext, node: Node) -> None:
    if len(node.inputs) != 2 or not _float_inputs(ctx, node):
        lower_numpy(ctx, node, note="integer or n-ary elementwise op")
        return
    out = ctx.info(node.outputs[0]).shape
    a, b = node.inputs
    if ctx.info(a).shape != out and ctx.info(b).shape == out and node.op in (Op.ADD, Op.MUL):
        a, b = b, a
    if ctx.info(a).shape != out:
        if not _first_operand_stored(ctx, node, a, out):
            lower_numpy(ctx, node, note="the first operand is broadcast")
            return
        a = f"{a}@expanded"
    nd = len(out)
    b_dims = (1,) * (nd - len(ctx.info(b).shape)) + ctx.info(b).shape
    fixed: dict[int, Memory] = {}
    bconst = ctx.const(b)
    if bconst is not None:
        b_array = bconst.astype(F32).reshape(b_dims)
        b_md = plain_md(b_dims, DataType.f32)
        b_value = None
    else:
        b_value = ctx.ranked(b, nd)  # a lower rank's view (a rank-0 host value's too)
        b_md = ctx.md_of(b_value)
    home = ctx.md_of(a)
    plain = plain_md(home.dims, home.dtype)
    candidates = [(home, b_md), (home, md_like(home, DataType.f32) if b_dims == out else b_md),
                  (plain, plain_md(b_dims, DataType.f32))]

    def make(c: tuple[MemoryDesc, MemoryDesc]) -> PrimitiveDesc:
        return binary(BINARY[node.op], c[0], c[1], c[0])

    pd = ctx.try_layouts("binary", make, [c for c in candidates if c[1] is not None])
    wide = stored_broadcast(bconst, b_dims, out) if pd.impl_name.startswith("ref") else None
    if wide is not None:
        b_array = wide
        full = [(home, md_like(home, DataType.f32)), (plain, plain_md(out, DataType.f32))]
        pd = ctx.try_layouts("binary", make, [c for c in full if c[1] is not None])
    if wide is None and is_slow(pd.impl_name, "binary") and _collapsed_binary(
            ctx, node, a, b_value, None if b_value is not None else b_array, b_dims, out):
        return
    src0_md = pd.arg_md(Arg.SRC_0)
    assert src0_md is not None
    args = {int(Arg.SRC_0): ctx.source(a, src0_md)}
    src1_md = pd.arg_md(Arg.SRC_1)
    assert src1_md is not None
    if b_value is not None:
        args[int(Arg.SRC_1)] = ctx.source(b_value, src1_md)
    else:  # a constant operand, in the layout the primitive chose (blocked like src0 or plain)
        fixed[int(Arg.SRC_1)] = ctx.weights(b_array, src1_md)
    args[int(Arg.DST)] = _in_place_or_new(ctx, node, args[int(Arg.SRC_0)], src0_md)
    ctx.add_primitive(node.name, pd, args, fixed, info=ctx.info_for(node))


def _first_operand_stored(ctx: LowerContext, node: Node, a: str, out: tuple[int, ...]) -> bool:
    """A constant first operand broadcast to ``out`` (``1 / x``: RMSNorm's rsqrt, Reciprocal;
    ``c − x``), stored expanded as the value ``a@expanded``: the binary primitive's first
    source is full size. False when ``a`` is not a constant or the copy would pass
    BROADCAST_CONSTANT_BYTES."""
    value = ctx.const(a)
    if value is None:
        return False
    dims = (1,) * (len(out) - np.ndim(value)) + tuple(np.shape(value))
    wide = stored_broadcast(value, dims, out)
    if wide is None:
        return False
    ctx.folded[f"{a}@expanded"] = wide  # what ctx.const gives, should a layout copy be made
    ctx.home[f"{a}@expanded"] = ctx.const_slot(f"const:{a}@expanded", const_memory(wide))
    return True


def collapsed_dims(out: tuple[int, ...], b_dims: tuple[int, ...]
                   ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``out`` and the broadcast operand's dims with neighbouring dims merged while the
    operand is either full along them or broadcast along them (out's size-1 dims dropped):
    [64, 3, 64, 32] / [64, 3, 64, 1] → [12288, 32] / [12288, 1]. None if nothing merges."""
    runs: list[list[int]] = []  # [full, out size, operand size]
    for o, d in zip(out, b_dims, strict=True):
        if o == 1:
            continue
        full = int(d == o)
        if runs and runs[-1][0] == full:
            runs[-1][1] *= o
            runs[-1][2] *= d
        else:
            runs.append([full, o, d])
    if len(runs) == len(out):
        return None
    merged = ((1,) * max(2 - len(runs), 0) + tuple(r[1] for r in runs),
              (1,) * max(2 - len(runs), 0) + tuple(r[2] for r in runs))
    return merged


def _collapsed_binary(ctx: LowerContext, node: Node, a: str, b_value: str | None,
                      b_array: np.ndarray | None, b_dims: tuple[int, ...],
                      out: tuple[int, ...]) -> bool:
    """A binary whose operand broadcast oneDNN 3.2 runs on ``ref:any`` only ([64, 3, 64, 1]
    on [64, 3, 64, 32]: the denominator of ``F.normalize``, a LayerNorm written out) on the
    row-major bytes seen with fewer dims (``collapsed_dims``), where it is a per-row or
    per-channel broadcast the jit kernel takes. Element for element the same operation.
    False when the jit kernel declines the merged shapes too."""
    merged = collapsed_dims(out, b_dims)
    if merged is None:
        return False
    found = first_fast("binary", (merged, ((1, *merged[0]), (1, *merged[1]))),
                       lambda dims: binary(BINARY[node.op], plain_md(dims[0], DataType.f32),
                                           plain_md(dims[1], DataType.f32),
                                           plain_md(dims[0], DataType.f32)))
    if found is None:
        return False
    (out_c, b_c), pd = found
    f32_out, f32_b = plain_md(out_c, DataType.f32), plain_md(b_c, DataType.f32)
    y = node.outputs[0]
    args = {int(Arg.SRC_0): ctx.view(a, out_c, row_major=True)}
    fixed: dict[int, Memory] = {}
    if b_value is not None:
        args[int(Arg.SRC_1)] = ctx.view(b_value, b_c, row_major=True)
    else:
        assert b_array is not None
        fixed[int(Arg.SRC_1)] = ctx.weights(b_array.reshape(b_c), f32_b)
    whole = ctx.define(y, plain_md(out, DataType.f32))
    args[int(Arg.DST)] = ctx.temp(f"{y}@collapsed", f32_out, alias=whole)
    ctx.add_primitive(node.name, pd, args, fixed,
                      info=ctx.info_for(node, optimizations=["collapsed_broadcast"]))
    return True


def probe_binary(ctx: LowerContext, node: Node, port: int, dtype: DataType) -> MemoryDesc | None:
    """An elementwise op's full-size input should come in the layout of its other full-size
    input when that one is already computed (channels-last): a Transpose back to NCHW then
    stays a view of its NHWC source (ConvNeXt's blocks with TensorRT-style quantization: a
    14 ms permute and a reorder of the residual before the Add, measured under load)."""
    md = _computed_channels_last(ctx, node, port, same_shape=True)
    return None if md is None else md_like(md, dtype)
