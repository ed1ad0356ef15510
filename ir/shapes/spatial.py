"""Shape rules of the ops with sliding windows and of Resize.

With ``ek = (k - 1)·d + 1`` (the dilated kernel) and ``p = pad_begin + pad_end``:

- Conv / pooling, floor mode: ``out = floor((in + p - ek) / s) + 1``.
- Pooling, ceil mode: ``out = ceil((in + p - ek) / s) + 1``, minus one when the last window
  would start inside the end padding, ``(out - 1)·s >= in + pad_begin`` (PyTorch's rule,
  which ONNX Runtime and onnx.reference follow; onnx.shape_inference does not apply it, e.g.
  in=8, k=2, s=3, pads=(1, 1): 4 there, 3 here and in ONNX Runtime).
- ConvTranspose: ``out = s·(in - 1) + output_padding + ek - p``.
"""

from __future__ import annotations

import math

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs, PoolAttrs, ResizeAttrs, ResizeMode
from qfuse.ir.shapes._common import Shape, fail, keep_quant, optional, required, same_info
from qfuse.ir.shapes.arith import compute_output
from qfuse.ir.types import TensorInfo


def _check_window(node: Node, attrs: ConvAttrs | ConvTransposeAttrs | PoolAttrs,
                  x: TensorInfo) -> int:
    n = len(attrs.kernel_shape)
    if x.rank != n + 2:
        raise fail(node, f"input of rank {x.rank} for a {n}-D kernel (want rank {n + 2})")
    for what, values, want in (("strides", attrs.strides, n), ("dilations", attrs.dilations, n),
                               ("pads", attrs.pads, 2 * n)):
        if len(values) != want:
            raise fail(node, f"{len(values)} {what} for a {n}-D kernel (want {want})")
    if min(attrs.strides, default=1) < 1 or min(attrs.dilations, default=1) < 1:
        raise fail(node, "strides and dilations must be >= 1")
    if min(attrs.kernel_shape, default=1) < 1:
        raise fail(node, f"kernel_shape {attrs.kernel_shape} has a dim < 1")
    if min(attrs.pads, default=0) < 0:
        raise fail(node, f"negative pads {attrs.pads}")
    return n


def window_out(size: int, k: int, s: int, d: int, begin: int, end: int,
               ceil_mode: bool = False) -> int:
    """Output length of a sliding window (see the module docstring)."""
    span = size + begin + end - ((k - 1) * d + 1)
    if span < 0:
        return 0
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= size + begin:
        out -= 1
    return out


def _spatial(node: Node, attrs: ConvAttrs | PoolAttrs, x: TensorInfo, n: int,
             ceil_mode: bool = False) -> list[int]:
    out = []
    for i in range(n):
        o = window_out(x.shape[2 + i], attrs.kernel_shape[i], attrs.strides[i],
                       attrs.dilations[i], attrs.pads[i], attrs.pads[n + i], ceil_mode)
        if o < 1:
            raise fail(node, f"spatial dim {i} of size {x.shape[2 + i]} is smaller than the "
                             f"dilated kernel {(attrs.kernel_shape[i] - 1) * attrs.dilations[i] + 1}"
                             f" plus pads")
        out.append(o)
    return out


def _check_weights(node: Node, x: TensorInfo, w: TensorInfo, n: int,
                   kernel_shape: tuple[int, ...], group: int) -> None:
    if w.rank != n + 2:
        raise fail(node, f"weights of rank {w.rank} for a {n}-D kernel")
    if tuple(w.shape[2:]) != tuple(kernel_shape):
        raise fail(node, f"kernel_shape {tuple(kernel_shape)} differs from the weights' "
                         f"{tuple(w.shape[2:])}")
    if group < 1 or x.shape[1] % group:
        raise fail(node, f"{x.shape[1]} input channels do not split into group={group}")


def conv(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: ConvAttrs = node.attrs
    x, w = required(graph, node, 0), required(graph, node, 1)
    n = _check_window(node, attrs, x)
    _check_weights(node, x, w, n, attrs.kernel_shape, attrs.group)
    if x.shape[1] != w.shape[1] * attrs.group:
        raise fail(node, f"input has {x.shape[1]} channels but the weights {w.shape} with "
                         f"group={attrs.group} expect {w.shape[1] * attrs.group}")
    if w.shape[0] % attrs.group:
        raise fail(node, f"{w.shape[0]} output channels do not split into group={attrs.group}")
    bias = optional(graph, node, 2)
    if bias is not None and bias.shape != (w.shape[0],):
        raise fail(node, f"bias has shape {bias.shape}, want ({w.shape[0]},)")
    shape = (x.shape[0], w.shape[0], *_spatial(node, attrs, x, n))
    return [compute_output(graph, node, x, shape)]


def conv_transpose(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: ConvTransposeAttrs = node.attrs
    x, w = required(graph, node, 0), required(graph, node, 1)
    n = _check_window(node, attrs, x)
    _check_weights(node, x, w, n, attrs.kernel_shape, attrs.group)
    if x.shape[1] != w.shape[0]:
        raise fail(node, f"input has {x.shape[1]} channels but the weights {w.shape} expect "
                         f"{w.shape[0]}")
    if len(attrs.output_padding) != n:
        raise fail(node, f"{len(attrs.output_padding)} output_padding values for a {n}-D kernel")
    channels = w.shape[1] * attrs.group
    bias = optional(graph, node, 2)
    if bias is not None and bias.shape != (channels,):
        raise fail(node, f"bias has shape {bias.shape}, want ({channels},)")
    spatial = []
    for i in range(n):
        s, d, op = attrs.strides[i], attrs.dilations[i], attrs.output_padding[i]
        if not 0 <= op < max(s, d):
            raise fail(node, f"output_padding {op} must be in [0, max(stride, dilation)) = "
                             f"[0, {max(s, d)})")
        o = (s * (x.shape[2 + i] - 1) + op + (attrs.kernel_shape[i] - 1) * d + 1
             - attrs.pads[i] - attrs.pads[n + i])
        if o < 1:
            raise fail(node, f"spatial dim {i} would have size {o}")
        spatial.append(o)
    return [compute_output(graph, node, x, (x.shape[0], channels, *spatial))]


def _pool(graph: Graph, node: Node, keep: bool) -> list[TensorInfo]:
    attrs: PoolAttrs = node.attrs
    x = required(graph, node, 0)
    n = _check_window(node, attrs, x)
    shape: Shape = (*x.shape[:2], *_spatial(node, attrs, x, n, attrs.ceil_mode))
    if not keep:
        return [same_info(x, shape)]
    axis = x.quant.axis if x.quant is not None else None
    return [keep_quant(x, shape, -1 if axis is None or axis < 2 else None)]


def max_pool(graph: Graph, node: Node) -> list[TensorInfo]:
    return _pool(graph, node, keep=True)


def avg_pool(graph: Graph, node: Node) -> list[TensorInfo]:
    return _pool(graph, node, keep=False)


def global_avg_pool(graph: Graph, node: Node) -> list[TensorInfo]:
    x = required(graph, node, 0)
    if x.rank < 3:
        raise fail(node, f"input of rank {x.rank} has no spatial dims")
    return [same_info(x, (*x.shape[:2], *([1] * (x.rank - 2))))]


def global_max_pool(graph: Graph, node: Node) -> list[TensorInfo]:
    """Like GlobalAveragePool, but the max of quantized values is one of them: x's
    quantization is kept (per tensor, or per channel on axis 0 / 1)."""
    (out,) = global_avg_pool(graph, node)
    axis = x.quant.axis if (x := required(graph, node, 0)).quant is not None else None
    return [keep_quant(x, out.shape, -1 if axis is None or axis < 2 else None)]


def resize(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: ResizeAttrs = node.attrs
    x = required(graph, node, 0)
    if len(attrs.sizes) != x.rank:
        raise fail(node, f"{len(attrs.sizes)} output sizes for an input of rank {x.rank}")
    if attrs.scales and len(attrs.scales) != x.rank:
        raise fail(node, f"{len(attrs.scales)} scales for an input of rank {x.rank}")
    if min(attrs.sizes, default=1) < 1:
        raise fail(node, f"output sizes {attrs.sizes} have a dim < 1")
    if any(not math.isfinite(s) or s <= 0 for s in attrs.scales):
        raise fail(node, f"scales {attrs.scales} must be finite and > 0")
    if attrs.mode is not ResizeMode.NEAREST:
        return [same_info(x, attrs.sizes)]
    axis = x.quant.axis if x.quant is not None else None
    keeps_axis = axis is None or attrs.sizes[axis] == x.shape[axis]
    return [keep_quant(x, attrs.sizes, -1 if keeps_axis else None)]
