"""A composer result (passes/composer.py ``Composed``) → oneDNN primitive attributes.

oneDNN 3.x (docs/onednn.md), which ``runtime/reference/chain.apply_composed`` models:

    x   = f32(acc)·wei_scale[oc] + bias[oc]
    x   = post_op_n(… post_op_0(x))
    dst = saturate(rint(x·f32(1/dst_scale) + dst_zp))       (integer dst)

Mapping: ``wei_scales`` → ATTR_SCALES|WEIGHTS (mask 0, or the per-channel mask the caller gives:
conv 1, grouped conv 3, matmul 1<<(ndims-1)); ``dst_scale`` / ``dst_zero_point`` →
ATTR_SCALES|DST / ATTR_ZERO_POINTS|DST (mask 0); the src (and matmul weight) zero points →
ATTR_ZERO_POINTS (mask 0). Post-ops: Eltwise → eltwise; Binary → binary with a constant src1 of
dims {1, C, 1, 1} (conv) or {1, …, N} (matmul); Prelu → prelu (mask 1<<channel_axis, or 0).

Sum (the residual ``x = scale·(r - zp) + x``) reads the dst memory as ``r``'s data type, which
oneDNN requires to have the dst's size. When it has not (f32 residual into an int8 dst, or an
int8 residual into an f32 dst) the residual becomes a binary add of a full-size f32 tensor
instead: ``residual_f32(port, scale, zp)`` gives the slot of ``scale·(r - zp)`` in f32.
The same binary add replaces the sum when a primitive takes the sum only as its first post-op
(``sum_as_binary``: oneDNN's GEMM-based matmul on AVX2 falls to ``ref:any`` otherwise, 20-40x
slower); ``x + f32(scale·(r - zp))`` instead of the sum's fused multiply-add, so it may differ
by one float32 ulp, i.e. one step on a near-tie.
``TensorAdd`` (not a composer op) is a binary add of a full-size f32 tensor another kernel of
the plan writes: the low half of split weights (no_vnni.py). ``TensorBinary`` (chain item
TensorOperand) reads the node's input ``port``: ``tensor_slot(port)`` gives its f32 slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from qfuse.compiler.lower.layouts import channels_last, const_memory
from qfuse.ir import DType
from qfuse.ir.postops import (
    Binary,
    Composed,
    Eltwise,
    PostOp,
    Prelu,
    Sum,
    TensorBinary,
    one_value,
)
from qfuse.runtime.onednn import Alg, Arg, DataType, Memory, MemoryDesc, PostOps, PrimitiveAttr

F32 = np.float32
DTYPE_SIZE = {DataType.f32: 4, DataType.s32: 4, DataType.s8: 1, DataType.u8: 1}


@dataclass
class BuiltAttr:
    attr: PrimitiveAttr
    fixed: dict[int, Memory] = field(default_factory=dict)  # scales, zero points, operands
    # run-time arguments: full-tensor binary operands, a run-time src zero point
    slot_args: dict[int, str] = field(default_factory=dict)
    sum_port: int | None = None  # residual read in place through the sum post-op
    names: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RuntimeZeroPoint:
    """A src zero point the primitive reads at run time (dynamic quantization): ``slot`` holds
    it as one s32 element, oneDNN's zero-point type."""

    slot: str


SrcZeroPoint = int | RuntimeZeroPoint


@dataclass(frozen=True)
class TensorAdd:
    """Post-op ``x += T``: ``T`` a full-size f32 tensor in ``slot`` (laid out as ``md``)."""

    slot: str
    md: MemoryDesc
    what: str = ""


def per_channel_dims(ndims: int, axis: int, channels: int) -> tuple[int, ...]:
    dims = [1] * ndims
    dims[axis] = channels
    return tuple(dims)


def channel_array(values: np.ndarray, ndims: int, axis: int, channels: int) -> np.ndarray:
    v = np.asarray(values, F32).ravel()
    if v.size == 1:
        v = np.full(channels, v[0], F32)
    return np.ascontiguousarray(v.reshape(per_channel_dims(ndims, axis, channels)))


def post_op_operand(values: np.ndarray, ndims: int, axis: int, channels: int) -> np.ndarray:
    """A constant binary post-op's src1: one value as a one-element tensor (oneDNN's scalar
    broadcast), else one per channel. A per-channel operand on a 1x1 image puts a float32
    1x1 convolution on ``ref:any`` where the scalar one keeps ``brgconv_1x1`` (measured under
    AVX2: NNCF's squeeze-excitation FC with its output quantize and dequantize). Per-channel
    values that are all the same float32 (bit for bit) are that one value: the same products
    (an int8 1x1 convolution of SSDLite's extra blocks, NNCF: ref:any → jit)."""
    v = np.asarray(values, F32).ravel()
    if one_value(v):
        return np.full((1,) * ndims, v[0], F32)
    return channel_array(v, ndims, axis, channels)


def tiled_channels(composed: Composed, channels: int, tile: int) -> Composed:
    """``composed`` over rows of ``tile`` pixels of a channels-last map (``[pixels/tile,
    tile·channels]``): its per-channel binary operands repeated ``tile`` times, one-value
    ones kept. oneDNN 3.2's jit binary walks a per-channel operand pixel by pixel
    (lower_gate ``_tile_factor``, no_vnni ``_finish_rows``)."""
    return replace(composed, channels=channels * tile, post_ops=[
        Binary(op.alg, np.tile(np.asarray(op.values, F32).ravel(), tile))
        if isinstance(op, Binary) and not one_value(op.values) else op
        for op in composed.post_ops])


def build_attr(
    composed: Composed,
    *,
    ndims: int,
    channel_axis: int,
    wei_mask: int,
    dst_type: DataType,
    src_zp: SrcZeroPoint = 0,
    wei_zp: int = 0,
    residual_type: Callable[[int], DataType] | None = None,
    residual_f32: Callable[[int, float, int], tuple[str, MemoryDesc]] | None = None,
    scales: bool = True,
    tensor_slot: Callable[[int], tuple[str, MemoryDesc]] | None = None,
    sum_as_binary: bool = False,
    src_scale: str | None = None,
    single_pixel: bool = False,
) -> BuiltAttr:
    """Attributes for an int8 (or, with ``scales=False``, float) compute primitive;
    ``src_scale``: the slot of a run-time src scale (one f32), which oneDNN multiplies into the
    weight scales before scaling the accumulator (dynamic quantization, lower_compute.py).
    ``single_pixel``: the dst is one pixel ``[1, C, 1, 1]``, which oneDNN sees as a full-size
    operand for a per-channel one; its jit kernels take it only in the dst's channels-last
    strides (a 1x1 convolution of a one-row classifier with SmoothQuant's per-channel multiply:
    ``ref:any`` with ``abcd``, ``jit_uni_int8_1x1`` with ``acdb``; measured, AVX2)."""
    attr = PrimitiveAttr()
    built = BuiltAttr(attr)
    fixed = built.fixed
    channels = composed.channels
    if src_scale is not None:
        attr.set_scales_mask(Arg.SRC, 0)
        built.slot_args[Arg.scales(Arg.SRC)] = src_scale
    if scales and (composed.wei_scales.size > 1 or float(composed.wei_scales[0]) != 1.0):
        mask = wei_mask if composed.wei_scales.size > 1 else 0
        attr.set_scales_mask(Arg.WEIGHTS, mask)
        fixed[Arg.scales(Arg.WEIGHTS)] = Memory.scales(composed.wei_scales.astype(F32))
    if isinstance(src_zp, RuntimeZeroPoint):
        attr.set_zero_points_mask(Arg.SRC, 0)
        built.slot_args[Arg.zero_points(Arg.SRC)] = src_zp.slot
    elif src_zp:
        attr.set_zero_points_mask(Arg.SRC, 0)
        fixed[Arg.zero_points(Arg.SRC)] = Memory.zero_points(src_zp)
    if wei_zp:
        attr.set_zero_points_mask(Arg.WEIGHTS, 0)
        fixed[Arg.zero_points(Arg.WEIGHTS)] = Memory.zero_points(wei_zp)
    if dst_type in (DataType.u8, DataType.s8, DataType.s32):
        if composed.dst_scale is not None and composed.dst_scale != 1.0:
            attr.set_scales_mask(Arg.DST, 0)
            fixed[Arg.scales(Arg.DST)] = Memory.scales(composed.dst_scale)
        if composed.dst_zero_point:
            attr.set_zero_points_mask(Arg.DST, 0)
            fixed[Arg.zero_points(Arg.DST)] = Memory.zero_points(composed.dst_zero_point)
    post_ops = PostOps()
    for index, op in enumerate(composed.post_ops):
        if isinstance(op, Eltwise):
            post_ops.append_eltwise(Alg[f"eltwise_{op.alg}"], op.alpha, op.beta)
            built.names.append(f"eltwise_{op.alg}")
            built.details.append(f"eltwise_{op.alg}(alpha={op.alpha:.6g}, beta={op.beta:.6g})")
        elif isinstance(op, Binary):
            values = post_op_operand(op.values, ndims, channel_axis, channels)
            operand_md = (channels_last(values.shape, DataType.f32)
                          if single_pixel and values.size > 1 and values.ndim >= 3 else None)
            post_ops.append_binary(Alg[f"binary_{op.alg}"],
                                   operand_md or MemoryDesc.from_tag(values.shape, DataType.f32))
            fixed[Arg.post_op(index, Arg.SRC_1)] = const_memory(values)
            built.names.append(f"binary_{op.alg}")
            built.details.append(f"binary_{op.alg}({_summary(op.values)})")
        elif isinstance(op, Prelu):
            slopes = np.ascontiguousarray(np.asarray(op.slopes, F32).ravel())
            mask = 0 if slopes.size == 1 else 1 << channel_axis
            if slopes.size > 1:
                slopes = channel_array(slopes, ndims, channel_axis, channels)
            post_ops.append_prelu(mask)
            fixed[Arg.post_op(index, Arg.WEIGHTS)] = const_memory(slopes)
            built.names.append("prelu")
            built.details.append(f"prelu({_summary(op.slopes)})")
        elif isinstance(op, TensorAdd):
            post_ops.append_binary(Alg.binary_add, op.md)
            built.slot_args[Arg.post_op(index, Arg.SRC_1)] = op.slot
            built.names.append("binary_add")
            built.details.append(f"binary_add({op.what or op.slot})")
        elif isinstance(op, Sum):
            _residual(built, post_ops, index, op, dst_type, residual_type, residual_f32,
                      sum_as_binary)
        elif isinstance(op, TensorBinary):
            if tensor_slot is None:
                raise ValueError(f"binary_{op.alg} of input {op.port}: no tensor to read")
            slot, md = tensor_slot(op.port)
            post_ops.append_binary(Alg[f"binary_{op.alg}"], md)
            built.slot_args[Arg.post_op(index, Arg.SRC_1)] = slot
            built.names.append(f"binary_{op.alg}")
            built.details.append(f"binary_{op.alg}(input {op.port})")
        else:  # pragma: no cover - the post-op type is closed
            raise TypeError(f"unknown post-op {op!r}")
    if len(post_ops):
        attr.set_post_ops(post_ops)
    return built


def store_post_ops(composed: Composed) -> list[PostOp]:
    """oneDNN's int8 store before rounding, ``f32(f32(x·f32(1/s)) + zp)``, as post-ops."""
    if not composed.dst_dtype.is_integer:
        return []
    ops: list[PostOp] = []
    if composed.dst_scale is not None and composed.dst_scale != 1.0:
        ops.append(Eltwise("linear", float(F32(1) / F32(composed.dst_scale)), 0.0))
    if composed.dst_zero_point:
        ops.append(Eltwise("linear", 1.0, float(composed.dst_zero_point)))
    return ops


def as_float_post_ops(composed: Composed) -> Composed:
    """``composed`` with no attributes of its own: weight scales and bias
    (``scale_bias_post_ops``), its post-ops, then the int8 store's scale and zero point
    (``store_post_ops``), all as post-ops of a float32 primitive (a binary or resampling
    primitive, or the finishing binary of split weights, which take no such attributes),
    and for an s8 dst ``nan_to_qmin``."""
    return Composed(composed.channels, DType.F32,
                    post_ops=[*scale_bias_post_ops(composed), *composed.post_ops,
                              *store_post_ops(composed), *nan_to_qmin(composed.dst_dtype)])


def nan_to_qmin(dst: DType) -> list[PostOp]:
    """ONNX's QuantizeLinear (as onnxruntime computes it) turns NaN into qmin; oneDNN 3.2's
    s8 store of a float32 NaN gives +127 (its u8 store gives 0, qmin). A last
    ``clip(-128, 127)`` gives -128 for NaN, since its jit kernel keeps the bound where
    ``max(x, lo)`` meets NaN, and is the identity on every finite value the store then rounds
    and saturates alike (integer bounds). A NaN made inside a model: 0/0 in a linear attention
    whose quantized denominator is 0 (EfficientViT)."""
    if dst is not DType.S8:
        return []
    lo, hi = dst.range
    return [Eltwise("clip", float(lo), float(hi))]


def scale_bias_post_ops(composed: Composed) -> list[PostOp]:
    """oneDNN's weight scale and bias, ``x = f32(x·ws)`` then ``x = f32(x + b)``, as post-ops
    (eltwise linear is one FMA: ``fma(x, ws, 0) = f32(x·ws)``, ``fma(x, 1, b) = f32(x + b)``).
    Per-channel values that are all one float32 (a scalar Add folded into the bias) are one
    eltwise linear: the same rounding, and cheaper than a per-channel binary post-op."""
    ops: list[PostOp] = []
    ws = np.asarray(composed.wei_scales, F32).ravel()
    if ws.size > 1 and not one_value(ws):
        ops.append(Binary("mul", ws))
    elif ws.size and float(ws[0]) != 1.0:
        ops.append(Eltwise("linear", float(ws[0]), 0.0))
    if composed.bias is not None:
        bias = np.asarray(composed.bias, F32).ravel()
        ops.append(Eltwise("linear", 1.0, float(bias[0])) if one_value(bias)
                   else Binary("add", bias))
    return ops


def _residual(built: BuiltAttr, post_ops: PostOps, index: int, op: Sum, dst_type: DataType,
              residual_type: Callable[[int], DataType] | None,
              residual_f32: Callable[[int, float, int], tuple[str, MemoryDesc]] | None,
              sum_as_binary: bool = False) -> None:
    r_type = residual_type(op.port) if residual_type else dst_type
    if DTYPE_SIZE.get(r_type) == DTYPE_SIZE.get(dst_type) and built.sum_port is None \
            and not sum_as_binary:
        post_ops.append_sum(op.scale, op.zero_point, r_type)
        built.sum_port = op.port
        built.names.append("sum")
        built.details.append(f"sum(scale={op.scale:.6g}, zp={op.zero_point}, "
                             f"{r_type.name}, input {op.port})")
        return
    if residual_f32 is None:
        raise ValueError(f"residual input {op.port} ({r_type.name}) cannot be summed into a "
                         f"{dst_type.name} dst")
    slot, md = residual_f32(op.port, op.scale, op.zero_point)
    post_ops.append_binary(Alg.binary_add, md)
    built.slot_args[Arg.post_op(index, Arg.SRC_1)] = slot
    built.names.append("binary_add")
    built.details.append(f"binary_add(residual input {op.port}, s={op.scale:.6g}, "
                         f"zp={op.zero_point})")


def _summary(values: np.ndarray) -> str:
    v = np.asarray(values).ravel()
    if v.size == 1:
        return f"{float(v[0]):.6g}"
    return f"[{v.size}: {float(v.min()):.4g}..{float(v.max()):.4g}]"
