"""Quantize, dequantize and requantize → one oneDNN primitive each.

oneDNN 3.2's reorder with scales and zero points computes (measured on this machine with
tie-valued inputs, tests/compiler/test_lower_quant.py):

    dst = saturate(rint(f32(s_src·(src - zp_src)) · f32(1/s_dst) + zp_dst))

— the dst scale is applied as a multiplication by its f32 reciprocal, and the dst zero point is
added before rounding, like the int8 convolutions. That is not ONNX's QuantizeLinear,
``saturate(rint(x / s) + zp)`` with a float32 division (MLAS ``MlasQuantizeLinearVector``:
``MlasDivideFloat32x4``, clamp, ``cvtps2dq``, then ``+ zp``): on (p/255 - 0.5)/0.5 image
inputs with s = 2/255, zp = 128 the reorder is one step off on 189 of 768 values. So a
quantization the model writes the ONNX way (QuantizeLinear, or a FakeQuantize made from a Q/DQ
pair, ``FakeQuantizeAttrs.onnx``) is a *binary* primitive, whose post-ops are float32 too:

    quantize   (f32 → int):  binary_div(x, s)               → eltwise_round → linear(1, zp)
    requantize (int → int):  binary_sub(q, zp_src) → linear(s_src) → binary_div(s_dst)
                             → eltwise_round → linear(1, zp_dst)

— ``f32(q - zp_src)·s_src`` is ONNX's DequantizeLinear exactly, the division is a true
division, and the zero point is added to an integer; the store's rint and saturation are then
exact. Bit-exact with onnxruntime on the image inputs and on a sweep of near-tie inputs
(tests/compiler/test_lower_quant.py), and faster than the reorder here (f32 → u8 1×3×224×224:
41 µs against 59 µs, one thread). oneDNN's binary is only jit when dst has the source's
layout (nchw f32 → nhwc u8 falls to ``ref:any``, 100× slower), so when the consumer wants
another layout an int → int reorder follows.

The composer option ``zero_point_before_round`` (passes/composer.py) keeps oneDNN's reorder
here too, for measuring what the ONNX form costs and for ``--emulate onednn``. The other
quantizations stay reorders:

- quantize-only FakeQuantize [x, il, ih, ol, oh] (f32 → u8/s8), with unit output steps
  (oh - ol = L - 1): ``q = round((x - il)/s) + ol`` with ``s = (ih - il)/(L - 1)``, i.e. a
  reorder with dst scale ``s`` and dst zero point ``ol - il/s`` (an integer for every
  quantization onnxruntime or LPT produce), provided [ol, oh] covers the dst type (the store
  saturates there). FakeQuantize divides by (ih - il) and multiplies by L - 1 where the reorder
  multiplies by 1/s: near-ties may round one step apart.
- QuantizeLinear: dst scale / zero point (ONNX divides by the scale: same one-step caveat).
- DequantizeLinear (int → f32): src scale (per tensor, or per channel mask 1<<axis) and src
  zero point.
- A DequantizeLinear read only by quantize-only FakeQuantizes / QuantizeLinears (the
  requantize pair the passes leave; a feature map DenseNet reads into each later Concat's
  scale) is no kernel of its own: each reader requantizes the integers, one reorder with both
  scales and zero points or, in ONNX's rounding, one binary primitive (below). A per-channel
  dequantize (an integer Concat of inputs with their own parameters) likewise into per-tensor
  ONNX-form quantizes: binary_sub(q, zp[c]) → binary_mul(s[c]) → binary_div(s') → round →
  + zp', ONNX's operations in order (q - zp[c] exact).

The layout of the reorder's output is chosen for its consumer: what a convolution reading it
would pick (``preferred_md``), or channels-last for int8 pooling, else the source's layout.
Per-channel zero points (NNCF's MIXED preset on depthwise inputs; a oneDNN reorder takes one
zero point) are binary primitives as well, the zero points a per-channel f32 operand:

    dequantize (int → f32):  reorder to f32, then binary_sub(·, zp[c]) → binary_mul(s[c])
                             (f32(q - zp)·s; oneDNN 3.2's jit binary takes an integer source
                             only with an integer dst, ref:any otherwise)
    quantize   (f32 → int):  binary_div(x, s[c]) → eltwise_round → binary_add(zp[c])

both ONNX's formulas in the same float32 operations (q - zp and rint(x/s) + zp are exact
integers). Anything else (narrow output ranges, a full f32 → f32 FakeQuantize) runs the
reference semantics in numpy (fallback.py).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.plan import KernelInfo
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
)
from qfuse.ir import DType, Node, Op
from qfuse.ir.ops import DequantizeAttrs, FakeQuantizeAttrs, QuantizeAttrs
from qfuse.compiler.lower.attrs import nan_to_qmin, per_channel_dims
from qfuse.ir.chain import ONNX_FORM
from qfuse.ir.postops import single_pixel_batch
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    Memory,
    MemoryDesc,
    PostOps,
    PrimitiveAttr,
    PrimitiveDesc,
    binary,
)

log = logging.getLogger(__name__)
F32 = np.float32


@dataclass(frozen=True)
class QuantSide:
    """Scale(s) and zero point of one side of a reorder; ``axis`` for per-channel scales."""

    scale: np.ndarray
    zero_point: int
    axis: int | None = None
    zero_points: np.ndarray | None = None  # per channel along ``axis`` (zero_point unused)


def preferred_md(ctx: LowerContext, value: str, dtype: DataType,
                 source: MemoryDesc) -> MemoryDesc:
    """Layout for a reorder's output ``value`` (module docstring)."""
    found = ctx.preferred(value, dtype)
    if found is not None:
        return found
    return md_like(source, dtype) or plain_md(source.dims, dtype)


def _onnx_quantize(ctx: LowerContext, node: Node, src_value: str, src: QuantSide | None,
                   dst: QuantSide, absorbed: list[str]) -> None:
    """ONNX's rounding as one binary primitive (module docstring). Where every scale and zero
    point is one value, over the bytes with the dims in memory order, merged
    (layouts.memory_order_groups), when the source's layout runs on ``ref:any`` (a transposed
    attention head) or is channels-last: oneDNN 3.2's jit binary walks each pixel's channels
    in vector-length pieces, the last one masked, so a requantize of [1, 8, 112, 112]
    channels-last u8 took 57 µs and 7 µs as one dim of 100352 (C = 24: 79 → 15 µs; C = 120
    on 28 x 28: 22 → 7 µs; C a multiple of 16: the same either way). The same operations
    element for element: bit-identical."""
    y = node.outputs[0]
    dtype = dnnl_type(ctx.info(y).dtype)
    home = ctx.home_slot(src_value)
    src_md = ctx.slots[home].md
    kernel = _QuantizeKernel(ctx.info(y).dtype, src, dst)
    shape = tuple(src_md.dims)
    if (not kernel.per_tensor and all(s.axis in (None, 1) for s in (src, dst) if s is not None)
            and single_pixel_batch(shape)):
        # oneDNN 3.2's jit binary applies per-channel operands wrongly when N > 1 and every
        # spatial dim is 1 (docs/onednn.md): over an (N, C) view, as lower_batch_norm does
        rows = ctx.view(src_value, shape[:2], row_major=True)
        nc_dst = plain_md(shape[:2], dtype)
        nc_pd, nc_fixed = kernel.primitive(ctx.slots[rows].md, nc_dst)
        out = ctx.define(y, plain_md(shape, dtype))
        ctx.add_primitive(node.name, nc_pd, {
            int(Arg.SRC_0): rows, int(Arg.DST): ctx.temp(f"{y}@nc", nc_dst, alias=out)},
            nc_fixed, info=kernel.info(ctx, node, 2, absorbed))
        return
    same = md_like(src_md, dtype) or plain_md(src_md.dims, dtype)
    pd, fixed = kernel.primitive(src_md, same)
    want = same if _read_by_reorders(ctx, y) else preferred_md(ctx, y, dtype, src_md)
    slow = is_slow(pd.impl_name, "binary")
    groups = memory_order_groups(src_md, []) if kernel.per_tensor else None
    if groups is not None and not slow and (len(groups) > 1 or is_row_major(src_md)):
        groups = None  # row-major, or dims that do not merge into one: no shorter rows
    found = None if groups is None else first_fast(
        "binary", (grouped_md(groups, src_md.dims, src_md.dtype, lead) for lead in (0, 1)),
        lambda flat: kernel.primitive(flat, md_like(flat, dtype)))
    if found is not None and slow:
        want = dense_in_order(src_md, src_md.dims, dtype)
    out = ctx.define(y, want)
    target = out if want == same else ctx.temp(f"{y}@{same.dtype.name}", same)
    if found is not None:
        flat, (flat_pd, flat_fixed) = found
        ctx.add_primitive(node.name, flat_pd, {
            int(Arg.SRC_0): ctx.temp(f"{src_value}@order", flat, alias=home),
            int(Arg.DST): ctx.temp(f"{y}@order", md_like(flat, dtype), alias=target)},
            flat_fixed, info=kernel.info(ctx, node, len(flat.dims), absorbed, ["memory_order"]))
    else:
        ctx.add_primitive(node.name, pd, {int(Arg.SRC_0): home, int(Arg.DST): target}, fixed,
                          info=kernel.info(ctx, node, len(src_md.dims), absorbed))
    if target != out:
        at_input = src_value in ctx.graph.inputs
        ctx.add_reorder(target, out, role="io" if at_input else "reorder",
                        note=f"'{y}' laid out for its reader")


@dataclass(frozen=True)
class _QuantizeKernel:
    """``_onnx_quantize``'s binary primitive and post-ops, over descriptors of any rank."""

    dtype: DType
    src: QuantSide | None
    dst: QuantSide

    @property
    def per_tensor(self) -> bool:
        return self.dst.axis is None and (self.src is None or self.src.axis is None)

    def primitive(self, src_md: MemoryDesc, dst_md: MemoryDesc
                  ) -> tuple[PrimitiveDesc, dict[int, Memory]]:
        alg, src1_md, posts, fixed, _, _ = self._parts(len(src_md.dims))
        attr = PrimitiveAttr()
        attr.set_post_ops(posts)
        return binary(alg, src_md, src1_md, dst_md, attr=attr), fixed

    def info(self, ctx: LowerContext, node: Node, ndims: int, absorbed: list[str],
             optimizations: list[str] | None = None) -> KernelInfo:
        alg, _, _, _, names, details = self._parts(ndims)
        src, dst = self.src, self.dst
        s_text = _scale_text(dst)
        what = (f"x / {s_text}" if src is None
                else f"x - {src.zero_point} (then the post-ops)" if src.axis is None
                else f"x - zero point per channel (axis {src.axis}; then the post-ops)")
        info = ctx.info_for(node, role="op", optimizations=list(optimizations or []),
                            post_ops=names, post_op_details=details, rounding=ONNX_FORM,
                            note=f"binary_{alg.name.split('_')[-1]}: {what}")
        info.absorbed += [a for a in absorbed if a not in info.absorbed]
        return info

    def _parts(self, ndims: int) -> tuple[Alg, MemoryDesc, PostOps, dict[int, Memory],
                                          list[str], list[str]]:
        src, dst = self.src, self.dst
        one = (1,) * ndims
        scale_dims = (one if dst.axis is None
                      else per_channel_dims(ndims, dst.axis, dst.scale.size))
        scale_md = MemoryDesc.from_tag(scale_dims, DataType.f32)
        scales = const_memory(dst.scale.astype(F32).reshape(scale_dims))
        posts, fixed = PostOps(), {}
        names: list[str] = []
        details: list[str] = []
        s_text = _scale_text(dst)
        if src is None:
            alg, src1_md = Alg.binary_div, scale_md
            fixed[int(Arg.SRC_1)] = scales
        elif src.axis is None:
            alg, src1_md = Alg.binary_sub, MemoryDesc.from_tag(one, DataType.f32)
            fixed[int(Arg.SRC_1)] = const_memory(np.full(one, src.zero_point, F32))
            posts.append_eltwise(Alg.eltwise_linear, float(src.scale[0]), 0.0)
            posts.append_binary(Alg.binary_div, scale_md)
            fixed[Arg.post_op(1, Arg.SRC_1)] = scales
            names += ["eltwise_linear", "binary_div"]
            details += [f"eltwise_linear(alpha={float(src.scale[0]):.6g}, beta=0)",
                        f"binary_div({s_text})"]
        else:  # a per-channel dequantize: q - zp[c] (exact), ·s[c] (one rounding), / s
            assert dst.axis is None, "a per-channel requantize writes one scale"
            dims = per_channel_dims(ndims, src.axis, src.scale.size)
            zps = (src.zero_points if src.zero_points is not None
                   else np.full(src.scale.size, src.zero_point))
            alg, src1_md = Alg.binary_sub, MemoryDesc.from_tag(dims, DataType.f32)
            fixed[int(Arg.SRC_1)] = const_memory(zps.astype(F32).reshape(dims))
            posts.append_binary(Alg.binary_mul, MemoryDesc.from_tag(dims, DataType.f32))
            fixed[Arg.post_op(0, Arg.SRC_1)] = const_memory(
                src.scale.astype(F32).reshape(dims))
            posts.append_binary(Alg.binary_div, scale_md)
            fixed[Arg.post_op(1, Arg.SRC_1)] = scales
            names += ["binary_mul", "binary_div"]
            details += [f"binary_mul([{src.scale.size} scales, axis {src.axis}])",
                        f"binary_div({s_text})"]
        posts.append_eltwise(Alg.eltwise_round)
        names.append("eltwise_round")
        details.append("eltwise_round")
        if dst.zero_points is not None:
            posts.append_binary(Alg.binary_add, scale_md)
            fixed[Arg.post_op(len(posts) - 1, Arg.SRC_1)] = const_memory(
                dst.zero_points.astype(F32).reshape(scale_dims))
            names.append("binary_add")
            details.append(f"binary_add([{dst.zero_points.size} zero points, axis {dst.axis}])")
        elif dst.zero_point:
            posts.append_eltwise(Alg.eltwise_linear, 1.0, float(dst.zero_point))
            names.append("eltwise_linear")
            details.append(f"eltwise_linear(alpha=1, beta={dst.zero_point})")
        if src is None:  # a float32 source may hold NaN (a 0/0 in the model): ONNX gives qmin
            for op in nan_to_qmin(self.dtype):
                posts.append_eltwise(Alg[f"eltwise_{op.alg}"], op.alpha, op.beta)
                names.append(f"eltwise_{op.alg}")
                details.append(f"eltwise_{op.alg}(alpha={op.alpha:.6g}, beta={op.beta:.6g})")
        return alg, src1_md, posts, fixed, names, details


def _scale_text(side: QuantSide) -> str:
    return (f"{float(side.scale[0]):.6g}" if side.scale.size == 1
            else f"[{side.scale.size} scales, axis {side.axis}]")


def _read_by_reorders(ctx: LowerContext, value: str) -> bool:
    """Whether only dequantizes read ``value`` (a Q → DQ pair a float op and a graph output
    sandwich): their reorder reads any layout, so a quantize writing ``value`` in its
    source's layout saves the int → int reorder to the layout their outputs prefer (LRASPP's
    224x224 output: u8 channels-last → nchw, 0.13 ms of 2.6)."""
    readers = ctx.graph.consumers(value)
    return bool(readers) and not ctx.is_output(value) and all(
        r.op is Op.DEQUANTIZE_LINEAR and r.fused is None for r, _ in readers)


def _reorder(ctx: LowerContext, node: Node, src_value: str, src: QuantSide | None,
             dst: QuantSide | None, absorbed: list[str]) -> None:
    y = node.outputs[0]
    dtype = dnnl_type(ctx.info(y).dtype)
    home = ctx.home_slot(src_value)
    out = ctx.define(y, preferred_md(ctx, y, dtype, ctx.slots[home].md))
    attr = PrimitiveAttr()
    fixed: dict[int, Memory] = {}
    for arg, side in ((Arg.SRC, src), (Arg.DST, dst)):
        if side is None:
            continue
        if side.scale.size > 1 or float(side.scale[0]) != 1.0:
            mask = 0 if side.scale.size == 1 else 1 << int(side.axis or 0)
            attr.set_scales_mask(arg, mask)
            fixed[Arg.scales(arg)] = Memory.scales(side.scale.astype(F32))
        if side.zero_point:
            attr.set_zero_points_mask(arg, 0)
            fixed[Arg.zero_points(arg)] = Memory.zero_points(side.zero_point)
    kernel = ctx.add_reorder(home, out, attr=attr, fixed=fixed, role="op", node=node)
    kernel.info.absorbed += [a for a in absorbed if a not in kernel.info.absorbed]
    if dst is not None:
        kernel.info.rounding = "round(x·(1/s)+zp)" if dst.zero_point else "round(x·(1/s))"


def _binary_dequantize(ctx: LowerContext, node: Node, side: QuantSide) -> None:
    """A DequantizeLinear with per-channel zero points: ``f32(q - zp[c])·s[c]`` as a binary
    primitive (module docstring), dst f32. Along axis 1 in the source's layout (jit binary
    needs src and dst alike); along another axis (a Concat along a last or middle axis of
    tensors with their own zero points: EVA-02's rotary stack under NNCF's MIXED preset),
    oneDNN 3.2's binary broadcasts on ``ref:any`` only, so the tensor is made row-major and
    seen as (before, C, after) — the operand then one value per channel of a 3-D tensor, a
    jit broadcast — or as (before, C) when nothing follows the axis."""
    x, y = node.inputs[0], node.outputs[0]
    home = ctx.home_slot(x)
    src_md = ctx.slots[home].md
    shape = tuple(src_md.dims)
    assert side.axis is not None and side.zero_points is not None
    axis, channels = side.axis, side.zero_points.size
    # oneDNN 3.2's jit binary applies per-channel operands wrongly when N > 1 and every
    # spatial dim is 1 (docs/onednn.md; fuzz seed 424127, 55 steps off): over an (N, C) view
    collapsed = axis != 1 or single_pixel_batch(shape)
    if collapsed:
        after = math.prod(shape[axis + 1:])
        view = (math.prod(shape[:axis]), channels) + ((after,) if after > 1 else ())
        dims = per_channel_dims(len(view), 1, channels)
    else:
        dims = per_channel_dims(len(shape), axis, channels)
    posts = PostOps()
    fixed = {int(Arg.SRC_1): const_memory(side.zero_points.astype(F32).reshape(dims))}
    if side.scale.size == 1:
        posts.append_eltwise(Alg.eltwise_linear, float(side.scale[0]), 0.0)
        names = ["eltwise_linear"]
        details = [f"eltwise_linear(alpha={float(side.scale[0]):.6g}, beta=0)"]
    else:
        posts.append_binary(Alg.binary_mul, MemoryDesc.from_tag(dims, DataType.f32))
        fixed[Arg.post_op(0, Arg.SRC_1)] = const_memory(side.scale.astype(F32).reshape(dims))
        names = ["binary_mul"]
        details = [f"binary_mul([{side.scale.size} scales, axis {side.axis}])"]
    attr = PrimitiveAttr()
    attr.set_post_ops(posts)
    dst_md = plain_md(shape, DataType.f32) if collapsed else (
        md_like(src_md, DataType.f32) or plain_md(shape, DataType.f32))
    converted = ctx.temp(f"{y}@f32", dst_md)
    ctx.add_reorder(home, converted, role="op", node=node,
                    note=f"'{x}' to f32 for its per-channel zero points")
    out = ctx.define(y, dst_md)
    if collapsed:  # the same row-major bytes as (before, C[, after])
        seen = plain_md(view, DataType.f32)
        dst_md, converted = seen, ctx.temp(f"{y}@f32_view", seen, alias=converted)
        out = ctx.temp(f"{y}@view", seen, alias=out)
    pd = binary(Alg.binary_sub, dst_md, MemoryDesc.from_tag(dims, DataType.f32), dst_md,
                attr=attr)
    info = ctx.info_for(node, role="op", post_ops=names, post_op_details=details,
                        note=f"binary_sub: x - zero point per channel (axis {side.axis})")
    ctx.add_primitive(node.name, pd, {int(Arg.SRC_0): converted, int(Arg.DST): out}, fixed,
                      info=info)


def _uniform_zp(zp: np.ndarray | None) -> int | None:
    if zp is None:
        return 0
    values = np.unique(np.asarray(zp).astype(np.int64))
    return int(values[0]) if values.size == 1 else None


def _side(scale: np.ndarray, zp: np.ndarray | None, axis: int, ndim: int) -> QuantSide | None:
    z = _uniform_zp(zp)
    s = np.asarray(scale, F32).ravel()
    if not np.all(np.isfinite(s)) or np.any(s == 0):
        return None
    axis = axis + ndim if axis < 0 else axis
    if z is None:  # per-channel zero points (with as many scales): binary primitives only
        zps = np.asarray(zp).astype(np.int64).ravel()
        if s.size != zps.size:
            return None
        return QuantSide(s, 0, axis, zps)
    return QuantSide(s, z, None if s.size == 1 else axis)


def _taken_as_int8(ctx: LowerContext, y: str, readers: list[tuple[Node, int]]) -> bool:
    """Every reader of ``y`` is a gate chain reading its 8-bit source itself."""
    from qfuse.compiler.lower.lower_gate import int8_operand  # (lower_gate imports this)

    return all((taken := int8_operand(ctx, r)) is not None and taken[3] == y
               for r, _ in readers)


def take_deferred(ctx: LowerContext, node: Node, x: str | None = None
                  ) -> tuple[str, QuantSide | None, list[str]]:
    """The int source and src quantization a skipped DequantizeLinear left for the readers of
    ``x`` (default: ``node``'s first input), gone once ``node``, the last of them still to be
    lowered, took it."""
    x = node.inputs[0] if x is None else x
    deferred = ctx.deferred.get(x)
    if deferred is None:
        return x, None, []
    if all(r.name == node.name or r.name in ctx.lowered for r, _ in ctx.graph.consumers(x)):
        del ctx.deferred[x]
    return deferred


def lower_dequantize(ctx: LowerContext, node: Node) -> None:
    attrs: DequantizeAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    scale = ctx.need_const(node, 1, "the scale")
    zp = ctx.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    side = _side(scale, zp, attrs.axis, len(ctx.info(x).shape))
    if side is None:
        lower_numpy(ctx, node, note="a zero or non-finite scale")
        return
    readers = ctx.graph.consumers(y)
    # read only by quantizes (a requantize, or DenseNet's feature map into each later
    # Concat's scale): each reader requantizes q itself, and nothing writes y; a per-channel
    # dequantize (an integer Concat of inputs with their own parameters) only into per-tensor
    # quantizes in ONNX's rounding (one binary primitive, module docstring)
    if (readers and not ctx.is_output(y)
            and all(r.op in (Op.FAKE_QUANTIZE, Op.QUANTIZE_LINEAR) and r.fused is None
                    and _requantizes(ctx, r, side) for r, _ in readers)):
        ctx.deferred[y] = (x, side, list(node.origin))
        return
    # read only by gate chains that read q themselves with its scale (a symmetric int8
    # residual Add: lower_gate.int8_operand), nothing writes y either
    if (readers and side.zero_points is None and side.zero_point == 0 and side.axis is None
            and _taken_as_int8(ctx, y, readers)):
        ctx.deferred[y] = (x, side, list(node.origin))
        return
    if side.zero_points is not None:
        _binary_dequantize(ctx, node, side)
        return
    _reorder(ctx, node, x, side, None, [])


def _requantizes(ctx: LowerContext, node: Node, src: QuantSide) -> bool:
    """Can quantize ``node`` read the integers of a dequantize with ``src`` itself?"""
    dst = _quantize_side(ctx, node)
    if dst is None:
        return False
    if src.axis is None:
        return True
    return (dst.axis is None and dst.zero_points is None and ctx.options.onnx_rounding
            and _onnx_rounding(node))


def _quantize_side(ctx: LowerContext, node: Node) -> QuantSide | None:
    """dst scale / zero point of a quantize-only FakeQuantize or QuantizeLinear, if a reorder
    computes it (module docstring)."""
    y = node.outputs[0]
    out = ctx.info(y).dtype
    if not out.is_quantized:
        return None
    ndim = len(ctx.info(node.inputs[0]).shape)
    if node.op is Op.QUANTIZE_LINEAR:
        attrs: QuantizeAttrs = node.attrs
        scale = ctx.const(node.inputs[1])
        zp = ctx.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        return None if scale is None else _side(scale, zp, attrs.axis, ndim)
    fq: FakeQuantizeAttrs = node.attrs
    if fq.onnx is not None and not fq.onnx.dequantize and fq.onnx.dtype is out:
        quant = fq.onnx.quant
        zps = np.unique(quant.zero_point_array())
        axis = None if quant.axis is None else quant.axis % ndim
        if zps.size == 1:
            return QuantSide(quant.scale_array(), int(zps[0]), axis)
        if axis is not None and quant.scale_array().size == quant.zero_point_array().size:
            return QuantSide(quant.scale_array(), 0, axis,
                             quant.zero_point_array().astype(np.int64).ravel())
    consts = [ctx.const(v) for v in node.inputs[1:5]]
    if any(c is None for c in consts):
        return None
    il, ih, ol, oh = (np.asarray(c, np.float64).ravel() for c in consts)  # type: ignore[arg-type]
    if any(v.size != 1 for v in (il, ih, ol, oh)) or ih[0] <= il[0]:
        return None
    steps = fq.levels - 1
    lo, hi = out.range
    if oh[0] - ol[0] != steps or ol[0] > lo or oh[0] < hi:
        return None
    s = (ih[0] - il[0]) / steps
    zp = ol[0] - il[0] / s
    if abs(zp - np.rint(zp)) > 1e-3:
        return None
    return QuantSide(np.array([s], F32), int(np.rint(zp)))


def lower_quantize(ctx: LowerContext, node: Node) -> None:
    """Quantize-only FakeQuantize or QuantizeLinear (with a deferred dequantize: requantize)."""
    side = _quantize_side(ctx, node)
    if side is None:
        if node.inputs[0] in ctx.deferred:
            undefer(ctx, node.inputs[0])
        lower_numpy(ctx, node, note="not expressible as a reorder")
        return
    if side.zero_points is not None and node.inputs[0] in ctx.deferred:
        undefer(ctx, node.inputs[0])
    src_value, src_side, absorbed = take_deferred(ctx, node)
    if (side.zero_points is not None or (src_side is not None and src_side.axis is not None)
            or (ctx.options.onnx_rounding and _onnx_rounding(node))):
        _onnx_quantize(ctx, node, src_value, src_side, side, absorbed)
        return
    _reorder(ctx, node, src_value, src_side, side, absorbed)


def _onnx_rounding(node: Node) -> bool:
    """Does the model mean ONNX's round-then-add-zero-point here (module docstring)?"""
    return node.op is Op.QUANTIZE_LINEAR or (
        node.op is Op.FAKE_QUANTIZE and node.attrs.onnx is not None)


def undefer(ctx: LowerContext, value: str) -> None:
    """Emit a deferred dequantize after all (its reader turned out not to take it)."""
    producer = ctx.graph.producer(value)
    assert producer is not None
    x, side, _ = ctx.deferred.pop(value)
    _reorder(ctx, producer, x, side, None, [])
