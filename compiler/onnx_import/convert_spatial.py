"""Conv, ConvTranspose, pooling and Resize: attributes resolved to explicit values.

auto_pad is resolved with the input shape (ONNX spec; dilated kernel ``ek = (k-1)·d + 1``):
- Conv / pooling, SAME_*: ``out = ceil(in / s)``, ``total = max(0, (out-1)·s + ek - in)``;
  SAME_UPPER puts ``total // 2`` at the begin (the extra pad at the end), SAME_LOWER at the end.
- ConvTranspose with ``output_shape`` (SAME_*: ``out = in · s``):
  ``total = s·(in-1) + output_padding + ek - out``; SAME_UPPER puts ``total // 2`` at the
  begin, otherwise the begin gets ``total - total // 2`` (what ONNX Runtime does, checked).
"""

from __future__ import annotations

import math

from qfuse.compiler.onnx_import.context import Context, NodeView
from qfuse.ir.ops import (
    ConvAttrs,
    ConvTransposeAttrs,
    Op,
    PoolAttrs,
    ResizeAttrs,
    ResizeMode,
)
from qfuse.ir.types import DType, TensorInfo

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric", "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _ints(ctx: Context, node: NodeView, key: str, default: tuple[int, ...],
          length: int) -> tuple[int, ...]:
    values = tuple(int(v) for v in node.attr(key, default))
    if len(values) != length:
        raise ctx.malformed(node, f"{key} {list(values)} has {len(values)} values, want {length}")
    return values


def _window(ctx: Context, node: NodeView, x: TensorInfo, kernel: tuple[int, ...],
            ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """strides, pads (auto_pad resolved) and dilations of a Conv or pooling node."""
    n = len(kernel)
    if x.rank != n + 2:
        raise ctx.malformed(node, f"input of rank {x.rank} for a {n}-D kernel {list(kernel)}")
    strides = _ints(ctx, node, "strides", (1,) * n, n)
    dilations = _ints(ctx, node, "dilations", (1,) * n, n)
    if min(strides + dilations, default=1) < 1:
        raise ctx.malformed(node, "strides and dilations must be >= 1")
    auto_pad = _auto_pad(ctx, node)
    if auto_pad in ("NOTSET", "VALID"):
        default = (0,) * (2 * n)
        pads = _ints(ctx, node, "pads", default, 2 * n) if auto_pad == "NOTSET" else default
        return strides, pads, dilations
    begins, ends = [], []
    for i in range(n):
        size, s = x.shape[2 + i], strides[i]
        extent = (kernel[i] - 1) * dilations[i] + 1
        total = max(0, (math.ceil(size / s) - 1) * s + extent - size)
        small = total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return strides, tuple(begins + ends), dilations


def _auto_pad(ctx: Context, node: NodeView) -> str:
    auto_pad = str(node.attr("auto_pad", "NOTSET"))
    if auto_pad not in AUTO_PADS:
        raise ctx.malformed(node, f"unknown auto_pad '{auto_pad}'")
    if auto_pad != "NOTSET" and "pads" in node.attrs:
        raise ctx.malformed(node, f"pads and auto_pad={auto_pad} cannot be used together")
    return auto_pad


def _kernel(ctx: Context, node: NodeView, w: TensorInfo) -> tuple[int, ...]:
    if w.rank < 3:
        raise ctx.malformed(node, f"weights of shape {w.shape} have no spatial dims")
    return _ints(ctx, node, "kernel_shape", tuple(w.shape[2:]), w.rank - 2)


def conv(ctx: Context, node: NodeView) -> None:
    x, w = ctx.input_info(node, 0), ctx.input_info(node, 1)
    kernel = _kernel(ctx, node, w)
    strides, pads, dilations = _window(ctx, node, x, kernel)
    group = int(node.attr("group", 1))
    ctx.emit(node, Op.CONV, node.inputs[:3],
             ConvAttrs(kernel, strides, pads, dilations, group))


def conv_transpose(ctx: Context, node: NodeView) -> None:
    x, w = ctx.input_info(node, 0), ctx.input_info(node, 1)
    kernel = _kernel(ctx, node, w)
    n = len(kernel)
    if x.rank != n + 2:
        raise ctx.malformed(node, f"input of rank {x.rank} for a {n}-D kernel {list(kernel)}")
    strides = _ints(ctx, node, "strides", (1,) * n, n)
    dilations = _ints(ctx, node, "dilations", (1,) * n, n)
    output_padding = _ints(ctx, node, "output_padding", (0,) * n, n)
    auto_pad = _auto_pad(ctx, node)
    output_shape = [int(v) for v in node.attr("output_shape", [])]
    if output_shape and len(output_shape) != n:
        raise ctx.malformed(node, f"output_shape {output_shape} does not have {n} spatial dims")
    if not output_shape and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [x.shape[2 + i] * strides[i] for i in range(n)]
    if output_shape:
        begins, ends = [], []
        for i in range(n):
            extent = (kernel[i] - 1) * dilations[i] + 1
            total = (strides[i] * (x.shape[2 + i] - 1) + output_padding[i] + extent
                     - output_shape[i])
            if total < 0:
                raise ctx.unsupported(
                    node, f"output_shape {output_shape} is larger than the full transposed "
                          f"convolution on spatial dim {i} (negative padding)")
            small = total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else total - small)
            ends.append(total - begins[-1])
        pads = tuple(begins + ends)
    elif auto_pad == "VALID":
        pads = (0,) * (2 * n)
    else:
        pads = _ints(ctx, node, "pads", (0,) * (2 * n), 2 * n)
    group = int(node.attr("group", 1))
    ctx.emit(node, Op.CONV_TRANSPOSE, node.inputs[:3],
             ConvTransposeAttrs(kernel, strides, pads, dilations, output_padding, group))


def _pool_attrs(ctx: Context, node: NodeView, count_include_pad: bool) -> PoolAttrs:
    x = ctx.input_info(node, 0)
    if "kernel_shape" not in node.attrs:
        raise ctx.malformed(node, "kernel_shape is required")
    kernel = tuple(int(k) for k in node.attrs["kernel_shape"])
    strides, pads, dilations = _window(ctx, node, x, kernel)
    return PoolAttrs(kernel, strides, pads, dilations, bool(node.attr("ceil_mode", 0)),
                     count_include_pad)


def max_pool(ctx: Context, node: NodeView) -> None:
    ctx.check_unused(node, 1, "Indices")
    ctx.emit(node, Op.MAX_POOL, node.inputs[:1], _pool_attrs(ctx, node, False))


def average_pool(ctx: Context, node: NodeView) -> None:
    attrs = _pool_attrs(ctx, node, bool(node.attr("count_include_pad", 0)))
    ctx.emit(node, Op.AVG_POOL, node.inputs[:1], attrs)


def global_average_pool(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.GLOBAL_AVG_POOL, node.inputs[:1])


def global_max_pool(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.GLOBAL_MAX_POOL, node.inputs[:1])


def resize(ctx: Context, node: NodeView) -> None:
    x = ctx.input_info(node, 0)
    mode = str(node.attr("mode", "nearest"))
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.malformed(node, f"unknown mode '{mode}'")
    transform = str(node.attr("coordinate_transformation_mode", "half_pixel"))
    if transform == "tf_crop_and_resize":
        raise ctx.unsupported(node, "coordinate_transformation_mode 'tf_crop_and_resize' is "
                                    "not supported")
    if transform not in TRANSFORMS:
        raise ctx.malformed(node, f"unknown coordinate_transformation_mode '{transform}'")
    nearest_mode = str(node.attr("nearest_mode", "round_prefer_floor"))
    if nearest_mode not in NEAREST_MODES:
        raise ctx.malformed(node, f"unknown nearest_mode '{nearest_mode}'")
    if node.attr("antialias", 0):
        raise ctx.unsupported(node, "antialias=1 is not supported")
    sizes, scales = _resize_sizes(ctx, node, x)
    if mode == "cubic":
        _check_bicubic(ctx, node, x, scales)
    attrs = ResizeAttrs(ResizeMode(mode), sizes, scales, transform, nearest_mode,
                        float(node.attr("cubic_coeff_a", -0.75)),
                        bool(node.attr("exclude_outside", 0)))
    ctx.emit(node, Op.RESIZE, node.inputs[:1], attrs)


def _check_bicubic(ctx: Context, node: NodeView, x: TensorInfo,
                   scales: tuple[float, ...]) -> None:
    """cubic as ONNX Runtime computes it (its only kernel, ``ResizeBiCubic``): float32, 2-D or
    4-D with N and C not scaled; anything else stays ONNX (an island, run by onnxruntime)."""
    if x.dtype is not DType.F32:
        raise ctx.unsupported(node, f"cubic on {x.dtype.name}: qfuse's cubic reads float32")
    if x.rank not in (2, 4) or (x.rank == 4 and (scales[0] != 1.0 or scales[1] != 1.0)):
        raise ctx.unsupported(node, f"cubic of rank {x.rank} with scales {list(scales)}: "
                                    "2-D, or 4-D with N and C not scaled, is supported")


def _resize_sizes(ctx: Context, node: NodeView, x: TensorInfo,
                  ) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Static output sizes and the per-axis scales of a Resize (ONNX opset 11-19 rules)."""
    scales_in = ctx.optional_const(node, 2, "scales")
    sizes_in = ctx.optional_const(node, 3, "sizes")
    scales_in = None if scales_in is None or scales_in.size == 0 else scales_in
    sizes_in = None if sizes_in is None or sizes_in.size == 0 else sizes_in
    if (scales_in is None) == (sizes_in is None):
        raise ctx.malformed(node, "exactly one of scales and sizes must be given")
    axes = [int(a) % x.rank if -x.rank <= int(a) < x.rank else -1
            for a in node.attr("axes", range(x.rank))]
    given = scales_in if scales_in is not None else sizes_in
    assert given is not None
    if -1 in axes or len(set(axes)) != len(axes) or given.size != len(axes):
        raise ctx.malformed(node, f"{given.size} scales/sizes for axes "
                                  f"{list(node.attr('axes', range(x.rank)))} of rank {x.rank}")
    scales = [1.0] * x.rank
    sizes = list(x.shape)
    if scales_in is not None:
        for axis, s in zip(axes, scales_in.astype(float).tolist(), strict=True):
            if not math.isfinite(s) or s <= 0:
                raise ctx.malformed(node, f"scale {s} on axis {axis} must be finite and > 0")
            scales[axis] = s
            sizes[axis] = math.floor(x.shape[axis] * s)
        return tuple(sizes), tuple(scales)
    policy = str(node.attr("keep_aspect_ratio_policy", "stretch"))
    wanted = {axis: int(v) for axis, v in zip(axes, sizes_in.tolist(), strict=True)}
    if policy == "stretch":
        for axis, v in wanted.items():
            scales[axis], sizes[axis] = v / x.shape[axis], v
    elif policy in ("not_larger", "not_smaller"):
        ratios = [v / x.shape[axis] for axis, v in wanted.items()]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        for axis in wanted:
            scales[axis] = scale
            sizes[axis] = math.floor(scale * x.shape[axis] + 0.5)
    else:
        raise ctx.malformed(node, f"unknown keep_aspect_ratio_policy '{policy}'")
    return tuple(sizes), tuple(scales)
