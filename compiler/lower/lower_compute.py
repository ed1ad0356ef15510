"""Conv / ConvTranspose → oneDNN convolution / deconvolution, and what every compute
primitive shares (``emit``: composed attributes, dst placement, in-place sum). MatMul and
Gemm are in lower_matmul.py.

int8 node (``node.fused`` set, integer src): ``acc = Σ (src - zp_src)·(wei - zp_wei)`` exact,
then the composed attributes (attrs.py). Weight layouts:

- Conv: ONNX [O, I/G, k…] = oneDNN [O, I, k…]; grouped (depthwise too): [G, O/G, I/G, k…].
- ConvTranspose: ONNX [I, O/G, k…] → oneDNN [O, I, k…] (swap the first two axes) or grouped
  [G, O/G, I/G, k…] (reshape to [G, I/G, O/G, k…], swap axes 1 and 2). No spatial flip: oneDNN's
  deconvolution scatters ``dst[o·s + k·d - pad] += src[o]·w[k]`` like ONNX (checked against the
  reference interpreter in tests/compiler/test_lower_compute.py). ONNX output_padding enlarges
  the end: ``padding_r = pad_end - output_padding`` (oneDNN accepts the negative value).

The weights, constant, are reordered once at compile time into the layout the primitive chose
from ``any``. A float node (f32 src) folds the composer's weight scales into its constant
weights (oneDNN f32 primitives take no scales). ``src`` is first tried in its producer's layout
(context.py), the dst in the residual's layout when a sum post-op reads it.

The sum post-op reads dst: dst shares the residual's buffer when nothing reads the residual
later and the layouts agree, otherwise the residual is copied (reorder, same data type) into the
dst buffer before the primitive runs.

On an implementation without VNNI/AMX an int8 node may become two primitives (split weights,
s8 src shifted to u8) so its accumulator stays exact: no_vnni.py decides from the implementation
of the node's unsplit primitive and builds them; ``emit`` takes its result.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower import conv_windows, fold_stride, no_vnni, padded_depthwise, unfused
from qfuse.compiler.lower.attrs import (
    BuiltAttr,
    RuntimeZeroPoint,
    SrcZeroPoint,
    build_attr,
    store_post_ops,
)
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.layouts import (
    any_md,
    channels_last,
    const_memory,
    dnnl_type,
    is_slow,
    md_like,
    plain_md,
    same_bytes,
)
from qfuse.ir import DType, Node, Op, TensorInfo
from qfuse.ir.graph import scale_product
from qfuse.ir.chain import Fused
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs
from qfuse.ir.postops import Binary, Composed, Eltwise, Sum, TensorBinary
from qfuse.runtime.onednn import (
    Arg,
    DataType,
    DnnlError,
    Memory,
    MemoryDesc,
    PrimitiveDesc,
    convolution,
    deconvolution,
    effective_cpu_isa,
)

log = logging.getLogger(__name__)
F32 = np.float32
# create(attributes, dst layout or None for any, composed) -> (primitive desc, weights memory)
Create = Callable[[BuiltAttr, "MemoryDesc | None", Composed],
                  tuple[PrimitiveDesc, "Memory | None"]]


def composed_for(ctx: LowerContext, node: Node, channels: int, dst: DType) -> Composed:
    """The composer's result the compose_post_ops pass stored; empty for plain nodes."""
    if node.fused is None:
        return Composed(channels, dst)
    stored = node.meta.get("composed")
    assert isinstance(stored, Composed), f"{node}: no composed attributes (compose_post_ops)"
    return stored


def conv_weights(w: np.ndarray, group: int, deconv: bool) -> np.ndarray:
    """ONNX weights → oneDNN's logical weights (module docstring)."""
    if deconv:
        cin, og = w.shape[:2]
        if group == 1:
            return np.ascontiguousarray(np.swapaxes(w, 0, 1))
        grouped = w.reshape(group, cin // group, og, *w.shape[2:])
        return np.ascontiguousarray(np.swapaxes(grouped, 1, 2))
    if group == 1:
        return np.ascontiguousarray(w)
    return np.ascontiguousarray(w.reshape(group, w.shape[0] // group, *w.shape[1:]))


def scale_weights(w: np.ndarray, scales: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """Fold per-output-channel scales into float weights (``axes`` hold the channel index)."""
    if scales.size == 1:
        return (w * F32(scales[0])).astype(F32)
    shape = [1] * w.ndim
    for axis in axes:
        shape[axis] = w.shape[axis]
    return (w * scales.astype(F32).reshape(shape)).astype(F32)


def conv_geometry(node: Node) -> dict[str, Sequence[int]]:
    """strides / padding / dilation in oneDNN's terms (module docstring)."""
    attrs: ConvAttrs | ConvTransposeAttrs = node.attrs
    n = len(attrs.kernel_shape)
    pad_r = list(attrs.pads[n:])
    if isinstance(attrs, ConvTransposeAttrs):
        pad_r = [p - o for p, o in zip(pad_r, attrs.output_padding, strict=True)]
    return {"strides": attrs.strides, "padding_l": attrs.pads[:n], "padding_r": pad_r,
            "dilation": tuple(d - 1 for d in attrs.dilations)}


def cover_every_output(w: np.ndarray, geometry: dict[str, Sequence[int]]
                       ) -> tuple[np.ndarray, dict[str, Sequence[int]]]:
    """An int8 deconvolution whose every output position is reached by a kernel tap: zero taps
    appended to the kernel's end along each spatial axis where ``padding_r < 0`` (output_padding
    beyond the end pad: trailing outputs no tap reaches) or, undilated, ``kernel < stride``
    (rows between taps). With ``e`` taps added, ``padding_r`` grows by ``e·(dilation)``, so the
    output size ``(i - 1)·s + (k - 1)·d + 1 - pad_l - pad_r`` is unchanged, and the sums too
    (zero weights: also for the src zero point's compensation). Why: oneDNN 3.2's int8 jit
    deconvolutions compute such outputs wrong (measured under AVX2 on jit_uni_int8: the last
    rows when padding_r <= -2, the last column with stride 3 and padding_r = -1, the rows between
    taps with stride 4 and kernel 1; 212-255 LSB; and WRONG_WITH_NEGATIVE_PADDING_R below)."""
    n = len(geometry["strides"])
    pad_r = list(geometry["padding_r"])
    widths = [(0, 0)] * (w.ndim - n)
    for i in range(n):
        k, s, d = w.shape[w.ndim - n + i], geometry["strides"][i], geometry["dilation"][i] + 1
        extra = -(pad_r[i] // d) if pad_r[i] < 0 else 0  # ceil(-pad_r / d)
        if d == 1 and k + extra < s:
            extra = s - k
        pad_r[i] += extra * d
        widths.append((0, extra))
    if all(e == 0 for _, e in widths):
        return w, geometry
    return np.pad(w, widths), {**geometry, "padding_r": pad_r}


# oneDNN 3.2's jit_avx512_core_x8s8s32x_deconvolution (AVX-512 with or without VNNI; not the AMX
# kernel, also named jit_deconvolution:...): when the whole output row fits one register block
# (ur_w == ow, small widths) ``get_ur_w_blks_params`` computes the right overflow from the last
# dst column including output_padding, (ow - 1 + l_pad)/stride - (iw - 1), while
# ``get_ow_end`` also drops that negative padding_r: taps of the last stride sector are skipped
# (simulated from the source: stride 2, output_padding 1, no pads, kernel 2 or 4; measured
# 88-182 LSB off exact on such shapes). jit_uni_x8s8s32x_deconvolution computes the overflow
# from the kernel and max(0, padding_r), which is right. src/cpu/x64/
# jit_avx512_core_x8s8s32x_deconvolution.cpp, tag v3.2 (unchanged on oneDNN's main branch).
WRONG_WITH_NEGATIVE_PADDING_R = ("jit_deconvolution:avx512_core",
                                 "jit_deconvolution:avx512_core_vnni")


# oneDNN 3.2's int8 depthwise convolution on AVX2 / SSE4.1 (jit_uni_int8:avx2 and :sse41, the
# jit_uni_x8s8s32x depthwise kernel: 8 / 4 channels a block) applies a binary post-op wrong
# when the channel count is not a multiple of the block: measured 39-75 LSB off exact QDQ with
# C = 2, 4, 5, 6, 7, 10, 12, 20 on avx2 and 2, 6, 7, 10 on sse41 (found by tests/fuzz, seed
# 727: a depthwise conv + a per-channel Add). A per-tensor operand too — the one-element
# divisor of every ONNX-form store: 118-128 LSB at 12 and 36 channels against ref:any, 3x3,
# strides 1 and 2, binary div / mul / add (measured on the kernel alone). Eltwise post-ops,
# grouped and regular convs on the same kernels are exact. The next in line is then sse41
# (C % 4 = 0) or the exact ref:any.
WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY = {"jit_uni_int8:avx2": 8, "jit_uni_int8:sse41": 4}


def depthwise_binary_block() -> int:
    """The channel block of the int8 depthwise kernel oneDNN picks on this CPU when it is one
    that applies binary post-ops wrong on a channel tail (WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY),
    else 0 (passes/distribute_concat.py reads it)."""
    return _depthwise_binary_block(effective_cpu_isa())


@functools.cache
def _depthwise_binary_block(isa: object) -> int:
    del isa  # the cache key: oneDNN's dispatch depends on it
    try:
        pd = convolution(channels_last((1, 8, 8, 8), DataType.u8),
                         any_md((8, 1, 1, 3, 3), DataType.s8),
                         channels_last((1, 8, 8, 8), DataType.u8),
                         padding_l=(1, 1), padding_r=(1, 1))
    except DnnlError:
        return 0
    return WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY.get(pd.impl_name, 0)


def wrong_for(impl: str, kind: str, geometry: dict[str, Sequence[int]], *,
              depthwise_binary: int = 0) -> str | None:
    """Why oneDNN's ``impl`` computes this (de)convolution wrong, or None.
    ``depthwise_binary``: the channel count of a depthwise conv with a binary (or prelu)
    post-op, per channel or per tensor, else 0."""
    if (kind == "deconvolution" and impl in WRONG_WITH_NEGATIVE_PADDING_R
            and any(p < 0 for p in geometry["padding_r"])):
        return "skips taps next to output_padding (oneDNN 3.2, see WRONG_WITH_NEGATIVE_PADDING_R)"
    block = WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY.get(impl, 0)
    if kind == "convolution" and block and depthwise_binary % block:
        return ("applies a binary post-op wrong on a depthwise conv whose channels are not a "
                f"multiple of {block} (oneDNN 3.2, see WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY)")
    return None


def skip_wrong_impls(pd: PrimitiveDesc, kind: str, geometry: dict[str, Sequence[int]], *,
                     depthwise_binary: int = 0) -> PrimitiveDesc:
    """``pd`` advanced past the implementations known to compute this shape wrong."""
    while (why := wrong_for(pd.impl_name, kind, geometry,
                            depthwise_binary=depthwise_binary)) is not None:
        log.info("%s on %s refused: %s", kind, pd.impl_name, why)
        if not pd.next_impl():
            raise UnsupportedModelError(f"oneDNN's only {kind} for this shape {why}")
    return pd


SMALL_MACS = 2_000_000  # multiply-adds


def avoid_amx_when_small(pd: PrimitiveDesc, remake: Callable[[], PrimitiveDesc], macs: int,
                         kind: str = "convolution",
                         geometry: dict[str, Sequence[int]] | None = None, *,
                         depthwise_binary: int = 0) -> PrimitiveDesc:
    """Below SMALL_MACS multiply-adds take the first non-AMX implementation for the same
    src/dst layouts (both accumulate exactly in int32). Measured, 2 threads: MobileNetV2's
    0.3-1.6 M-MAC 1x1 convs (src zero point → jit_1x1:avx512_core_amx) ran 2-3 us faster each
    on brgconv_1x1:avx512_core_vnni inside the model; alone, at 3.2 M AMX was 1.3x faster."""
    if "amx" not in pd.impl_name or macs >= SMALL_MACS:
        return pd
    def skip(name: str) -> bool:
        return "amx" in name or (geometry is not None and wrong_for(
            name, kind, geometry, depthwise_binary=depthwise_binary) is not None)

    alt = _alternative(pd, remake, skip, lambda name: is_slow(name, kind))
    if alt is None:
        return pd
    log.info("%s instead of %s (%d MACs)", alt.impl_name, pd.impl_name, macs)
    return alt


def _alternative(pd: PrimitiveDesc, remake: Callable[[], PrimitiveDesc],
                 skip: Callable[[str], bool], refuse: Callable[[str], bool]
                 ) -> PrimitiveDesc | None:
    """The first implementation after ``pd``'s own (on a fresh descriptor from ``remake``)
    whose name ``skip`` passes over, for the same src/dst layouts, or None when there is none
    or the first one not skipped has other layouts or is ``refuse``d."""
    try:
        alt = remake()
    except DnnlError:
        return None
    while alt.next_impl():
        if skip(alt.impl_name):
            continue
        if alt.src_md != pd.src_md or alt.dst_md != pd.dst_md or refuse(alt.impl_name):
            return None
        return alt
    return None


BRGCONV_OC_BLOCK = 32  # output channels brgconv:avx512_core_vnni computes at once


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor id from /proc/cpuinfo ("AuthenticAMD", "GenuineIntel"; "" unknown)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return ""
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return ""


def prefer_direct_int8(pd: PrimitiveDesc, remake: Callable[[], PrimitiveDesc],
                       kernel: Sequence[int], channels: int,
                       geometry: dict[str, Sequence[int]]) -> PrimitiveDesc:
    """For a spatial int8 convolution (a kernel dim above 1, one group) with fewer output
    channels than BRGCONV_OC_BLOCK, on an AMD CPU, oneDNN's direct
    ``jit_int8:avx512_core_vnni`` kernel instead of the ``brgconv:avx512_core_vnni`` it lists
    first, for the same src/dst layouts (both sum u8·s8 exactly in int32 and apply the same
    post-ops). Measured alone, 2 threads, a Zen 4 EPYC: with 8-24 output channels jit_int8 is
    5-22 % faster (PP-OCRv4 det's 96 → 24, 3x3 on 120 x 160: 571 against 508 µs; 24 → 24: 167
    against 137; 32 → 16: 150 against 127). Above that the two part ways: alone jit_int8 was
    still 1-9 % faster at 40-120 channels, but inside SelecSLS-42B its 72-304-channel convs ran
    4-18 % slower (the model 1.035x), so they keep brgconv. Not for 1x1 (24 → 96 on 120 x 160:
    jit_int8 481 against brgconv_1x1's 79 µs), nor where brgconv runs on AMX; on Intel CPUs
    (not measured) oneDNN's order stays."""
    if (pd.impl_name != "brgconv:avx512_core_vnni" or channels >= BRGCONV_OC_BLOCK
            or all(k == 1 for k in kernel) or cpu_vendor() != "AuthenticAMD"):
        return pd
    alt = _alternative(pd, remake, lambda name: name != "jit_int8:avx512_core_vnni",
                       lambda name: wrong_for(name, "convolution", geometry) is not None)
    if alt is None:
        return pd
    log.info("%s instead of %s (%d output channels)", alt.impl_name, pd.impl_name, channels)
    return alt


def probe_conv(ctx: LowerContext, node: Node, port: int, dtype: DataType) -> MemoryDesc | None:
    """The src layout a (de)convolution picks for itself: where its producer should write."""
    if port != 0:
        return None
    key = (node.name, dtype)
    if key not in ctx.probe_cache:
        w = ctx.const(node.inputs[1])
        found = None
        if w is not None:
            wtype = DataType.s8 if dtype in (DataType.u8, DataType.s8) else DataType.f32
            deconv = node.op is Op.CONV_TRANSPOSE
            wshape = conv_weights(np.empty(w.shape, np.int8), node.attrs.group, deconv).shape
            ytype = dnnl_type(ctx.info(node.outputs[0]).dtype)
            make = deconvolution if deconv else convolution
            try:
                pd = make(any_md(ctx.info(node.inputs[0]).shape, dtype), any_md(wshape, wtype),
                          any_md(ctx.info(node.outputs[0]).shape, ytype),
                          **conv_geometry(node))  # type: ignore[arg-type]
                found = pd.src_md
            except DnnlError:
                found = None
        ctx.probe_cache[key] = found
    return ctx.probe_cache[key]


# Most groups a grouped convolution is densified for (its multiply-adds grow by that factor).
MAX_DENSE_GROUPS = 16


def _dense_if_faster(xinfo: TensorInfo, yinfo: TensorInfo, w: np.ndarray,
                     geometry: dict[str, Sequence[int]]) -> np.ndarray | None:
    """Block-diagonal dense weights [O, I, k…] for grouped weights [G, O/G, I/G, k…] when oneDNN
    has only a reference kernel for the grouped convolution and a fast one for the dense:
    on AVX2 a ShuffleNet v1 1x1 group convolution with 8 → 2 channels per group runs on ref:any
    (6.9 ms of an 8.1 ms run, measured), and G times its multiply-adds on jit take
    microseconds. Exact: the added weights are zeros."""
    groups, og, ig = w.shape[:3]
    dense_shape = (groups * og, groups * ig, *w.shape[3:])
    try:
        if not _slow_conv(xinfo, xinfo.shape, w.shape, yinfo, geometry) or _slow_conv(
                xinfo, xinfo.shape, dense_shape, yinfo, geometry):
            return None
    except DnnlError:
        return None
    dense = np.zeros(dense_shape, w.dtype)
    for i in range(groups):
        dense[i * og:(i + 1) * og, i * ig:(i + 1) * ig] = w[i]
    return dense


def _depthwise_if_faster(xinfo: TensorInfo, yinfo: TensorInfo, w: np.ndarray,
                         geometry: dict[str, Sequence[int]]) -> bool:
    """Whether a grouped convolution of one input and M > 1 output channels a group (grouped
    weights [G, M, 1, k…]: a depthwise convolution with a channel multiplier, as in FastViT's
    downsampling and TensorFlow's ``depth_multiplier``) runs faster as the depthwise
    convolution of G·M groups over its source with every channel repeated M times: true
    wherever oneDNN has a fast kernel for that depthwise one. oneDNN 3.2's depthwise kernels
    take one input and one output channel a group, so the grouped one runs on a general
    kernel: ref:any in int8 on AVX2 (7.8 ms for 48 → 96 channels, 7x7, stride 2, 56x56), a
    GEMM in f32, brgconv with AVX-512 VNNI. The depthwise one and the repeating copy, in a
    one-layer model, 2 threads, measured on a 2-core AMD EPYC: 0.28 ms on AVX2, and with
    AVX-512 VNNI 0.15 against brgconv's 0.34 ms (64 → 128, 3x3, stride 2, 28x28: 0.055 against
    0.087; 16 → 48, 3x3, 56x56: 0.10 against 0.17, and on AVX2 0.22 against 0.28 for the
    block-diagonal dense form). Exact: output channel g·M + r multiplies the same source
    channel g by the same weights."""
    groups, m = w.shape[:2]
    wide = (xinfo.shape[0], groups * m, *xinfo.shape[2:])
    try:
        return not _slow_conv(xinfo, wide, (groups * m, 1, 1, *w.shape[3:]), yinfo, geometry)
    except DnnlError:
        return False


def _slow_conv(xinfo: TensorInfo, src: Sequence[int], wshape: tuple[int, ...],
               yinfo: TensorInfo, geometry: dict[str, Sequence[int]]) -> bool:
    """Whether oneDNN runs a convolution of ``xinfo``'s type over a ``src``-shaped source
    with logical weights ``wshape`` only on a slow implementation (layouts any); raises
    DnnlError when it has none."""
    wtype = DataType.s8 if xinfo.dtype.is_integer else DataType.f32
    pd = convolution(any_md(src, dnnl_type(xinfo.dtype)), any_md(wshape, wtype),
                     any_md(yinfo.shape, DataType.f32), **geometry)
    return is_slow(pd.impl_name, "convolution")


def repeated_channels(ctx: LowerContext, value: str, reps: int) -> tuple[str, TensorInfo]:
    """``value`` ([N, C, …]) with each channel repeated ``reps`` times in a row (channel
    c·reps + r is channel c), channels-last, and its tensor info: one reorder from a view of
    ``value`` that strides 0 over the repeats (oneDNN's jit:uni reorder takes it), shared by
    every reader."""
    info = ctx.info(value)
    shape = (info.shape[0], info.shape[1] * reps, *info.shape[2:])
    wide = replace(info, shape=shape)
    name = f"{value}@repeat{reps}"
    if name in ctx.home:
        return name, wide
    src = ctx.strided_home(value)
    md = ctx.slots[src].md
    dims = (shape[0], info.shape[1], reps, *shape[2:])
    copy = ctx.temp(name, channels_last(shape, md.dtype))
    out = ctx.slots[copy].md.strides
    view = ctx.temp(f"{name}_view", MemoryDesc.from_strides(
        dims, md.dtype, (md.strides[0], md.strides[1], 0, *md.strides[2:])), alias=src)
    into = ctx.temp(f"{name}_into", MemoryDesc.from_strides(
        dims, md.dtype, (out[0], reps * out[1], out[1], *out[2:])), alias=copy)
    ctx.add_reorder(view, into, role="op",
                    note=f"'{value}' with each channel repeated {reps} times (a depthwise "
                         "convolution with a channel multiplier)")
    ctx.home[name] = copy
    return name, wide


def lower_conv(ctx: LowerContext, node: Node) -> None:
    deconv = node.op is Op.CONV_TRANSPOSE
    attrs: ConvAttrs | ConvTransposeAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    xinfo, yinfo = ctx.info(x), ctx.info(y)
    g = attrs.group
    w = conv_weights(ctx.need_const(node, 1, "the weights"), g, deconv)
    integer = xinfo.dtype.is_integer
    if integer and node.fused is None:
        raise UnsupportedModelError(f"node {node}: integer {node.op.value} without a fused "
                                    "output stage (the passes left it unquantized)")
    geometry = conv_geometry(node)
    if deconv and integer:
        w, geometry = cover_every_output(w, geometry)
    if (not deconv and g > 1 and w.shape[1] > 1 and w.shape[2] == 1
            and _depthwise_if_faster(xinfo, yinfo, w, geometry)):
        reps = w.shape[1]
        src, wide = repeated_channels(ctx, x, reps)
        first = _lower_over(ctx, node, src, wide, w.reshape(g * reps, 1, 1, *w.shape[3:]),
                            g * reps, geometry)
        _note_since(ctx, node, first, f"{g} groups of {reps} output channels as a depthwise "
                    f"convolution over the source's channels repeated {reps} times: oneDNN "
                    "has no fast kernel for the grouped one")
        return
    windows = (conv_windows.wanted(xinfo, yinfo, w, g, geometry)
               if not deconv and ctx.options.conv_windows else None)
    fold = (fold_stride.wanted(xinfo, yinfo, w, g, geometry)
            if not deconv and ctx.options.fold_stride else None)
    if fold is not None and windows is not None and fold.zero_taps:
        fold = None  # the windows' copy measured faster than a folded kernel of zero taps
    folded = fold_stride.folded_source(ctx, x, fold) if fold is not None else None
    if fold is not None and folded is not None:
        src, wide = folded
        folded_geometry = fold.geometry(len(geometry["strides"]))
        ones = folded_geometry["strides"]
        first = _lower_over(ctx, node, src, wide, fold.weights(w), 1, folded_geometry,
                            attrs=replace(attrs, kernel_shape=(*ones[1:], fold.taps),
                                          strides=ones, dilations=ones,
                                          pads=(*folded_geometry["padding_l"],
                                                *folded_geometry["padding_r"])))
        _note_since(ctx, node, first, f"stride {fold.stride} folded into the channels: "
                    f"{xinfo.shape[1]} → {wide.shape[1]} input channels, {w.shape[-1]} → "
                    f"{fold.taps} taps, stride 1, over the same bytes (oneDNN sums 4 input "
                    "channels a step)")
        return
    if windows is not None:
        src, wide = conv_windows.windows_source(ctx, x, windows)
        n = len(windows.kernel)
        ones, zeros = (1,) * n, (0,) * n
        first = _lower_over(ctx, node, src, wide, w.reshape(w.shape[0], -1, *ones), 1,
                            {"strides": ones, "padding_l": zeros, "padding_r": zeros,
                             "dilation": zeros},
                            attrs=replace(attrs, kernel_shape=ones, strides=ones,
                                          pads=zeros * 2, dilations=ones))
        _note_since(ctx, node, first, f"a 1x1 convolution over its {windows.blocks}-block "
                    f"copy of the source's windows: oneDNN's kernels for {xinfo.shape[1]} "
                    "input channel(s) are slow")
        return
    padded = (padded_depthwise.wanted(ctx, node, xinfo, yinfo, w, g, geometry)
              if integer and not deconv else None)
    if padded is not None:
        restore = ctx.checkpoint()
        src, wide = padded_depthwise.padded_source(ctx, x, padded)
        n = len(geometry["padding_l"])
        meta = {k: v for k, v in node.meta.items() if k != "composed_multiply"}
        first = _lower_over(ctx, node, src, wide, w, g,
                            {**geometry, "padding_l": (0,) * n, "padding_r": (0,) * n},
                            attrs=replace(attrs, pads=(0,) * (2 * n)), meta=meta,
                            fused=replace(node.fused, src_zero_point=0), padded=padded)
        impl = next(k.impl for k in reversed(ctx.kernels) if k.info.node == node.name)
        if impl.startswith("brdgmm"):
            _note_since(ctx, node, first, f"over its source padded explicitly with the zero "
                        f"level {padded.level} (u8): oneDNN's brdgmm depthwise kernel takes no "
                        "zero point and no s8 source; the zero point's sum subtracted before "
                        "the scales")
            return
        log.info("node %s: over a padded source still %s: not padded", node, impl)
        restore()  # its other attributes keep it off brdgmm (a sum post-op: it takes none)
    dense = None
    if not deconv and 1 < g <= MAX_DENSE_GROUPS and w.shape[1] * w.shape[2] > 1:
        dense = _dense_if_faster(xinfo, yinfo, w, geometry)
    if dense is None:
        _lower_conv(ctx, node, w, g, geometry)
        return
    first = len(ctx.kernels)
    _lower_conv(ctx, node, dense, 1, geometry)
    _note_since(ctx, node, first, f"{g} groups as one dense convolution (block-diagonal "
                "weights): oneDNN has only ref:any for the grouped one")


def _lower_over(ctx: LowerContext, node: Node, src: str, wide: TensorInfo, w: np.ndarray,
                g: int, geometry: dict[str, Sequence[int]], *,
                attrs: ConvAttrs | ConvTransposeAttrs | None = None,
                meta: dict[str, object] | None = None, fused: Fused | None = None,
                padded: padded_depthwise.Padded | None = None) -> int:
    """``node`` lowered over another source ``src`` (its tensor info ``wide``: repeated
    channels, a folded stride, windows, a padded copy) with oneDNN's weights ``w`` in ``g``
    groups and ``geometry``; ``attrs``, ``meta``, ``fused``: the node's own unless given. The
    index of its first kernel (for ``_note_since``)."""
    clone = Node(node.name, node.op, node.attrs if attrs is None else attrs,
                 [src, *node.inputs[1:]], list(node.outputs), list(node.origin),
                 node.meta if meta is None else meta, node.fused if fused is None else fused)
    first = len(ctx.kernels)
    _lower_conv(ctx, clone, w, g, geometry, src_info=wide, padded=padded)
    return first


def _note_since(ctx: LowerContext, node: Node, first: int, note: str) -> None:
    """``note`` on ``node``'s kernels added from index ``first`` on."""
    for kernel in ctx.kernels[first:]:
        if kernel.info.node == node.name:
            kernel.info.add_note(note)


def _lower_conv(ctx: LowerContext, node: Node, w: np.ndarray, g: int,
                geometry: dict[str, Sequence[int]], *, src_info: TensorInfo | None = None,
                padded: padded_depthwise.Padded | None = None) -> None:
    """lower_conv once oneDNN's logical weights ``w`` ([G, O/G, I/G, k…] when ``g`` > 1) and
    the geometry are decided; ``src_info``: the source's when it is not a graph value;
    ``padded``: the source is padded_depthwise's (its zero point compensated in post-ops)."""
    deconv = node.op is Op.CONV_TRANSPOSE
    x, y = node.inputs[0], node.outputs[0]
    xinfo, yinfo = src_info or ctx.info(x), ctx.info(y)
    channels = yinfo.shape[1]
    integer = xinfo.dtype.is_integer
    make_pd = deconvolution if deconv else convolution
    kind = "deconvolution" if deconv else "convolution"
    wei_mask = 1 if g == 1 else 3
    bias = None
    if node.fused is None and len(node.inputs) > 2 and node.inputs[2]:
        bias = ctx.need_const(node, 2, "the bias").astype(F32)
    src_zp = src_zero_point(ctx, node) if integer else 0
    if node.fused is not None and node.fused.wei_zero_point:
        raise UnsupportedModelError(f"node {node}: oneDNN convolutions take no weight zero "
                                    "point")
    exact = no_vnni.for_conv(ctx, node, w, xinfo.dtype, g) if integer else None
    if exact is not None and exact.shift_src:
        def shift() -> tuple[Node, int]:  # taken only if the implementation needs it
            nonlocal node, x
            node, zp = no_vnni.unsigned_source(ctx, node, src_zp)
            x = node.inputs[0]
            return node, zp

        exact.shift = shift

    def create(built: BuiltAttr, dst_md: MemoryDesc | None, comp: Composed, *,
               weights: np.ndarray | None = None, src_md: MemoryDesc | None = None
               ) -> tuple[PrimitiveDesc, Memory | None]:
        wei, bias_values = w if weights is None else weights, comp.bias
        wtype = DataType.s8 if integer else DataType.f32
        if integer and wei.dtype != np.int8:
            raise UnsupportedModelError(f"node {node}: int8 weights must be s8, got {wei.dtype}")
        bias_md = MemoryDesc.from_tag((channels,), DataType.f32) if bias_values is not None \
            else None
        dst_type = dnnl_type(yinfo.dtype) if dst_md is None else dst_md.dtype
        dst_any = any_md(yinfo.shape, dst_type)
        # dst: the residual's layout (in-place sum) or what the readers want, else any
        wanted = dst_md or ctx.preferred(y, dst_type)
        home = ctx.md_of(x)
        src_any = any_md(xinfo.shape, home.dtype)
        candidates = [(home, wanted or dst_any), (src_any, wanted or dst_any),
                      (home, dst_any), (src_any, dst_any),
                      (channels_last(xinfo.shape, home.dtype), dst_any)]
        if src_md is not None:  # another source (no_vnni: the even input channels)
            candidates = [(src_md, wanted or dst_any), (src_md, dst_any)]

        dw_binary = channels if (g > 1 and g == xinfo.shape[1] == channels and any(
            n.startswith(("binary", "prelu")) for n in built.names)) else 0

        def make(c: tuple[MemoryDesc, MemoryDesc]) -> PrimitiveDesc:
            pd = make_pd(c[0], any_md(wei.shape, wtype), c[1], bias=bias_md, attr=built.attr,
                         **geometry)
            return skip_wrong_impls(pd, kind, geometry, depthwise_binary=dw_binary)

        pd = ctx.try_layouts(kind, make, candidates)
        if integer:
            outer = xinfo.shape if deconv else yinfo.shape  # wei.size = C·(C'/G)·prod(K)
            macs = math.prod(outer[:1] + outer[2:]) * wei.size
            pd = avoid_amx_when_small(pd, lambda: make((pd.src_md, pd.dst_md)), macs, kind,
                                      geometry, depthwise_binary=dw_binary)
            if not deconv and g == 1 and ctx.options.direct_int8:
                pd = prefer_direct_int8(pd, lambda: make((pd.src_md, pd.dst_md)),
                                        wei.shape[2:], channels, geometry)
        return pd, ctx.weights(wei.astype(np.int8 if integer else F32), pd.weights_md)

    if integer and ctx.options.mode == "unfused":
        unfused.lower_compute(ctx, node, channel_axis=1, create=create, src_zp=src_zp,
                              wei_zp=0, wei_mask=wei_mask, exact=exact)
        return
    composed = composed_for(ctx, node, channels, yinfo.dtype)
    if padded is not None:
        composed = padded_depthwise.compensated(composed, w, padded)
    if not integer:
        axes = (0, 1) if g > 1 else (0,)
        w = scale_weights(w.astype(F32), composed.wei_scales, axes)
        bias = composed.bias if composed.bias is not None else bias
        composed = replace(composed, wei_scales=np.ones(1, F32), bias=bias)
    emit(ctx, node, kind, composed, channel_axis=1, wei_mask=wei_mask, src_zp=src_zp,
         wei_zp=0, scales=integer, create=create, exact=exact)


def s32_zero_point(value: str) -> str:
    """The name under which a run-time zero point ``value`` is homed as one s32 element."""
    return f"{value}@s32"


def src_zero_point(ctx: LowerContext, node: Node) -> SrcZeroPoint:
    """The src zero point of an int8 compute node: its constant, or (dynamic quantization,
    ``Fused.src_zero_point_port``) the run-time u8 scalar as one s32 element, oneDNN's
    zero-point type: one reorder, shared by every reader."""
    fused = node.fused
    if fused is None:
        return 0
    if fused.src_zero_point_port is None:
        return fused.src_zero_point
    value = node.inputs[fused.src_zero_point_port]
    name = s32_zero_point(value)
    if name not in ctx.home:  # a DynamicQuantizeLinear's params kernel writes it (lower_dynamic)
        home = ctx.home_slot(value)
        one = plain_md((1,), DataType.u8)
        if not same_bytes(ctx.slots[home].md, one):
            raise UnsupportedModelError(f"node {node}: run-time src zero point '{value}' is "
                                        f"not one u8 element")
        src = ctx.temp(f"{value}@u8", one, alias=home)
        slot = ctx.temp(name, plain_md((1,), DataType.s32))
        ctx.add_reorder(src, slot, role="op", note=f"run-time src zero point '{value}' as s32")
        ctx.home[name] = slot
    return RuntimeZeroPoint(ctx.home[name])


def _store_in_post_ops(composed: Composed) -> Composed:
    """``composed`` with its int8 store's scale and zero point as trailing post-ops
    (attrs.store_post_ops: ``f32(f32(x·f32(1/s)) + zp)``, then the store's rint and
    saturation): the same values, for a kernel that takes no dst zero point — oneDNN 3.2's
    ``brdgmm_dw`` depthwise convolution (avx512_core_vnni), which otherwise falls to
    ``jit_int8`` (quantize_static's activations before a Swish or HardSwish, or without an
    activation, keep a zero point)."""
    return replace(composed, post_ops=[*composed.post_ops, *store_post_ops(composed)],
                   dst_scale=None, dst_zero_point=0, form=composed.rounding())


def emit(ctx: LowerContext, node: Node, kind: str, composed: Composed, *, channel_axis: int,
         wei_mask: int, src_zp: SrcZeroPoint, wei_zp: int, scales: bool,
         create: Create,
         weights_slot: Callable[[PrimitiveDesc], str] | None = None,
         exact: no_vnni.Exactness | None = None) -> None:
    """Create the primitive with the composed attributes, place dst, add the kernel;
    ``exact``: if the implementation oneDNN picks is not exact, the s8 src shifted and first
    the low half of split weights (no_vnni.py)."""
    x, y = node.inputs[0], node.outputs[0]
    yinfo = ctx.info(y)
    dst_type = dnnl_type(yinfo.dtype)
    ndims = len(yinfo.shape)

    def residual_type(port: int) -> DataType:
        return dnnl_type(ctx.info(node.inputs[port]).dtype)

    def residual_f32(port: int, scale: float, zp: int) -> tuple[str, MemoryDesc]:
        # a full-size operand channels-last, as the int8 convolutions write their dst: a
        # plain one (a graph input) sends them to ref:any (measured, AVX2)
        info = ctx.info(node.inputs[port])
        layout = (channels_last(info.shape, DataType.f32)
                  if channel_axis == 1 and len(info.shape) > 2 and info.shape == yinfo.shape
                  else None)
        return unfused.dequantized(ctx, node.inputs[port], scale, zp, layout)

    def tensor_slot(port: int) -> tuple[str, MemoryDesc]:
        value = node.inputs[port]
        info = ctx.info(value)
        if ctx.const(value) is None and len(info.shape) < ndims:
            return unfused.dequantized(ctx, ctx.ranked(value, ndims), 1.0, 0)
        if (ctx.const(value) is not None and info.shape == yinfo.shape and len(info.shape) > 2
                and channel_axis == 1):
            # a full-size constant (move_dequantize's zero-point correction): channels-last,
            # as the int8 kernels write their dst; a plain src1 sends them to ref:any
            return unfused.dequantized(ctx, value, 1.0, 0,
                                       channels_last(info.shape, DataType.f32))
        return unfused.dequantized(ctx, value, 1.0, 0)

    if not scales and composed.wei_scales.size == 1 and float(composed.wei_scales[0]) != 1.0:
        composed = _scale_as_post_op(composed)
    binary_form, src_scale = composed, None
    runtime = _runtime_src_scale(ctx, node, composed, channel_axis) if scales else None
    if runtime is not None:
        composed, src_scale = runtime

    sum_binary = False  # set below when the primitive takes the sum only as its first post-op
    single_pixel = (channel_axis == 1 and ndims >= 3
                    and all(d == 1 for i, d in enumerate(yinfo.shape) if i != 1))

    def attributes(comp: Composed, zp: int) -> tuple[BuiltAttr, MemoryDesc | None]:
        built = build_attr(comp, ndims=ndims, channel_axis=channel_axis, wei_mask=wei_mask,
                           dst_type=dst_type, src_zp=src_zp, wei_zp=zp,
                           residual_type=residual_type, residual_f32=residual_f32,
                           scales=scales, tensor_slot=tensor_slot, sum_as_binary=sum_binary,
                           src_scale=src_scale, single_pixel=single_pixel)
        residual_md = None
        if built.sum_port is not None:
            residual_md = md_like(ctx.md_of(node.inputs[built.sum_port]), dst_type)
        return built, residual_md

    def binary_sum_if_slow(built: BuiltAttr, residual_md: MemoryDesc | None, comp: Composed,
                           zp: int) -> tuple[BuiltAttr, MemoryDesc | None,
                                             tuple[PrimitiveDesc, Memory | None]]:
        """oneDNN's GEMM-based matmul takes the sum only as the first post-op (else ref:any):
        then the residual is a binary add (attrs.py, sum_as_binary) when that is faster."""
        nonlocal sum_binary
        made = create(built, residual_md, comp)
        if built.sum_port is None or not is_slow(made[0].impl_name, kind):
            return built, residual_md, made
        sum_binary = True
        retry, _ = attributes(comp, zp)
        again = create(retry, None, comp)
        if is_slow(again[0].impl_name, kind):
            sum_binary = False
            return built, residual_md, made
        log.info("node %s: residual sum as a binary add (%s)", node, again[0].impl_name)
        return retry, None, again

    built, residual_md = attributes(composed, wei_zp)
    made = None
    multiply = node.meta.get("composed_multiply")
    note = ""
    if isinstance(multiply, Composed) and scales:
        # a binary_div post-op can move a convolution to ref:any (on AVX2: the depthwise
        # jit:uni kernels of PP-LCNet / PP-OCR cls), and on ref:any it costs ~50 % more
        # (shufflenet's grouped convs): there the kernel keeps x·(1/s), within one step of
        # ONNX's division (near-ties only), and inspect's rounding line says so
        made = create(built, residual_md, composed)
        if is_slow(made[0].impl_name, kind):
            alt_built, alt_md = attributes(multiply, wei_zp)
            alt = create(alt_built, alt_md, multiply)
            log.info("node %s: binary_div on %s; x·(1/s) on %s", node, made[0].impl_name,
                     alt[0].impl_name)
            note = (f"x·(1/s), not x/s: binary_div would run on {made[0].impl_name}"
                    + ("" if alt[0].impl_name == made[0].impl_name else
                       f" ({alt[0].impl_name} without it)"))
            composed, built, residual_md, made = multiply, alt_built, alt_md, alt
    if built.sum_port is not None and not isinstance(composed.post_ops[0], Sum):
        # decided before the exactness of the implementation is
        built, residual_md, made = binary_sum_if_slow(built, residual_md, composed, wei_zp)
    if kind == "convolution" and composed.dst_zero_point and not src_zp:
        # oneDNN's brdgmm depthwise kernel takes no zero point: where the dst zero point
        # sent a convolution to jit_int8 (the depthwise one with AVX-512 VNNI), try the
        # store's as post-ops
        made = made or create(built, residual_md, composed)
        if made[0].impl_name.startswith("jit_int8"):
            stored = _store_in_post_ops(composed)
            alt_built, alt_md = attributes(stored, wei_zp)
            try:
                alt = create(alt_built, alt_md, stored)
            except DnnlError:
                alt = made
            if alt[0].impl_name.startswith("brdgmm"):
                log.info("node %s: dst zero point as a post-op, %s instead of %s", node,
                         alt[0].impl_name, made[0].impl_name)
                note = (f"dst zero point as a post-op: {made[0].impl_name} with it as an "
                        "attribute")
                composed, built, residual_md, made = stored, alt_built, alt_md, alt
    if exact is not None:  # the implementation oneDNN picks decides (no_vnni.py)
        made = made or create(built, residual_md, composed)
        if not exact.needed(made[0].impl_name):
            exact = None
        elif exact.shift_src:
            node, src_zp = exact.shift_source()
            x = node.inputs[0]
            built, residual_md = attributes(composed, wei_zp)
            made = None
    if exact is not None and exact.splits:
        if src_scale is not None:  # the halves need the scale product as an operand (no_vnni)
            composed, src_scale = binary_form, None
            built, residual_md = attributes(composed, wei_zp)
            made = None  # made with the run-time src scale: stale should nothing be split

        def unsplit() -> PrimitiveDesc:
            return create(built, residual_md, composed)[0]

        def main_pd(main: Composed, weights: np.ndarray, zp: int = wei_zp) -> PrimitiveDesc:
            # as made below: a residual sum's dst is the residual's layout
            return create(*attributes(main, zp), main, weights=weights)[0]

        def main_is_slow(main: Composed) -> bool:
            assert exact is not None and exact.halves is not None
            zh = no_vnni.split_zero_point(wei_zp)[0]
            return is_slow(main_pd(main, exact.halves[0], zh).impl_name, kind)

        if exact.lower_with_binary(ctx, node, composed, create=create,
                                   channel_axis=channel_axis, wei_mask=wei_mask,
                                   src_zp=src_zp, unsplit=unsplit, main_is_slow=main_is_slow,
                                   tensor_slot=tensor_slot):
            return
        composed, create, weights_slot, wei_zp = exact.apply(
            ctx, node, composed, create=create, weights_slot=weights_slot,
            channel_axis=channel_axis, wei_mask=wei_mask, src_zp=src_zp, wei_zp=wei_zp,
            unsplit=unsplit, main_pd=main_pd)
        if exact.splits:  # the low half's binary add now comes before a sum
            built, residual_md = attributes(composed, wei_zp)
            built, residual_md, made = binary_sum_if_slow(built, residual_md, composed, wei_zp)
    pd, wmem = made if made is not None else create(built, residual_md, composed)
    if exact is not None:
        exact.check_main(node, pd)
    args = {int(Arg.SRC): ctx.source(x, pd.src_md)}
    fixed = dict(built.fixed)
    if weights_slot is not None:
        args[int(Arg.WEIGHTS)] = weights_slot(pd)
    else:
        assert wmem is not None
        fixed[int(Arg.WEIGHTS)] = wmem
    if composed.bias is not None:
        bias_md = pd.arg_md(Arg.BIAS)
        assert bias_md is not None
        values = np.ascontiguousarray(composed.bias.astype(F32).reshape(bias_md.dims))
        fixed[int(Arg.BIAS)] = const_memory(values)
    args.update(built.slot_args)
    dst_md = pd.dst_md
    assert dst_md is not None
    reads = [s for a, s in args.items()]
    if built.sum_port is not None:
        args[int(Arg.DST)] = sum_dst(ctx, node, node.inputs[built.sum_port], dst_md)
    else:
        args[int(Arg.DST)] = ctx.define(y, dst_md)
    info = ctx.info_for(node, optimizations=list(composed.fired), post_ops=built.names,
                        post_op_details=built.details, rounding=composed.rounding(), note=note)
    kernel = ctx.add_primitive(node.name, pd, args, fixed, info=info, reads=reads)
    if exact is not None:
        exact.record(ctx, kernel)


def _runtime_src_scale(ctx: LowerContext, node: Node, composed: Composed,
                       channel_axis: int) -> tuple[Composed, str] | None:
    """Dynamic quantization's ``f32(acc)·f32(s_x·s_w)`` (a leading binary_mul by the run-time
    product of a scalar ``s_x`` and a constant ``s_w``, per tensor or per channel) as oneDNN's
    run-time src scale and constant weight scales: oneDNN multiplies ``s_x·s_w[c]`` in float32
    first and the accumulator by that, the same two roundings, and a constant add that
    followed (the bias) becomes the primitive's bias (added after the scale, as the post-op
    was). No binary post-op is left, which on a 1x1 image would run on ``ref:any``. Returns
    (the attributes without the multiply, the slot of ``s_x`` as one f32) or None."""
    ops = composed.post_ops
    if (not ops or not isinstance(ops[0], TensorBinary) or ops[0].alg != "mul"
            or composed.bias is not None or np.any(composed.wei_scales != 1)):
        return None
    found = scale_product(ctx.graph, node.inputs[ops[0].port], ctx.const)
    if found is None:
        return None
    scalar, weight = found
    out = ctx.info(node.outputs[0])
    dims = (1,) * (len(out.shape) - weight.ndim) + weight.shape
    channels = out.shape[channel_axis]
    if len(dims) != len(out.shape) or any(
            d != 1 and (i != channel_axis or d != channels) for i, d in enumerate(dims)):
        return None
    rest = list(ops[1:])
    bias = None
    if rest and isinstance(rest[0], Binary) and rest[0].alg == "add" \
            and rest[0].values.size in (1, channels):
        bias = np.broadcast_to(np.asarray(rest[0].values, F32).ravel(), (channels,)).copy()
        rest = rest[1:]
    elif rest and isinstance(rest[0], Eltwise) and rest[0].alg == "linear" \
            and rest[0].alpha == 1.0:
        bias, rest = np.full(channels, rest[0].beta, F32), rest[1:]
    scales = np.asarray(weight, F32).ravel()
    view = ctx.ranked(scalar, 1)
    return replace(composed, wei_scales=scales, bias=bias, post_ops=rest), ctx.home_slot(view)


def _scale_as_post_op(composed: Composed) -> Composed:
    """Float primitive with runtime weights: acc·s + b as post-ops (s first, then the bias)."""
    s = float(composed.wei_scales[0])
    posts = [Eltwise("linear", s, 0.0)]
    bias = composed.bias
    if bias is not None and bias.size == 1:
        posts = [Eltwise("linear", s, float(bias[0]))]
        bias = None
    elif bias is not None:
        posts.append(Binary("add", bias))
        bias = None
    return replace(composed, wei_scales=np.ones(1, F32), bias=bias,
                   post_ops=posts + list(composed.post_ops))


def sum_dst(ctx: LowerContext, node: Node, residual: str, dst_md: MemoryDesc) -> str:
    """The dst slot of a primitive whose sum post-op reads ``residual`` (module docstring)."""
    y = node.outputs[0]
    home = ctx.home_slot(residual)
    want = md_like(dst_md, ctx.slots[home].md.dtype)
    group = set(ctx.group(home))
    read_otherwise = any(v in group for i, v in enumerate(node.inputs)
                         if v != residual or i < 2)
    if (want is not None and ctx.slots[home].md == want and not read_otherwise
            and ctx.may_overwrite(home, node)):
        ctx.in_place_sums += 1
        return ctx.define(y, dst_md, alias=home)
    if want is None:
        raise UnsupportedModelError(f"node {node}: the residual cannot be laid out like the "
                                    f"dst {dst_md.describe()}")
    dst = ctx.define(y, dst_md)
    copy = ctx.temp(f"{residual}@sum", want, alias=dst)
    ctx.add_reorder(home, copy, role="reorder", note=f"residual '{residual}' copied into the "
                    f"dst of '{node.name}' for its sum post-op")
    return dst
