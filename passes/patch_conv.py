"""An int8 convolution whose kernel tiles an image of few channels runs as a 1x1 convolution
over the image's patches.

``Conv(x, W)`` with kernel k_h x k_w, strides equal to the kernel, no padding, no dilation and
one group — a vision transformer's patch embedding (ViT, CLIP, DeiT: 16x16 or 32x32 patches of
the 3-channel image) — reads each input pixel once: ``out[o, i, j] = Σ_{c,a,b} x[c, i·k_h + a,
j·k_w + b]·W[o, c, a, b]``. Rearranged as ``P[c·k_h·k_w + a·k_w + b, i, j] = x[c, i·k_h + a,
j·k_w + b]`` (a Reshape to ``(N, C, H/k_h, k_h, W/k_w, k_w)``, a Transpose to ``(N, C, k_h, k_w,
H/k_h, W/k_w)`` and a Reshape to ``(N, C·k_h·k_w, H/k_h, W/k_w)``: one reorder, the Reshapes
are views) it is a 1x1 convolution of P with the weights ``W`` viewed as ``(O, C·k_h·k_w, 1,
1)``. The same integer products summed in the exact int32 accumulator, the same chain per
output channel, the same output: bit-exact.

Why: oneDNN 3.2 computes an int8 convolution with 3 input channels on ``jit_int8`` kernels that
pad the channels to a vector: ViT-B/32's 32x32 stride-32 patch embedding (3 → 768 channels,
224x224) took 0.27 ms alone and 0.41–0.51 ms inside the model (21–39 % of the int8 peak). As a
1x1 convolution over 3072 channels it runs on ``brgconv_1x1`` at 95 %: 0.12 ms plus a 6 µs
reorder; 16x16 patches 0.18 → 0.12 ms. With 4x4 patches (Swin-T's and ConvNeXt-T's stems: 3 →
96 channels) the direct convolution is faster (0.03 against 0.05 ms), and with many input
channels (a 2x2 stride-2 downsampling of 96 channels) they are equal: the rewrite applies from
``MIN_PATCH`` kernel elements and up to ``MAX_CHANNELS`` input channels (measured on a 2-core
AMD EPYC with AVX-512 VNNI, 2 threads).

Not applied: groups, padding, dilation, strides other than the kernel, an input size the
kernel does not tile exactly, float convolutions (their float sums would be taken in another
order), run-time weights or weight zero points, a run-time source zero point. Composer option
``patch_conv`` (on by default).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np

from qfuse.ir import Graph, Node, Op, TensorInfo
from qfuse.ir.ops import ConvAttrs, ReshapeAttrs, TransposeAttrs
from qfuse.passes.base import PassContext, rewrite_where
from qfuse.passes.replace import replace_nodes

log = logging.getLogger(__name__)

MIN_PATCH = 64  # kernel elements from which the 1x1 convolution is faster (docstring)
MAX_CHANNELS = 4  # input channels up to which oneDNN's direct convolution is slow (docstring)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("patch_conv"):
        return 0
    return rewrite_where(graph, ctx, Op.CONV, _applies, _rewrite)


def _applies(graph: Graph, node: Node) -> bool:
    attrs: ConvAttrs = node.attrs
    fused = node.fused
    src = graph.info(node.inputs[0])
    weights = graph.constant(node.inputs[1])
    kernel = tuple(attrs.kernel_shape)
    return (fused is not None and src.dtype.is_quantized and len(src.shape) == 4
            and len(kernel) == 2 and attrs.group == 1 and tuple(attrs.strides) == kernel
            and not any(attrs.pads) and all(d == 1 for d in attrs.dilations)
            and math.prod(kernel) >= MIN_PATCH and src.shape[1] <= MAX_CHANNELS
            and src.shape[2] % kernel[0] == 0 and src.shape[3] % kernel[1] == 0
            and weights is not None and weights.dtype == np.int8 and weights.ndim == 4
            and fused.wei_zero_point == 0 and fused.src_zero_point_port is None)


def _rewrite(graph: Graph, node: Node) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    xinfo = graph.info(x)
    n, c, h, width = xinfo.shape
    kh, kw = node.attrs.kernel_shape
    oh, ow = h // kh, width // kw
    depth = c * kh * kw
    weights = graph.constant(w)
    assert weights is not None
    o = weights.shape[0]
    w_flat = graph.add_constant(graph.unique_name(f"{w}@patches"),
                                np.ascontiguousarray(weights.reshape(o, depth, 1, 1)),
                                TensorInfo((o, depth, 1, 1), graph.info(w).dtype,
                                           graph.info(w).quant)).name
    name, origin, yinfo = node.name, list(node.origin), graph.info(y)
    fused = dataclasses.replace(node.fused, notes=[  # type: ignore[arg-type]
        *node.fused.notes,  # type: ignore[union-attr]
        f"{kh}x{kw} patches of {c} channels: a 1x1 convolution over {depth} channels "
        f"(oneDNN's int8 kernels for {c} input channels are slow)"])
    meta = dict(node.meta)
    # x viewed as its grid of patches, each patch's values made contiguous (the one reorder),
    # and viewed as the 1x1 convolution's channels
    stages = [("grid", Op.RESHAPE, ReshapeAttrs((n, c, oh, kh, ow, kw)), (n, c, oh, kh, ow, kw)),
              ("cells", Op.TRANSPOSE, TransposeAttrs((0, 1, 3, 5, 2, 4)), (n, c, kh, kw, oh, ow)),
              ("patches", Op.RESHAPE, ReshapeAttrs((n, depth, oh, ow)), (n, depth, oh, ow))]
    bias = list(node.inputs[2:])

    def build() -> None:
        value = x
        for suffix, op, attrs, shape in stages:
            out = graph.unique_name(f"{x}@{suffix}")
            graph.add_node(op, [value], [out], attrs, name=graph.unique_name(f"{name}/{suffix}"),
                           infos=[TensorInfo(shape, xinfo.dtype, xinfo.quant)], origin=origin)
            value = out
        conv = graph.add_node(Op.CONV, [value, w_flat, *bias], [y],
                              ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1), name=name,
                              infos=[yinfo], origin=origin)
        conv.fused, conv.meta = fused, meta

    replace_nodes(graph, [node], build)
    log.debug("%s: %dx%d patches of %d channels as a 1x1 convolution", name, kh, kw, c)
