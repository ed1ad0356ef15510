"""An int8 convolution over a one-pixel-wide image runs over the same image seen one pixel high.

``Conv(x, W)`` on ``x[N, C, H, 1]`` with a kernel ``(k_h, 1)`` and no padding along the width —
a 1-D convolution written as a 2-D one with the sequence along the height (JAX's and
TensorFlow's ``conv1d`` exported through jax2tf: magika's byte classifier, 256 → 512 channels,
k = 5 over 512 positions) — is the convolution of ``x`` viewed as ``[N, C, 1, H]`` with the
kernel ``(1, k_h)``: the strides, pads and dilations of the height become the width's, the
weights ``[O, I, k_h, 1]`` are viewed as ``[O, I, 1, k_h]``, and the output ``[N, O, 1, H']`` is
viewed back as ``[N, O, H', 1]``. With one pixel along the other dim both views are the same
bytes in every layout (two Reshapes, no copy), and each output is the same integer sum of the
same products, with the same chain after it: bit-exact.

Why: oneDNN 3.2's int8 kernels block the output width (a brgemm's rows, the jit kernels'
``ow`` loop): over a width of 1 they run one output pixel a block. Measured on a 2-core AMD
EPYC with AVX-512 VNNI, 2 threads, u8/s8 → s8: magika's 256 → 512, k 5, 512 positions 977 →
318 µs (brgconv both ways); 16 → 32, k 3, 2000 positions 22.5 → 7.6 µs (``jit_int8`` →
brgconv); 512 → 512, k 3, 50 positions 140 → 40 µs; depthwise 256 channels, k 5, 512
positions 20 → 9 µs (brdgmm), s8 50 → 10 µs (``jit_int8``); under ``ONEDNN_MAX_CPU_ISA=AVX2``
never slower (1373 → 1268 µs, depthwise 97 → 18 µs). A 1-D ``Conv`` (``[N, C, L]``, PyTorch's
``Conv1d``) already runs along the width.

Applied to fused int8 convolutions of rank 4 with ``x``'s width 1, kernel width 1 and no
width padding (then the output's width is 1 too), a kernel height and an output height above
1 (oneDNN's 1x1 kernels see the pixels as one dim either way). A chain
operand of the output's shape (a residual) is viewed the same way; a chain operand of another
shape that is not one along the height (broadcast along it) leaves the convolution as it is.
Float convolutions stay: their float sums could be taken in another order. The pass runs last
(after post-op fusion, as strided_pointwise_conv). Composer option ``wide_conv``.
"""

from __future__ import annotations

import dataclasses
import logging

from qfuse.ir import Graph, Node, Op, TensorInfo
from qfuse.ir.ops import ConvAttrs, ReshapeAttrs
from qfuse.passes.base import PassContext, rewrite_where
from qfuse.passes.replace import replace_nodes

log = logging.getLogger(__name__)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("wide_conv"):
        return 0
    return rewrite_where(graph, ctx, Op.CONV, _applies, _rewrite)


def _applies(graph: Graph, node: Node) -> bool:
    attrs: ConvAttrs = node.attrs
    src = graph.info(node.inputs[0])
    out = graph.info(node.outputs[0])
    weights = graph.constant(node.inputs[1])
    if (node.fused is None or not src.dtype.is_quantized or len(src.shape) != 4
            or len(out.shape) != 4 or len(attrs.kernel_shape) != 2 or weights is None
            or weights.ndim != 4 or node.fused.src_zero_point_port is not None):
        # (a run-time source zero point: dynamic quantization, whose float sums stay as they are)
        return False
    if (src.shape[3] != 1 or attrs.kernel_shape[1] != 1 or attrs.pads[1] or attrs.pads[3]
            or out.shape[3] != 1 or out.shape[2] <= 1 or attrs.kernel_shape[0] == 1):
        # (a 1x1 kernel: oneDNN's 1x1 kernels see the pixels as one dim either way)
        return False
    return all(_fits(graph.info(value).shape) for value in node.inputs[2:] if value)


def _fits(shape: tuple[int, ...]) -> bool:
    """Can an input after the weights (the bias, a chain operand broadcast to the output's
    shape) go with the rewrite: one value along the height (the bias, a per-channel or
    per-tensor operand), or of rank 4 (its width is the output's, 1: a residual)."""
    return len(shape) < 2 or shape[-2] == 1 or len(shape) == 4


def _wide_shape(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """A fitting input's shape seen with the height as the width; None when it needs no
    view (one value along the height)."""
    if len(shape) < 2 or shape[-2] == 1:
        return None
    return (shape[0], shape[1], 1, shape[2])


def _rewrite(graph: Graph, node: Node) -> None:
    attrs: ConvAttrs = node.attrs
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    xinfo, yinfo = graph.info(x), graph.info(y)
    weights = graph.constant(w)
    assert weights is not None
    winfo = graph.info(w)
    o, i, kh, _ = weights.shape
    w_wide = graph.add_constant(graph.unique_name(f"{w}@wide"), weights.reshape(o, i, 1, kh),
                                TensorInfo((o, i, 1, kh), winfo.dtype, winfo.quant)).name
    wide = ConvAttrs((1, attrs.kernel_shape[0]), (1, attrs.strides[0]),
                     (0, attrs.pads[0], 0, attrs.pads[2]), (1, attrs.dilations[0]), attrs.group)
    name, origin = node.name, list(node.origin)
    n, c, h, _ = xinfo.shape
    fused = dataclasses.replace(node.fused, notes=[  # type: ignore[arg-type]
        *node.fused.notes,  # type: ignore[union-attr]
        f"over its {h}x1 source seen as 1x{h} (oneDNN's int8 kernels block the output "
        "width)"])
    meta = dict(node.meta)
    operands = list(node.inputs[2:])

    def view(value: str, shape: tuple[int, ...], suffix: str) -> str:
        info = graph.info(value)
        out = graph.unique_name(f"{value}@{suffix}")
        graph.add_node(Op.RESHAPE, [value], [out], ReshapeAttrs(shape),
                       name=graph.unique_name(f"{name}/{suffix}"),
                       infos=[TensorInfo(shape, info.dtype, info.quant)], origin=origin)
        return out

    def build() -> None:
        inputs = [view(x, (n, c, 1, h), "wide"), w_wide]
        for value in operands:
            shape = _wide_shape(graph.info(value).shape) if value else None
            inputs.append(value if shape is None else view(value, shape, "wide"))
        out = graph.unique_name(f"{y}@wide")
        yn, yc, yh, _ = yinfo.shape
        conv = graph.add_node(Op.CONV, inputs, [out], wide, name=name,
                              infos=[TensorInfo((yn, yc, 1, yh), yinfo.dtype, yinfo.quant)],
                              origin=origin)
        conv.fused, conv.meta = fused, meta
        graph.add_node(Op.RESHAPE, [out], [y], ReshapeAttrs(yinfo.shape),
                       name=graph.unique_name(f"{name}/tall"), infos=[yinfo], origin=origin)

    replace_nodes(graph, [node], build)
    log.debug("%s: a %dx1 source seen as 1x%d", name, h, h)
