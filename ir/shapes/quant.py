"""Shape rules of the quantization ops.

- QuantizeLinear: x's shape, element type from the attributes; QuantParams read from the
  constant scale / zero point (per-axis along ``attrs.axis`` when the scale is 1-D with more
  than one element; None when the scale or zero point is not a constant).
- DequantizeLinear: x's shape in float32.
- DynamicQuantizeLinear: (x's shape in u8, a float32 scalar scale, a u8 scalar zero point).
- FakeQuantize: x's shape. Its element type is f32 unless the output already carries an
  integer type: a quantize-only FakeQuantize (OpenVINO fake_quantize.md) is typed u8/s8 by the pass that makes
  it, and inference keeps that type and its QuantParams.
"""

from __future__ import annotations

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import DequantizeAttrs, QuantizeAttrs
from qfuse.ir.shapes._common import broadcast_to, fail, norm_axis, optional, required
from qfuse.ir.types import DType, QuantParams, TensorInfo


def _scale_and_zero_point(
    graph: Graph, node: Node, x: TensorInfo, axis: int
) -> tuple[np.ndarray | None, np.ndarray | None, int | None]:
    """Constant scale and zero point (None when not constant) and the channel axis they use
    (None: per tensor). Checks their shapes against x."""
    scale_info = required(graph, node, 1)
    zp_info = optional(graph, node, 2)
    per_axis = scale_info.rank == 1 and scale_info.shape[0] > 1
    if scale_info.rank > 1 or (scale_info.rank == 1 and not per_axis and scale_info.size != 1):
        raise fail(node, f"scale of shape {scale_info.shape} is neither a scalar nor 1-D")
    channel: int | None = None
    if per_axis:
        channel = norm_axis(node, axis, x.rank)
        if scale_info.shape[0] != x.shape[channel]:
            raise fail(
                node,
                f"{scale_info.shape[0]} scales for {x.shape[channel]} channels on axis {channel}",
            )
    if zp_info is not None and zp_info.size != scale_info.size:
        raise fail(node, f"zero point of shape {zp_info.shape} does not match the scale's "
                         f"{scale_info.shape}")
    scale = graph.constant(node.inputs[1])
    zero_point = (
        np.zeros(scale_info.shape, np.int64) if zp_info is None else graph.constant(node.inputs[2])
    )
    return scale, zero_point, channel


def _params(
    scale: np.ndarray | None, zero_point: np.ndarray | None, channel: int | None
) -> QuantParams | None:
    if scale is None or zero_point is None:
        return None
    return QuantParams.make(scale.ravel() if channel is not None else scale.reshape(()),
                            zero_point.ravel() if channel is not None else zero_point.reshape(()),
                            channel)


def quantize_linear(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: QuantizeAttrs = node.attrs
    x = required(graph, node, 0)
    if not attrs.dtype.is_integer:
        raise fail(node, f"quantizes to non-integer type {attrs.dtype.name.lower()}")
    scale, zero_point, channel = _scale_and_zero_point(graph, node, x, attrs.axis)
    if zero_point is not None and zero_point.size:
        low, high = attrs.dtype.range
        if int(zero_point.min()) < low or int(zero_point.max()) > high:
            raise fail(node, f"zero point outside the {attrs.dtype.name.lower()} range "
                             f"[{low}, {high}]")
    return [TensorInfo(x.shape, attrs.dtype, _params(scale, zero_point, channel))]


def dequantize_linear(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: DequantizeAttrs = node.attrs
    x = required(graph, node, 0)
    if not x.dtype.is_integer:
        raise fail(node, f"dequantizes a {x.dtype.name.lower()} tensor (want an integer type)")
    _scale_and_zero_point(graph, node, x, attrs.axis)
    return [TensorInfo(x.shape, DType.F32)]


def fake_quantize(graph: Graph, node: Node) -> list[TensorInfo]:
    x = required(graph, node, 0)
    for port, what in enumerate(("input_low", "input_high", "output_low", "output_high"), 1):
        broadcast_to(node, required(graph, node, port).shape, x.shape, what)
    current = graph.values[node.outputs[0]].info if node.outputs else None
    if current is not None and current.dtype.is_integer:
        return [TensorInfo(x.shape, current.dtype, current.quant)]
    return [TensorInfo(x.shape, DType.F32)]


def dynamic_quantize_linear(graph: Graph, node: Node) -> list[TensorInfo]:
    x = required(graph, node, 0)
    if x.dtype is not DType.F32:
        raise fail(node, f"DynamicQuantizeLinear reads float32, got {x.dtype.name}")
    return [TensorInfo(x.shape, DType.U8), TensorInfo((), DType.F32), TensorInfo((), DType.U8)]
