"""Resize → oneDNN resampling where it reads the same input elements as ONNX; numpy otherwise.

oneDNN 3.2 (``cpu/resampling_utils.hpp``; modelled in runtime/onednn/reference.py and checked
against the library for every data type and layout by tests/runtime/test_onednn_resampling.py)
maps output index ``o`` of a spatial dim resized from ``in`` to ``out`` to the float32 source
coordinate

    c = f32(f32(f32(o + 0.5) · in) / out) - 0.5        (the factors argument is not used)

**nearest** copies input element ``roundf(c)`` (halves away from zero): no arithmetic, so the
output equals the reference (runtime/reference/ops_shape.py) exactly — for u8, s8 and f32 —
*iff* that index equals ONNX's along every dim. That is checked here at compile time, index by
index (``nearest_decision``); a Resize whose indices differ anywhere (a non-integer factor)
runs as a few reorders copying runs of its indices (``_copied_runs``), else as a numpy gather,
and `inspect` says where they differ. Precondition of the check: N and C are not resized and the
rank is 3-5 (oneDNN resamples {N, C, 1-3 spatial dims}). Which ONNX modes agree, measured for
every input size 1..64 (Y: all agree; the check decides per node either way):

    coordinate_transformation_mode  nearest_mode         ×2 ×3 ×4 ×0.5
    half_pixel, half_pixel_symmetric round_prefer_floor  Y  Y  Y  -
    half_pixel, half_pixel_symmetric round_prefer_ceil   Y  Y  Y  Y
    pytorch_half_pixel               round_prefer_*      Y  Y  Y  -
    asymmetric                       floor               Y  Y  Y  -     (unet's /up2/Resize)
    asymmetric                       round_prefer_floor  Y  -  -  -
    align_corners                    round_prefer_*      Y  -  -  -
    tf_half_pixel_for_nearest        floor               Y  Y  Y  Y
    (any other pair)                                     -  -  -  (some Y at ×0.5)

Why, for an integer factor k and ``o = k·i + j`` (0 <= j < k): oneDNN's and the half_pixel
family's ``c = i + (j + 0.5)/k - 0.5`` lie strictly inside (i - 0.5, i + 0.5), so any
round-to-nearest gives i = floor(o/k); asymmetric/floor (``floor(i + j/k)``) and
tf_half_pixel_for_nearest/floor (``floor(i + (j + 0.5)/k)``) give i too, while
asymmetric/round_prefer_floor gives i only if every ``j/k <= 0.5`` (k = 2).

**cubic** (bicubic: float32, 2-D or N and C not scaled) has no oneDNN primitive: the reference
kernel runs in numpy (runtime/reference/ops_shape.py ``CubicResize``: one 4-tap pass per axis,
bit-exact with ONNX Runtime's ``ResizeBiCubic`` and about 15x faster than it; CrossViT's
240x240 → 224x224 input resize takes ~1 ms, ONNX Runtime 16 ms).

**linear** is not lowered to oneDNN. resampling_linear weighs ``x[lo]·(1 - w) + x[hi]·w`` axis by
axis with its own rounding, where the reference (ONNX Runtime's float32 formula) multiplies the
product of the axis weights into each corner and adds the corners left to right. Measured on
unet's /up1/Resize (half_pixel ×2, DequantizeLinear s = 0.0183 → Resize → QuantizeLinear with
the same scale; 20 inputs, nchw and nhwc):

- f32 resampling_linear vs the reference: 84.8 % bit-identical, max 3 ulps, max relative
  2.5e-7; after the downstream quantize: max 1 LSB but only 99.57 % identical. The inputs are
  dequantized u8 and the bilinear weights multiples of 1/16, so many values sit on exact
  rounding ties, which ulp-level differences break either way.
- u8 → u8 resampling on the quantized input (same scale and zero point; the exact Σ w·q,
  rounded half to even on store): max 1 LSB, 98.18 % identical.

Both are under the 99.9 % bar, so linear runs bit-exact with the reference, on a row-major
(N, spatial..., C) view of channels-last slots (the producer writes f32 channels-last through
``probe_resize``). The numpy kernel (``LinearKernel``) takes its taps from the reference itself
(``linear_taps``) and evaluates the same float32 operations in the same order — ``weight =
w_last·…·w_first``, ``term = weight·x[corner]``, the corners summed left to right — gathered at
once, with the tables built at compile time. Where onnxruntime's own Resize over that view (its
channels-last bilinear kernel) gives the same bytes on a compile-time probe over the whole
tensor, it runs instead, writing the plan's buffer (``ort_linear``): same formula, about 6x
faster (28x28 → 224x224 on 21 channels, 2 threads: 0.21 against 1.39 ms). It has no
channels-last trilinear kernel and refuses tf_half_pixel_for_nearest, and its
half_pixel_symmetric coordinates round differently at some non-integer factors; those keep the
numpy kernel. When the interpolated axes are not exactly the spatial dims (rank 3, or dims 1-2
of a rank-4 input) the reference implementation itself runs.

Where no quantization follows (every path from the Resize's output reaches graph outputs
through float ops only: a segmentation head's final upsampling), those ulps cannot move an
integer, so the linear Resize runs on oneDNN's resampling_linear (jit) instead, provided it
reads the same inputs with the same weights as ONNX's mode (half_pixel, pytorch_half_pixel; the
interpolation matrices of every spatial dim agree within ``LINEAR_TAP_TOLERANCE``; not
align_corners or asymmetric). Not bit-exact: within a few float32 ulps of the reference
(docs/numerics.md, "Linear Resize"); LRASPP-MobileNetV3's 28x28 → 224x224 output Resize took
2.3 ms in numpy, 48 % of the model's run. The composer option ``linear_resampling`` (off:
always the numpy kernel) decides.

A Resize that changes no size is the input itself (the reference copies it).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.lower import unfused
from qfuse.compiler.lower.attrs import BuiltAttr, as_float_post_ops, build_attr
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.reorder_check import run_once
from qfuse.compiler.lower.layouts import (
    any_md,
    channels_last,
    dense_in_order,
    dim_order,
    dnnl_type,
    memory_order_groups,
    plain_md,
    row_major,
)
from qfuse.ir import DType, Graph, Node, Op
from qfuse.runtime.reference.interpreter import run_node
from qfuse.ir.postops import Composed
from qfuse.ir.ops import ResizeAttrs, ResizeMode
from qfuse.ir.chain import Scale, Shift
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    DnnlError,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    reorder,
    resampling,
)
from qfuse.runtime.onednn.reference import resampling_linear_taps
from qfuse.runtime.reference.ops_island import runner_into
from qfuse.runtime.reference.ops_shape import (
    CubicResize,
    linear_taps,
    nearest_indices,
    onednn_nearest_mismatch,
    whole_factor_enlargement,
)

log = logging.getLogger(__name__)
F32 = np.float32
NEAREST_TYPES = frozenset({DType.U8, DType.S8, DType.F32})
# Copies (one reorder each) up to which a nearest Resize oneDNN's resampling cannot run is
# copied by runs rather than gathered in numpy (``_copied_runs``)
MAX_RUN_COPIES = 8
# The linear kernel's weights are stored broadcast over C (a same-shape multiply is ~5x faster
# than a broadcasting one for small C) up to this size; larger ones broadcast at run time.
BROADCAST_WEIGHTS_BYTES = 4 << 20
LINEAR_ONEDNN_NOTE = ("linear {}: oneDNN's resampling_linear (its taps are ONNX's; no "
                      "quantization follows, so float32 rounding differences of a few ulps "
                      "reach only float outputs; not bit-exact)")
ORT_LINEAR_NOTE = ("linear: onnxruntime's float32 Resize on the (N, spatial..., C) view of "
                   "the channels-last slots, the reference's formula (bytes equal to the "
                   "bit-exact numpy kernel's on a probe at compile time)")
# the single-node model onnxruntime runs (opset 19: half_pixel_symmetric)
ORT_OPSET, ORT_IR_VERSION = 19, 9
LINEAR_NOTE = ("linear: oneDNN's resampling_linear rounds differently from ONNX Runtime's "
               "float32 formula (max 3 ulps; 99.57 % of unet's requantized values identical, "
               "under the 99.9 % bar): bit-exact numpy kernel")

CUBIC_NOTE = ("cubic: oneDNN has no bicubic resampling; numpy kernel, bit-exact with ONNX "
              "Runtime's float32 ResizeBiCubic")

# oneDNN's and ONNX's interpolation weights may differ by float32 rounding only
LINEAR_TAP_TOLERANCE = 1e-6
# ops after which an integer may depend on the float values (a quantization, or an island whose
# ONNX nodes are not looked into)
QUANTIZING = frozenset({Op.QUANTIZE_LINEAR, Op.FAKE_QUANTIZE, Op.DYNAMIC_QUANTIZE_LINEAR,
                        Op.ISLAND, Op.CAST})

How = Literal["alias", "onednn", "onednn_linear", "numpy_cl", "numpy"]


@dataclass(frozen=True)
class ResizeDecision:
    """How a Resize is lowered: the input itself, resampling, the linear kernel, or the
    reference in numpy; ``note`` is what `inspect` shows."""

    how: How
    note: str


def nearest_decision(attrs: ResizeAttrs, shape: tuple[int, ...], dtype: DType) -> ResizeDecision:
    """oneDNN when its source index is ONNX's for every output index of every dim."""
    modes = f"{attrs.coordinate_transformation_mode}/{attrs.nearest_mode}"
    if dtype not in NEAREST_TYPES:
        return ResizeDecision("numpy", f"nearest on {dtype.name}: oneDNN resampling is used "
                                       "for u8, s8 and f32")
    if not 3 <= len(shape) <= 5:
        return ResizeDecision("numpy", f"rank {len(shape)}: oneDNN resamples {{N, C, 1-3 "
                                       f"spatial dims}}")
    mismatch = onednn_nearest_mismatch(attrs, shape)
    if mismatch is not None:
        return ResizeDecision("numpy", mismatch)
    return ResizeDecision("onednn", f"nearest {modes}: oneDNN's source indices are ONNX's")


def resize_decision(ctx: LowerContext, node: Node) -> ResizeDecision:
    """The lowering of ``node`` (module docstring); depends on attributes and types only, so
    the producer's layout probe and the lowering agree."""
    attrs: ResizeAttrs = node.attrs
    info = ctx.info(node.inputs[0])
    if tuple(attrs.sizes) == info.shape:
        return ResizeDecision("alias", "no dim changes size: the input itself")
    if node.fused is not None and attrs.mode is not ResizeMode.NEAREST:
        return ResizeDecision("numpy", "a fused chain")
    if attrs.mode is ResizeMode.NEAREST:
        decision = nearest_decision(attrs, info.shape, info.dtype)
        if node.fused is not None and decision.how == "onednn":
            return ResizeDecision("onednn", decision.note + "; writes the dequantized values "
                                            "(post-ops: - zp, then · s rounded once)")
        return decision
    if attrs.mode is ResizeMode.CUBIC:
        return ResizeDecision("numpy", CUBIC_NOTE)
    rank = len(info.shape)
    if (info.dtype is DType.F32 and 3 <= rank <= 5 and ctx.options.linear_resampling
            and node.fused is None and not _quantized_later(ctx.graph, node.outputs[0])):
        differs = linear_taps_differ(attrs, info.shape)
        if differs is None:
            return ResizeDecision("onednn_linear", LINEAR_ONEDNN_NOTE.format(
                attrs.coordinate_transformation_mode))
        log.debug("%s: %s", node.name, differs)
    if info.dtype is DType.F32 and 3 <= rank <= 5 and tuple(
            linear_taps(attrs, info.shape)) == tuple(range(2, rank)):
        return ResizeDecision("numpy_cl", LINEAR_NOTE)
    return ResizeDecision("numpy", LINEAR_NOTE + " (reference kernel: the interpolated axes "
                                                 "are not the spatial dims)")


def linear_taps_differ(attrs: ResizeAttrs, shape: tuple[int, ...]) -> str | None:
    """None when oneDNN's resampling_linear interpolates every dim as ONNX's linear Resize
    (the same interpolation matrix within LINEAR_TAP_TOLERANCE; N and C not resized), else
    where it does not."""
    taps = linear_taps(attrs, shape)
    for axis, (size, out) in enumerate(zip(shape, attrs.sizes, strict=True)):
        if axis < 2:
            if axis in taps or size != out:
                return f"dim {axis} is resized ({size} → {out}): oneDNN resamples spatial dims"
            continue
        theirs = np.zeros((out, size))
        if axis in taps:
            lo, hi, w_lo, w_hi = taps[axis][:4]
            np.add.at(theirs, (np.arange(out), lo), w_lo)
            np.add.at(theirs, (np.arange(out), hi), w_hi)
        else:
            theirs[np.arange(out), np.arange(out)] = 1.0
        ours = np.zeros((out, size))
        lo, hi, w = resampling_linear_taps(size, out)
        np.add.at(ours, (np.arange(out), lo), 1.0 - w)
        np.add.at(ours, (np.arange(out), hi), w)
        gap = float(np.abs(theirs - ours).max())
        if gap > LINEAR_TAP_TOLERANCE:
            return (f"linear {attrs.coordinate_transformation_mode}, dim {axis} {size} → {out}: "
                    f"oneDNN's interpolation weights differ from ONNX's by up to {gap:.3g}")
    return None


def _quantized_later(graph: Graph, value: str) -> bool:
    """Whether an integer may depend on ``value``: a quantizing op (or an island, or a Cast)
    is reachable from it."""
    todo, seen = [value], {value}
    while todo:
        for reader, _ in graph.consumers(todo.pop()):
            if reader.op in QUANTIZING or reader.fused is not None:
                return True
            for out in reader.outputs:
                if out not in seen:
                    seen.add(out)
                    todo.append(out)
    return False


def lower_resize(ctx: LowerContext, node: Node) -> None:
    decision = resize_decision(ctx, node)
    x, y = node.inputs[0], node.outputs[0]
    if decision.how == "alias":
        ctx.home[y] = ctx.home_slot(x)
    elif decision.how == "onednn":
        # a whole-factor enlargement with its dequantize: one reorder repeating x's elements
        if not (node.fused is not None
                and whole_factor_enlargement(ctx.info(x).shape, ctx.info(y).shape)
                and _copied_runs(ctx, node, decision.note)):
            _lower_nearest(ctx, node, decision.note)
    elif decision.how == "onednn_linear":
        _lower_nearest(ctx, node, decision.note, Alg.resampling_linear)
    elif decision.how == "numpy_cl":
        _lower_linear(ctx, node, decision.note)
    elif node.attrs.mode is ResizeMode.NEAREST:
        if not _copied_runs(ctx, node, decision.note):
            _nearest_gather(ctx, node, decision.note)
    elif node.attrs.mode is ResizeMode.CUBIC:
        _lower_cubic(ctx, node, decision.note)
    else:
        lower_numpy(ctx, node, note=decision.note)


def _lower_cubic(ctx: LowerContext, node: Node, note: str) -> None:
    """The reference's bicubic kernel on row-major slots, its taps computed here, once."""
    x, y = node.inputs[0], node.outputs[0]
    kernel = CubicResize(node.attrs, ctx.info(x).shape)
    ctx.add_numpy(node.name, lambda arrays: [kernel(arrays[0])], [ctx.plain_source(x)],
                  [ctx.define_plain(y)], ctx.info_for(node, note=note))


@dataclass(frozen=True)
class Run:
    """Outputs ``first + a·repeat + b`` (a < count, b < repeat) of one dim of a nearest
    Resize read input ``source + a·step``."""

    first: int
    source: int
    count: int
    repeat: int
    step: int


def nearest_runs(index: np.ndarray) -> list[Run]:
    """``index`` (the input index of each output index along one dim) as runs, greedily
    longest first: each a copy from a view of the input with strides (step, 0)."""
    runs: list[Run] = []
    o, n = 0, len(index)
    while o < n:
        repeat = 1
        while o + repeat < n and index[o + repeat] == index[o]:
            repeat += 1
        step = int(index[o + repeat] - index[o]) if o + repeat < n else 1
        count = 1
        while True:
            start = o + count * repeat
            if (start + repeat > n or np.any(index[start:start + repeat]
                                             != index[o] + count * step)
                    or (start + repeat < n and index[start + repeat] == index[o] + count * step)):
                break
            count += 1
        runs.append(Run(o, int(index[o]), count, repeat, step))
        o += count * repeat
    return runs


def _copied_runs(ctx: LowerContext, node: Node, note: str) -> bool:
    """A nearest Resize as copies: each dim's output indices fall into a few runs
    (``nearest_runs``), and per combination of runs one jit reorder copies a view of x that
    repeats (stride 0) and steps over its elements into y, in x's dim order. A chain that is a
    dequantize with one zero point (passes/fold_resize_dequantize.py) is the reorders' source
    scale and zero point, ``f32(q - zp)·s`` rounded once as the dequantize computes it; a zero
    point is checked once at compile time on every byte value (oneDNN 3.2's reorders drop it
    in some layout changes, compiler/lower/reorder_check.py). Taken for at most
    ``MAX_RUN_COPIES`` copies of a strided x whose N and C are not resized; False (nothing
    added) otherwise, and in the unfused mode with a chain.

    Where: a Resize oneDNN's resampling reads other elements for (a non-integer factor:
    GhostNetV2's gates 3 → 7, a U-Net's 12 → 25), else a numpy gather; and an enlargement by
    whole factors with its dequantize, one run a dim, one reorder (the resampling with the
    dequantize as post-ops took 1.38 ms on PP-OCRv4 det's 96 x 60 x 80 map under AVX2; the
    dequantize on the small map and a float32 resampling 51 + 53 µs; the reorder 60 µs on
    AVX-512)."""
    attrs: ResizeAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    shape, out = ctx.info(x).shape, ctx.info(y).shape
    home = ctx.md_of(x)
    picks = [nearest_indices(attrs, shape, axis) for axis in range(len(shape))]
    found = None
    if node.fused is not None:
        found = _dequantize_params(node.fused.chain)
        if ctx.options.mode == "unfused" or found is None or found[0].size not in (1, shape[1]):
            return False
    if (not 3 <= len(shape) <= 6 or picks[0] is not None or picks[1] is not None
            or not home.is_plain or ctx.info(x).dtype not in NEAREST_TYPES):
        return False
    runs = [nearest_runs(p) if p is not None else [Run(0, 0, n, 1, 1)]
            for p, n in zip(picks[2:], shape[2:], strict=True)]
    if math.prod(len(r) for r in runs) > MAX_RUN_COPIES:
        return False
    dtype = DataType.f32 if found is not None else home.dtype
    dst_md = dense_in_order(home, out, dtype)
    attr, fixed = PrimitiveAttr(), {}
    if found is not None:  # the dequantize: the reorders' source scale and zero point
        scale, zero_point = found
        attr.set_scales_mask(Arg.SRC, 0 if scale.size == 1 else 1 << 1)
        fixed[int(Arg.scales(Arg.SRC))] = Memory.scales(scale)
        if zero_point:
            attr.set_zero_points_mask(Arg.SRC, 0)
            fixed[int(Arg.zero_points(Arg.SRC))] = Memory.zero_points(zero_point)
    try:
        copies = _run_copies(runs, out, home, dst_md, attr, fixed, found)
    except DnnlError:  # a view oneDNN does not describe (steps past the next dim's stride)
        return False
    if copies is None:
        return False
    src = ctx.source(x, home)
    dst = ctx.define(y, dst_md)
    src_size, dst_size = home.numpy_dtype.itemsize, dst_md.numpy_dtype.itemsize
    count = "one reorder" if len(copies) == 1 else f"{len(copies)} reorders"
    dequantize = "" if found is None else (
        f", the dequantize its source {'zero point and ' * bool(found[1])}scale")
    for pd, src_view, dst_view, s_off, d_off in copies:
        reads = ctx.temp(f"{x}@run", src_view, alias=src, offset=s_off * src_size)
        into = ctx.temp(f"{y}@run", dst_view, alias=dst, offset=d_off * dst_size)
        ctx.add_primitive(node.name, pd, {int(Arg.SRC): reads, int(Arg.DST): into}, fixed,
                          info=ctx.info_for(node, note=f"{note}; {count} copying runs of "
                                                       f"repeated elements{dequantize}"))
    return True


def _run_copies(runs: list[list[Run]], out: tuple[int, ...], home: MemoryDesc,
                dst_md: MemoryDesc, attr: PrimitiveAttr, fixed: dict[int, Memory],
                found: tuple[np.ndarray, int] | None
                ) -> list[tuple[PrimitiveDesc, MemoryDesc, MemoryDesc, int, int]] | None:
    """Per combination of runs (one per spatial dim) the reorder and its two views with their
    element offsets; None where one is not a jit reorder or drops the zero point."""
    src_strides, dst_strides = home.strides or (), dst_md.strides or ()
    copies = []
    for combination in itertools.product(*runs):
        dims, s_st, d_st = list(out[:2]), list(src_strides[:2]), list(dst_strides[:2])
        s_off = d_off = 0
        for run, s, d in zip(combination, src_strides[2:], dst_strides[2:], strict=True):
            dims += [run.count, run.repeat]
            s_st += [run.step * s, 0]
            d_st += [run.repeat * d, d]
            s_off += run.source * s
            d_off += run.first * d
        src_view = MemoryDesc.from_strides(dims, home.dtype, s_st)
        dst_view = MemoryDesc.from_strides(dims, dst_md.dtype, d_st)
        pd = reorder(src_view, dst_view, attr=attr)
        if not pd.impl_name.startswith("jit") or (found is not None and found[1] and not
                                                   _repeats_exactly(pd, src_view, dst_view,
                                                                    fixed, *found)):
            return None
        copies.append((pd, src_view, dst_view, s_off, d_off))
    return copies


def _nearest_gather(ctx: LowerContext, node: Node, note: str) -> None:
    """A nearest Resize oneDNN's indices do not match, as one numpy gather over x's own
    layout (a dense one; row-major otherwise): y is laid out in x's dim order, and the
    innermost dims in memory that are not resized (the channels of a channels-last x) form
    rows copied whole, each output row's input row (ONNX's indices per axis,
    ``nearest_indices``) computed at compile time, ``np.take`` of rows at run time. A fused
    chain (the dequantize fold_resize_dequantize gave it) is elementwise, so it runs first on
    the small input (the reference's own evaluation of the node without resizing, on the
    logical view of x's bytes) and the gather picks its results: the same values.
    GhostNetV2/V3's gates, [1, 960, 3, 3] channels-last to 7 x 7 (asymmetric / floor: output
    2 reads input 0, oneDNN's 1): 0.12 ms each in the reference's generic Resize, 46 µs as
    one gather of row-major elements between two reorders, 34 µs (its dequantize
    most of it) as rows of 960 and no reorder."""
    attrs: ResizeAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    shape, out = ctx.info(x).shape, ctx.info(y).shape
    picks = [nearest_indices(attrs, shape, axis) for axis in range(len(shape))]
    home = ctx.md_of(x)
    dense = memory_order_groups(home, []) is not None
    order = dim_order(home.strides if dense and home.strides else row_major(shape))
    kept = 0  # innermost dims in memory order that are not resized: one row
    while kept < len(order) and picks[order[-1 - kept]] is None:
        kept += 1
    outer, inner = order[:len(order) - kept], order[len(order) - kept:]
    row = math.prod(shape[i] for i in inner)
    index = np.ravel_multi_index(np.ix_(*(np.arange(shape[i]) if picks[i] is None else picks[i]
                                          for i in outer)),
                                 [shape[i] for i in outer]).astype(np.intp).ravel()
    dtype = ctx.info(y).dtype
    src_md = home if dense else plain_md(home.dims, home.dtype)
    src = ctx.temp(f"{x}@order", plain_md([shape[i] for i in order], home.dtype),
                   alias=ctx.source(x, src_md))
    dst = ctx.temp(f"{y}@order", plain_md([out[i] for i in order], dnnl_type(dtype)))
    ctx.define(y, dense_in_order(src_md, out, dnnl_type(dtype)), alias=dst)
    same = replace(node.attrs, sizes=tuple(shape), scales=(1.0,) * len(shape))
    small = Node(node.name, node.op, same, list(node.inputs), list(node.outputs),
                 list(node.origin), node.meta, node.fused)
    graph, composed = ctx.graph, "composed" in node.meta
    logical = tuple(np.argsort(order))

    def gather(arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
        values = arrays[0]
        if node.fused:  # on the logical view of x's bytes, back to their order
            values = run_node(small, [values.transpose(logical)], graph, composed=composed)[0]
            values = np.asarray(values, dtype.np).transpose(order)
        rows = np.ascontiguousarray(values, dtype.np).reshape(-1, row)
        np.take(rows, index, axis=0, out=outs[0].reshape(-1, row))

    ctx.add_numpy(node.name, gather,  # type: ignore[arg-type]  (fn(inputs, outputs), into=True)
                  [src], [dst],
                  ctx.info_for(node, note=note + f"; one numpy gather of precomputed rows of "
                                                 f"{row} element{'s' * (row > 1)}"),
                  into=True)


def _lower_nearest(ctx: LowerContext, node: Node, note: str,
                   alg: Alg = Alg.resampling_nearest) -> None:
    """resampling_nearest (or linear, no chain) in the input's own layout (the output in the
    same dim order); a fused chain (the dequantize of passes/fold_resize_dequantize.py) as
    post-ops, or in the unfused mode one primitive per operation after the resampling."""
    x, y = node.inputs[0], node.outputs[0]
    out = ctx.info(y).shape
    chain_apart = node.fused is not None and ctx.options.mode == "unfused"
    # unfused, the chain runs op by op on float32 values, its store writes y's type
    dtype = DataType.f32 if chain_apart else dnnl_type(ctx.info(y).dtype)
    built = _chain_attr(ctx, node) if node.fused is not None else None
    home = ctx.md_of(x)
    own = (home, dense_in_order(home, out, dtype) if home.is_plain else any_md(out, dtype))
    candidates = [own, (plain_md(home.dims, home.dtype), plain_md(out, dtype))]
    attr = built.attr if built is not None else None

    def make(mds: tuple[MemoryDesc, MemoryDesc]) -> PrimitiveDesc:
        return resampling(alg, mds[0], mds[1], attr=attr)

    pd = ctx.try_layouts("resampling", make, candidates)
    src_md, dst_md = pd.src_md, pd.dst_md
    assert src_md is not None and dst_md is not None
    src = ctx.source(x, src_md)
    if chain_apart:
        work = ctx.temp(f"{y}@chain", dst_md)
        ctx.add_primitive(node.name, pd, {int(Arg.SRC): src, int(Arg.DST): work},
                          info=ctx.info_for(node, note=note))
        unfused.finish_chain(ctx, node, work, channel_axis=1)
        return
    dst = ctx.define(y, dst_md)
    fixed = built.fixed if built is not None else {}
    info = ctx.info_for(node, note=note) if built is None else ctx.info_for(
        node, note=note, post_ops=built.names, post_op_details=built.details)
    ctx.add_primitive(node.name, pd, {int(Arg.SRC): src, int(Arg.DST): dst}, fixed, info=info)


def _dequantize_params(chain: Sequence[object]) -> tuple[np.ndarray, int] | None:
    """(scale as float32, zero point) of a chain that is exactly a dequantize with one zero
    point (``Shift(-zp)``, then an exact ``Scale``); None for any other chain."""
    if (len(chain) != 2 or not isinstance(chain[0], Shift) or not isinstance(chain[1], Scale)
            or not chain[1].exact or len(set(chain[0].values)) != 1):
        return None
    shift = float(chain[0].values[0])
    if shift != round(shift):
        return None
    return np.asarray(chain[1].values, F32), -int(shift)


def _repeats_exactly(pd: PrimitiveDesc, src_view: MemoryDesc, dst_view: MemoryDesc,
                     fixed: dict[int, Memory], scale: np.ndarray, zero_point: int) -> bool:
    """Run the repeating reorder once on a source holding every byte value and compare its
    output with ``f32(q - zp)·s`` computed by numpy, bit for bit."""
    source = np.resize(np.arange(256, dtype=np.uint8), src_view.size)
    target = np.zeros(dst_view.size, np.uint8)
    run_once(pd, {int(Arg.SRC): Memory(src_view, source),
                  int(Arg.DST): Memory(dst_view, target), **fixed})
    itemsize = np.dtype(src_view.numpy_dtype).itemsize
    q = np.lib.stride_tricks.as_strided(
        source.view(src_view.numpy_dtype), src_view.dims,
        [st * itemsize for st in (src_view.strides or ())])
    got = np.lib.stride_tricks.as_strided(
        target.view(F32), dst_view.dims, [st * 4 for st in (dst_view.strides or ())])
    per = scale.reshape((1, -1) + (1,) * (len(src_view.dims) - 2)) if scale.size > 1 else scale
    want = (q.astype(F32) - F32(zero_point)) * per.astype(F32)
    return bool(np.array_equal(got, want))


def _chain_attr(ctx: LowerContext, node: Node) -> BuiltAttr | None:
    """The composed chain as float32 post-ops (None in the unfused mode, which runs them one
    primitive each); a bias equal on every channel as one eltwise linear."""
    if ctx.options.mode == "unfused":
        return None
    composed = node.meta.get("composed")
    assert isinstance(composed, Composed), f"{node}: no composed attributes (compose_post_ops)"
    bias = composed.bias
    if bias is not None and np.unique(bias).size == 1:
        composed = replace(composed, bias=np.asarray(bias, F32).ravel()[:1])
    finish = as_float_post_ops(composed)
    return build_attr(finish, ndims=len(ctx.info(node.outputs[0]).shape), channel_axis=1,
                      wei_mask=0, dst_type=DataType.f32, scales=False)


def _lower_linear(ctx: LowerContext, node: Node, note: str) -> None:
    """The linear numpy kernel on row-major (N, spatial..., C) views of channels-last slots."""
    x, y = node.inputs[0], node.outputs[0]
    shape, out = ctx.info(x).shape, ctx.info(y).shape
    src = ctx.source(x, channels_last(shape, DataType.f32))
    src_view = ctx.temp(f"{x}@cl", plain_md((shape[0], *shape[2:], shape[1]), DataType.f32),
                        alias=src)
    # the kernel writes the view; y's home aliases it (so run_all sees the writer of y)
    dst_view = ctx.temp(f"{y}@cl", plain_md((out[0], *out[2:], out[1]), DataType.f32))
    ctx.define(y, channels_last(out, DataType.f32), alias=dst_view)
    kernel = LinearKernel(node.attrs, shape)
    into = ort_linear(node.attrs, shape, kernel, ctx.options.threads)
    if into is not None:
        ctx.add_numpy(node.name, into, [src_view], [dst_view],  # type: ignore[arg-type]
                      ctx.info_for(node, note=ORT_LINEAR_NOTE), kind="onnxruntime", into=True)
        return
    ctx.add_numpy(node.name, kernel, [src_view], [dst_view],
                  ctx.info_for(node, note=note + " on (N, spatial..., C) views of channels-last "
                                                 "slots"))


def _channels_last_model(attrs: ResizeAttrs, shape: tuple[int, ...]) -> bytes:
    """One ONNX Resize node over the (N, spatial..., C) view: the node's own scales (or
    sizes) and coordinate mode, with C moved last."""
    order = (0, *range(2, len(shape)), 1)
    src = [shape[a] for a in order]
    dst = [attrs.sizes[a] for a in order]
    if attrs.scales:
        inputs = ["x", "", "scales"]
        given = numpy_helper.from_array(
            np.array([attrs.scales[a] for a in order], F32), "scales")
    else:
        inputs = ["x", "", "", "sizes"]
        given = numpy_helper.from_array(np.array(dst, np.int64), "sizes")
    node = helper.make_node("Resize", inputs, ["y"], mode="linear",
                            coordinate_transformation_mode=attrs.coordinate_transformation_mode)
    graph = helper.make_graph(
        [node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, src)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dst)], [given])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ORT_OPSET)])
    model.ir_version = ORT_IR_VERSION
    return model.SerializeToString()


def ort_linear(attrs: ResizeAttrs, shape: tuple[int, ...], kernel: LinearKernel,
               threads: int | None) -> Callable[[list[np.ndarray], list[np.ndarray]], None] | None:
    """onnxruntime's Resize writing the numpy kernel's output view (``fn(inputs, outputs)``)
    when, probed here on seeded random values over the whole tensor, it computes the same
    bytes; None when it does not or cannot (then the numpy kernel runs).

    The reference is ONNX Runtime's float32 formula (runtime/reference/ops_shape.py), and its
    channels-last bilinear kernel (upsample.cc, scales 1 on N and C) evaluates the same
    operations in the same order, about 6x faster than the numpy gathers (28x28 → 224x224 on
    21 channels: 0.21 against 1.39 ms at 2 threads). The probe keeps that an observed fact of
    the installed onnxruntime, not an assumption: a version that rounds differently, or has
    no kernel for the view (a 3-d spatial view), leaves the numpy kernel in place."""
    probe = np.random.default_rng(0).standard_normal(kernel.src_shape, dtype=F32)
    view = probe.reshape((shape[0], *shape[2:], shape[1]))
    expected = kernel([view])[0]
    got = np.empty_like(expected)
    try:
        into = runner_into(_channels_last_model(attrs, shape), "Resize", threads)
        into([view], [got])
    except Exception as exc:  # an onnxruntime without a kernel (or version) for it
        log.debug("linear Resize %s: onnxruntime cannot run it: %s", shape, exc)
        return None
    if not np.array_equal(got.view(np.uint32), expected.view(np.uint32)):
        log.debug("linear Resize %s: onnxruntime's bytes differ from the reference's", shape)
        return None
    return into


class LinearKernel:
    """Linear Resize of the spatial dims of a channels-last float32 array, bit-exact with
    runtime/reference/ops_shape.py (module docstring): called with [x (N, spatial..., C)]."""

    def __init__(self, attrs: ResizeAttrs, shape: tuple[int, ...]) -> None:
        taps = linear_taps(attrs, shape)
        axes = tuple(taps)
        if axes != tuple(range(2, len(shape))):
            raise ValueError(f"interpolated axes {axes} are not the spatial dims of {shape}")
        n, channels, spatial = shape[0], shape[1], shape[2:]
        out = tuple(attrs.sizes[2:])
        index, weight = [], []
        for corner in itertools.product((0, 1), repeat=len(axes)):
            picks = [taps[a][bit] for a, bit in zip(axes, corner, strict=True)]
            index.append(np.ravel_multi_index(np.ix_(*picks), spatial).ravel())
            w: np.ndarray | None = None
            for k, (a, bit) in reversed(list(enumerate(zip(axes, corner, strict=True)))):
                wa = taps[a][2 + bit].reshape((-1,) + (1,) * (len(axes) - k - 1))
                w = wa if w is None else w * wa  # the reference's product, in its order
            assert w is not None
            weight.append(np.broadcast_to(w, out).ravel())
        self.points = math.prod(out)
        self.corners = len(index)
        self.index = np.concatenate(index)
        weights = np.concatenate(weight).astype(F32)[:, None]
        if weights.size * channels * weights.itemsize <= BROADCAST_WEIGHTS_BYTES:
            weights = np.ascontiguousarray(np.broadcast_to(weights, (weights.size, channels)))
        self.weights = weights
        self.src_shape = (n, math.prod(spatial), channels)
        self.dst_shape = (n, *out, channels)

    def __call__(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        terms = np.take(arrays[0].reshape(self.src_shape), self.index, axis=1)
        terms *= self.weights  # weight · x[corner], one rounding per term
        p = self.points
        y = terms[:, :p] + terms[:, p:2 * p]
        for k in range(2, self.corners):
            y += terms[:, k * p:(k + 1) * p]  # corners added left to right
        return [y.reshape(self.dst_shape)]


def probe_resize(ctx: LowerContext, node: Node, port: int,
                 dtype: DataType) -> MemoryDesc | None:
    """Layout wanted for the Resize input: none for oneDNN (it reads the producer's),
    channels-last for the linear kernel, row-major for the reference in numpy."""
    if port != 0:
        return None
    how = resize_decision(ctx, node).how
    shape = ctx.info(node.inputs[0]).shape
    if how in ("alias", "onednn", "onednn_linear"):
        return None
    if how == "numpy_cl":
        return channels_last(shape, dtype)
    return plain_md(shape, dtype)
