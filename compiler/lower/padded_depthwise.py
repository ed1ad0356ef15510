"""Depthwise int8 convolutions over an explicitly padded u8 source (oneDNN's brdgmm kernel).

oneDNN 3.2's fast int8 depthwise kernel, ``brdgmm_dw`` (AVX-512 VNNI, AMX), takes only a u8
source and no zero point. An s8 source (NNCF quantizes activations symmetrically) or a u8 one
with a zero point (onnxruntime's quantize_static) runs on ``jit_int8``, whose depthwise loop
is slow when the channels are not a multiple of 16. Measured on a 2-core AMD EPYC (AVX-512
VNNI), 2 threads, one kernel, the padded form including its copy (below): 24 channels, 7x7,
56x56, s8: 118 against 56 us (StarNet-S1's first stage), u8 with a zero point 78 against 47;
72 channels 5x5 56x56: 104 against 76; 200 channels 7x7 56x56: 350 against 294. Where it does
not pay: channels a multiple of 16 (96 channels 7x7 56x56: 111 against 114 + the copy; 144
3x3: 38 against 47 + 38), 3x3 kernels (24 channels 28x28: 4.2 against 4.8 + 3.1), small maps
(120 channels 5x5 14x14: 9.5 against 11.4). So the form is taken for a 2-D depthwise conv with
``C % 16 != 0``, at least ``MIN_TAPS`` taps and ``MIN_PIXELS`` output pixels, when a probe says
the present form runs on jit_int8; lower_compute keeps it only where the finished kernel is
brdgmm (not with dilation or a sum post-op, which brdgmm does not take).

The form, exact. A source value ``q`` (s8, or u8 with zero point ``zp``) is stored as the u8
``u = q + shift`` (shift 128 for s8, else 0): ``q - zp = u - L`` with the zero level
``L = zp + shift``. The source is copied once into the interior of a buffer whose border holds
``L`` (``Slot.fill``: set when an execution context is made, never written again), and the
convolution runs over that buffer without padding and without zero point:

    acc' = Σ w·u = Σ w·(q - zp) + L·Σ w = acc + K,      K[c] = L·Σ_taps w[c]

over every tap (a border tap reads ``L``: ``q - zp = 0``, the zero padding the model means).
``|acc'|, |K| <= 255·127·taps < 2^24``, so ``f32(acc')`` and ``f32(acc' - K) = acc`` are exact,
and the post-ops subtract ``K`` first, then apply the weight scale and bias as post-ops
(attrs.scale_bias_post_ops: the same float32 roundings as the attributes), then the node's own
chain: the same values as the zero-point form, bit for bit (tests/compiler/
test_padded_depthwise.py). The copy is one reorder (with dst zero point 128 from s8).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from qfuse.compiler.lower.attrs import scale_bias_post_ops
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.layouts import any_md, channels_last
from qfuse.compiler.lower.no_vnni import isa_is_exact
from qfuse.ir import DType, Node, TensorInfo
from qfuse.ir.postops import Binary, Composed, Eltwise, one_value
from qfuse.runtime.onednn import (
    Arg,
    DataType,
    DnnlError,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    convolution,
)

F32 = np.float32
CHANNEL_BLOCK = 16  # jit_int8's depthwise channel block: a multiple of it runs fast there
MIN_TAPS = 25  # kernel taps (5x5) from which the padded form pays (module docstring)
MIN_PIXELS = 2048  # output pixels (about 45x45) from which it pays
S8_SHIFT = 128


@dataclass(frozen=True)
class Padded:
    """How one depthwise convolution's source is padded: the zero level ``level`` (u8) of
    the copy, the shift added to each value on the way (128 from s8), and the pads."""

    level: int
    shift: int
    pads: tuple[int, int, int, int]  # top, left, bottom, right


def wanted(ctx: LowerContext, node: Node, xinfo: TensorInfo, yinfo: TensorInfo,
           w: np.ndarray, g: int, geometry: dict[str, Sequence[int]]) -> Padded | None:
    """The padding of the form for this convolution, or None where it is not taken (module
    docstring: the shape rule, then a probe that the present form runs on jit_int8; whether
    the padded one runs on brdgmm decides lower_compute.lower_conv, which undoes it if not)."""
    fused = node.fused
    if (fused is None or fused.src_zero_point_port is not None or ctx.options.mode != "fused"
            or not ctx.options.padded_depthwise
            or len(xinfo.shape) != 4 or g != xinfo.shape[1] or g != yinfo.shape[1]
            or w.shape[1:3] != (1, 1) or not isa_is_exact()):
        return None
    zp, dtype = fused.src_zero_point, xinfo.dtype
    shift = S8_SHIFT if dtype is DType.S8 else 0
    taps = math.prod(w.shape[3:])
    if ((dtype is DType.U8 and not zp) or dtype not in (DType.S8, DType.U8)
            or g % CHANNEL_BLOCK == 0 or taps < MIN_TAPS
            or math.prod(yinfo.shape[2:]) < MIN_PIXELS or 255 * 127 * taps >= 2 ** 24
            or not 0 <= zp + shift <= 255):
        return None
    try:
        present = convolution(any_md(xinfo.shape, DataType.s8 if shift else DataType.u8),
                              any_md(tuple(w.shape), DataType.s8),
                              any_md(yinfo.shape, DataType.f32),
                              attr=PrimitiveAttr().set_zero_points_mask(Arg.SRC, 0)
                              if zp else None, **geometry)
    except DnnlError:
        return None
    if not present.impl_name.startswith("jit_int8"):
        return None
    top, left = geometry["padding_l"]
    bottom, right = geometry["padding_r"]
    return Padded(zp + shift, shift, (top, left, bottom, right))


def padded_shape(shape: Sequence[int], padded: Padded) -> tuple[int, int, int, int]:
    top, left, bottom, right = padded.pads
    return (shape[0], shape[1], shape[2] + top + bottom, shape[3] + left + right)


def padded_source(ctx: LowerContext, value: str, padded: Padded) -> tuple[str, TensorInfo]:
    """``value`` as u8 in the interior of a channels-last buffer whose border holds the zero
    level, and its tensor info: one reorder into a view of the interior, shared by every
    reader of the same padding."""
    info = ctx.info(value)
    shape = padded_shape(info.shape, padded)
    wide = TensorInfo(shape, DType.U8)
    top, left, bottom, right = padded.pads
    name = f"{value}@pad{top},{left},{bottom},{right}@{padded.level}"
    if name in ctx.home:
        return name, wide
    src_type = DataType.s8 if padded.shift else DataType.u8
    src = ctx.source(value, channels_last(info.shape, src_type))
    buffer_md = channels_last(shape, DataType.u8)
    buffer = ctx.temp(name, buffer_md, fill=padded.level)
    strides = buffer_md.strides
    assert strides is not None
    interior = ctx.temp(f"{name}_interior", MemoryDesc.from_strides(info.shape, DataType.u8,
                                                                     strides),
                        alias=buffer, offset=top * strides[2] + left * strides[3])
    attr, fixed = None, {}
    if padded.shift:
        attr = PrimitiveAttr().set_zero_points_mask(Arg.DST, 0)
        fixed = {Arg.zero_points(Arg.DST): Memory.zero_points(padded.shift)}
    shifted = f" + {padded.shift} as u8" if padded.shift else ""
    ctx.add_reorder(src, interior, attr=attr, fixed=fixed, role="op",
                    note=f"'{value}'{shifted} into a buffer padded with its zero level "
                         f"{padded.level} (a depthwise convolution's source, brdgmm)")
    ctx.home[name] = buffer
    return name, wide


def compensated(composed: Composed, w: np.ndarray, padded: Padded) -> Composed:
    """``composed`` for the accumulator over the padded u8 source: ``-K`` first (exact), then
    the weight scale and bias as post-ops, then the node's chain (module docstring)."""
    taps = np.asarray(w, np.int64).reshape(w.shape[0], -1).sum(axis=1)
    k = (-padded.level * taps).astype(F32)
    first = (Eltwise("linear", 1.0, float(k[0])) if one_value(k) else Binary("add", k))
    return replace(composed, wei_scales=np.ones(1, F32), bias=None,
                   post_ops=[first, *scale_bias_post_ops(composed), *composed.post_ops],
                   fired=[*composed.fired, "padded_depthwise"])
