"""A convolution whose weights leave s8 once their zero point is taken off: two int8 convolutions.

oneDNN's int8 convolutions take s8 weights without a zero point (its API has no weight zero
point for them: https://oneapi-src.github.io/oneDNN/dev_guide_attributes_quantization.html).
onnxruntime's quantize_static and quantize_dynamic with ``weight_type=QUInt8`` and
``per_channel=False`` — their defaults until onnxruntime 1.11 (pull request 10209 made s8 the
default weight type), and what many scripts still pass — write per-tensor u8 weights with an
asymmetric zero point (their range [min, max] mapped onto [0, 255]); so does quantize_static
on weights it takes for activations (a model without pre-processing whose weights are
Constant nodes, paddle2onnx's). ``w − zw`` then spans up to [−255, 255]:
no s8 tensor holds it, and move_dequantize declines the convolution (float32). Split
``w − zw = m + o`` with ``m`` s8 and ``o`` an offset per tensor (or per output channel): the
one nearest 0 in ``[max − 127, min + 128]`` of the weights ``w − zw`` (of the channel), so that
``m = w − zw − o`` is s8 — for u8 weights spanning [0, 255] ``o = 128 − zw`` and ``m = w − 128``:

    acc = Σ (x − zx)·(w − zw) = Σ (x − zx)·m  +  o·Σ (x − zx)
                                 the main conv     the box sum: the same window summed

over the taps and input channels inside the image (a padding tap is the real 0 in both). The
box sum is a second int8 convolution of the same x with constant weights ``o``
(``[OC, Cin/g, k...]``, each output channel's ``o``), or — when the conv has one group and one
offset, so that one box sum serves every output channel — ``o`` times the channel sums
``T = Σ_c (x − zx)`` (a 1x1 int8 convolution with one output channel, ``[1, Cin, 1...]``)
summed over the conv's window by a float32 convolution of ones on that one channel (oneDNN's
int8 convolutions vectorize over output channels: one output channel of a 3x3 window cost
0.2–0.5 of the main conv in a microbenchmark, the two steps 0.04–0.35). The graph becomes

    y = (Conv(DQ(x, 1, zx), m) + box) · (sx·sw) [+ bias]

every convolution with scale 1, so each writes its integer sums in float32 and the Add is their
exact integer sum while the sums stay below 2^24 (beyond, float32 rounds them as oneDNN's own
conversion of a large s32 accumulator does); then one multiply by ``sx·sw`` (the float32
product move_dequantize would give the kernel) and the bias: the same arithmetic as an int8
convolution with s8 weights, so the result is within float32 rounding of the dequantized
reference, like any other int8 convolution. An offset of 128 (``zw = 0``: all weights
non-negative) is not s8: its channels' box weights are 64 with scale 2 (exact).

move_dequantize then takes the int8 convolutions. With one box sum the Add reads the main
conv's output and the box sum broadcast over channels: a binary primitive with the Mul, the
bias, the activation and the quantize as its post-ops (oneDNN runs a convolution's binary
post-op broadcast over channels only on ``ref:any``); the cost is that binary kernel and the
main conv's float32 output. With a box sum per output channel the main conv adds it as a
post-op (no binary kernel) but the box sum costs as much as the main conv: chosen for
depthwise and grouped convolutions, per-channel offsets, and where the box sum's products per
output pixel are few (``_full_box_sum``, fitted to measurements).

ConvTranspose alike: the box sum is a second ConvTranspose of the same x whose weights are all
``o`` (the weights' shape), or the channel sums' ConvTranspose by ones on one channel: each
output value sums the inputs that reach it, and a cropped border is cropped from both.

quantize_dynamic's ConvInteger, and its MatMulInteger with zero points per column, come from
the importer as one int8 node on ``w − zw`` in int16 (compiler/onnx_import/convert_dynamic.py;
the fp32 mode reads that node as the float op): split alike into the main and box-sum nodes,
each reading the run-time src zero point and writing its exact sums in float32, and their Add
before the accumulator's Cast to float32 (``_rewrite_dynamic``); a MatMul's box sum is a second
matmul whose weights are ``o`` per column.

Declined (float32 as before, the reason in ``inspect``): a source quantized per channel;
weights quantized along an axis other than the output channels; a ConvTranspose's weights
with zero points per channel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.ir.chain import Fused, Scale
from qfuse.ir.ops import CastAttrs, ConvAttrs
from qfuse.ir.types import DType, QuantParams
from qfuse.passes.base import PassContext
from qfuse.passes.move_dequantize import bias_of
from qfuse.passes.post_op_match import sole_reader
from qfuse.passes.quant_utils import (
    DqParams,
    add_dequantize,
    centered,
    dq_params,
    infer_into,
    is_op,
    rebuild,
)

log = logging.getLogger(__name__)

F32 = np.float32
# _full_box_sum's break-even: the full box sum's products per output pixel
FULL_BOX_LIMIT = 12288


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for conv in [n for n in graph.topo_order()
                 if n.op in (Op.CONV, Op.CONV_TRANSPOSE) and n.fused is None]:
        weights = _weights_beyond_s8(graph, conv)
        if weights is None:
            continue
        ctx.visit(conv)
        plan = _plan(graph, conv, weights)
        if isinstance(plan, str):
            ctx.decline(conv, plan)
            continue
        _rewrite(graph, conv, *plan)
        changed += 1
    for node in [n for n in graph.topo_order() if _wide_dynamic_weights(graph, n)]:
        _rewrite_dynamic(graph, ctx.visit(node))
        changed += 1
    if changed:
        graph.remove_unused()
    return changed


def _weights_beyond_s8(graph: Graph, conv: Node) -> tuple[Node, DqParams, np.ndarray] | None:
    """(dq, params, integers) of weights whose ``w − zw`` leaves s8; None for any other."""
    dq = graph.producer(conv.inputs[1])
    if not is_op(dq, Op.DEQUANTIZE_LINEAR):
        return None
    assert dq is not None
    w = graph.constant(dq.inputs[0])
    p = dq_params(graph, dq)
    if w is None or p is None or not p.dtype.is_quantized:
        return None
    shifted = centered(w, p)
    if shifted.min() >= -128 and shifted.max() <= 127:
        return None  # s8 as it is (move_dequantize)
    return dq, p, w


def _wide_dynamic_weights(graph: Graph, node: Node) -> bool:
    """A dynamically quantized Conv / MatMul whose weights the importer wrote as ``w − zw`` in
    int16 (compiler/onnx_import/convert_dynamic.py: they leave s8)."""
    w = graph.constant(node.inputs[1]) if node.op in (Op.CONV, Op.MATMUL) else None
    return (w is not None and node.fused is not None
            and node.fused.src_zero_point_port is not None and w.dtype == np.int16)


def _plan(graph: Graph, conv: Node, weights: tuple[Node, DqParams, np.ndarray]
          ) -> tuple[Node, DqParams, Split, np.ndarray, np.ndarray | None] | str:
    """(x dequantize, its params, the split weights, sx·sw, bias) or why not."""
    w_dq, pw, w = weights
    x_dq = graph.producer(conv.inputs[0])
    if not is_op(x_dq, Op.DEQUANTIZE_LINEAR) or graph.constant(x_dq.inputs[0]) is not None:
        return "weights with a zero point beyond s8, and the source is not dequantized int8"
    assert x_dq is not None
    px = dq_params(graph, x_dq)
    if px is None or not px.dtype.is_quantized or not px.per_tensor:
        return ("weights with a zero point beyond s8, and the source is not dequantized "
                "per tensor (its box sum needs one zero point)")
    deconv = conv.op is Op.CONV_TRANSPOSE
    if deconv and not pw.per_tensor:
        return "a ConvTranspose's weights with zero points per channel"
    if not pw.per_tensor and pw.axis != 0:
        return f"weights are per channel along axis {pw.axis}, not the output channels"
    bias = bias_of(graph, conv)
    if isinstance(bias, str):
        return f"weights with a zero point beyond s8, and {bias}"
    attrs = conv.attrs
    parts = split(centered(w, pw), attrs.group, attrs.strides if deconv else None)
    out_channels = graph.info(conv.outputs[0]).shape[1]
    scale = px.scale.astype(F32) * np.broadcast_to(pw.scale.astype(F32), (out_channels,))
    return x_dq, px, parts, scale, bias[0]


@dataclass(frozen=True)
class Split:
    """``w − zw`` as ``main`` (s8 ``w − zw − o``) plus the box sum's weights ``box`` (s8, all
    ``o`` or ``o/2`` per output channel: ``[OC, Cin/g, k...]``, or ``[1, Cin, 1...]`` when one
    box sum serves every output channel) and their scales (1, or 2 for ``o = 128``).
    ``spread``: the kernel of the one box sum, summed in float32 over the channel sums ``box``
    gives (module docstring); None when ``box`` is the box sum's own kernel."""

    main: np.ndarray
    box: np.ndarray
    box_scales: np.ndarray
    spread: tuple[int, ...] | None = None


def split(w: np.ndarray, group: int, deconv_strides: tuple[int, ...] | None = None) -> Split:
    """Conv weights less their zero points (``w − zw``: integers, ``[OC, Cin/g, k...]``) split
    as the module docstring says. ConvTranspose weights (``deconv_strides`` given: ``[Cin, OC/g, k...]``)
    take one offset for the whole tensor; their full box sum has the weights' shape, their
    one box sum the same channel sums as a Conv's."""
    deconv = deconv_strides is not None
    out_channels = w.shape[1] * group if deconv else w.shape[0]
    main, offsets, values, scales = _offsets(w, 1 if deconv else 0, out_channels)
    taps = int(np.prod(w.shape[2:])) * (w.shape[0] // group if deconv else w.shape[1])
    if deconv:  # each output value sums about taps / Π strides products
        taps //= int(np.prod(deconv_strides))
    if group == 1 and np.all(offsets == offsets[0]) and not _full_box_sum(out_channels, taps):
        kernel = tuple(int(k) for k in w.shape[2:])
        channels = w.shape[0] if deconv else w.shape[1]
        if np.prod(kernel) > 1:  # channel sums, then their box in float32
            sums = np.full((1, channels) + (1,) * len(kernel), values[0], np.int8)
            return Split(main, sums, scales[:1], kernel)
        # a 1x1 window: the channel sums are the box sums, read with the conv's own window
        shape = (channels, 1, *kernel) if deconv else (1, channels, *kernel)
        return Split(main, np.full(shape, values[0], np.int8), scales[:1])
    if deconv:
        return Split(main, np.full(w.shape, values[0], np.int8), scales[:1])
    box = np.broadcast_to(values.reshape((-1,) + (1,) * (w.ndim - 1)), w.shape).copy()
    return Split(main, box, scales)


def split_matmul(w: np.ndarray) -> Split:
    """MatMul weights less their zero points (``w − zw``, ``[..., K, N]``): the main weights
    and a second matmul's ``o`` per column (the weights' shape), its scales per column; the
    product ``Σ_k (a − za)·o[n]`` is the box sum of a MatMul."""
    main, _, values, scales = _offsets(w, w.ndim - 1, w.shape[-1])
    return Split(main, np.broadcast_to(values, w.shape).copy(), scales)


def _offsets(w: np.ndarray, axis: int, channels: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(s8 ``w − o``, the offsets ``o`` per output channel (along ``axis``), their s8 values
    and scales: ``o`` with scale 1, or 64 with scale 2 for ``o = 128``). One offset for the
    whole tensor when one takes every weight into s8 (always for a zero point per tensor: u8
    weights less it span at most 255), else one per channel; each the one nearest 0 of those
    that do, ``[max − 127, min + 128]`` (``128 − zw`` for u8 weights spanning [0, 255])."""
    w = np.asarray(w, np.int64)
    lo, hi = int(w.min()), int(w.max())
    if hi - lo <= 255:
        offsets = np.full(channels, _nearest_zero(lo, hi), np.int64)
        main = (w - offsets[0]).astype(np.int8)
    else:
        rest = tuple(i for i in range(w.ndim) if i != axis)
        lows, highs = w.min(axis=rest).ravel(), w.max(axis=rest).ravel()
        if np.any(highs - lows > 255):
            raise ValueError("weights of one output channel span more than 255 integers")
        offsets = np.array([_nearest_zero(int(a), int(b)) for a, b in zip(lows, highs)],
                           np.int64)
        main = (w - offsets.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
                ).astype(np.int8)
    halved = offsets > 127
    values = np.where(halved, offsets // 2, offsets).astype(np.int8)
    return main, offsets, values, np.where(halved, 2.0, 1.0).astype(F32)


def _nearest_zero(lo: int, hi: int) -> int:
    """The integer nearest 0 in ``[hi − 127, lo + 128]``: the offset ``o`` that takes weights
    in ``[lo, hi]`` into s8 (``w − o``)."""
    return min(max(0, hi - 127), lo + 128)


def _accumulators(parts: Split, int8: Callable[[np.ndarray, np.ndarray, str, object], str],
                  window: Callable[[str, tuple[int, ...]], str]) -> list[str]:
    """The main and box-sum values whose sum is the accumulator: ``int8(weights, scales,
    what, attrs)`` adds an int8 node over the source writing its exact sums in float32 (attrs
    None: the node's own window), ``window(sums, kernel)`` the float32 box of ones over the
    channel sums (``parts.spread``)."""
    main = int8(parts.main, np.ones(1, F32), "main", None)
    if parts.spread is None:
        return [main, int8(parts.box, parts.box_scales, "box_sum", None)]
    sums = int8(parts.box, parts.box_scales, "channel_sum", pointwise(len(parts.spread)))
    return [main, window(sums, parts.spread)]


def pointwise(rank: int) -> ConvAttrs:
    """A 1x1 convolution's attributes (``rank`` spatial dims, stride 1, no padding)."""
    return ConvAttrs((1,) * rank, (1,) * rank, (0,) * (2 * rank), (1,) * rank, 1)


def _full_box_sum(out_channels: int, taps: int) -> bool:
    """Whether a box sum per output channel (a second convolution as large as the main one,
    added by its post-op) beats one box sum broadcast by a binary primitive: the full box sum
    costs its products per output pixel, ``taps · out_channels``; the narrow one about the same
    per pixel whatever the conv (its channel sums, the binary, the main conv's float32
    output). FULL_BOX_LIMIT is fitted to 485 convolutions of nine models (YOLOv8n, PP-LCNet,
    PP-OCRv4 det, RepGhostNet-0.5, GhostNetV2, ResNetV2-50d, GoogLeNet, HGNet-Tiny,
    EfficientNetV2-RW-T; AVX-512 VNNI, 2 threads, each conv's kernels timed both ways): this
    choice sums to 62.0 ms over them, the better of the two for each conv to 61.2, always
    narrow to 73.9, always full to 87.2."""
    return taps * out_channels <= FULL_BOX_LIMIT


def _rewrite(graph: Graph, conv: Node, x_dq: Node, px: DqParams, parts: Split,
             scale: np.ndarray, bias: np.ndarray | None) -> None:
    origin, out = list(conv.origin), conv.outputs[0]
    info = graph.info(out)
    shape = (1, -1) + (1,) * (info.rank - 2)

    def const(data: np.ndarray, what: str) -> str:
        return graph.add_constant(graph.unique_name(f"{conv.name}/{what}"), data).name

    def node(op: Op, inputs: list[str], what: str, output: str | None = None,
             attrs: object = None) -> str:
        attrs = attrs or (conv.attrs if op is conv.op else None)
        new = graph.add_node(op, inputs, [output] if output else 1, attrs,
                             name=f"{conv.name}/{what}", origin=origin)
        infer_into(graph, new)
        return new.outputs[0]

    def build() -> None:
        x_int = add_dequantize(graph, x_dq.inputs[0],
                               QuantParams.make(1.0, int(px.zero_point[0])),
                               name=f"{conv.name}/integers", origin=origin).outputs[0]

        def int8(weights: np.ndarray, scales: np.ndarray, what: str, attrs: object) -> str:
            w_dq = add_dequantize(graph, const(weights, f"{what}_weights"),
                                  QuantParams.make(scales, 0, None if scales.size == 1 else 0),
                                  name=f"{conv.name}/{what}_dequantize", origin=origin)
            return node(Op.CONV if attrs else conv.op, [x_int, w_dq.outputs[0]], what,
                        attrs=attrs)

        def window(sums: str, kernel: tuple[int, ...]) -> str:
            return node(conv.op, [sums, const(np.ones((1, 1, *kernel), F32), "box_kernel")],
                        "box_sum")

        convs = _accumulators(parts, int8, window)
        acc = node(Op.ADD, convs, "accumulator")
        y = const(scale.reshape(shape), "scale")
        if bias is None:
            node(Op.MUL, [acc, y], "dequantize", out)
            return
        y = node(Op.MUL, [acc, y], "dequantize")
        node(Op.ADD, [y, const(bias.reshape(shape), "bias")], "bias", out)

    rebuild(graph, [conv], build)
    log.debug("%s: weights beyond s8 → main + box-sum convolutions", conv)


def _rewrite_dynamic(graph: Graph, node: Node) -> None:
    """A dynamically quantized Conv / MatMul (``acc`` in int32) as its main and box-sum nodes,
    each reading the run-time src zero point and writing its exact sums in float32, and their
    Add: quantize_dynamic's Cast of ``acc`` to float32 goes with the node, its readers reading
    the Add; any other reader reads ``acc`` from a Cast of the sum back to int32 (exact:
    integers below 2^24)."""
    assert node.fused is not None
    fused, acc, origin = node.fused, node.outputs[0], list(node.origin)
    cast, _ = sole_reader(graph, acc)
    if cast is not None and not (cast.op is Op.CAST
                                 and graph.info(cast.outputs[0]).dtype is DType.F32):
        cast = None
    info = graph.info(acc)
    w = graph.constant(node.inputs[1])
    assert w is not None
    real = w.astype(np.int64) - fused.wei_zero_point
    parts = split(real, node.attrs.group) if node.op is Op.CONV else split_matmul(real)

    def const(data: np.ndarray, what: str) -> str:
        return graph.add_constant(graph.unique_name(f"{node.name}/{what}"), data).name

    def int8(weights: np.ndarray, scales: np.ndarray, what: str, attrs: object) -> str:
        inputs = [node.inputs[0], const(weights, f"{what}_weights"), *node.inputs[2:]]
        new = graph.add_node(Op.CONV if attrs else node.op, inputs,
                             [graph.unique_name(f"{acc}/{what}")], attrs or node.attrs,
                             name=f"{node.name}/{what}", origin=origin)
        graph.set_info(new.outputs[0], infer_into(graph, new)[0].with_dtype(DType.F32))
        chain = [] if np.all(scales == 1) else [Scale.of(scales)]
        new.fused = Fused(chain=chain, src_zero_point_port=fused.src_zero_point_port,
                          absorbed=list(fused.absorbed), notes=list(fused.notes))
        return new.outputs[0]

    def window(sums: str, kernel: tuple[int, ...]) -> str:  # one group: the narrow box sum's
        ones = const(np.ones((1, 1, *kernel), F32), "box_kernel")
        new = graph.add_node(Op.CONV, [sums, ones], [graph.unique_name(f"{acc}/box_sum")],
                             node.attrs, name=f"{node.name}/box_sum", origin=origin)
        infer_into(graph, new)
        return new.outputs[0]

    def build() -> None:
        total = cast.outputs[0] if cast is not None else graph.unique_name(f"{acc}/sum")
        graph.add_node(Op.ADD, _accumulators(parts, int8, window), [total],
                       name=f"{node.name}/accumulator", origin=origin,
                       infos=[info.with_dtype(DType.F32)])
        if cast is None:
            graph.add_node(Op.CAST, [total], [acc], CastAttrs(DType.S32),
                           name=f"{node.name}/as_int32", origin=origin, infos=[info])

    rebuild(graph, [node] if cast is None else [node, cast], build)
    log.debug("%s: weights beyond s8 → main + box-sum nodes (dynamic)", node)
