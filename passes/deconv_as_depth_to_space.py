"""A ConvTranspose whose kernel equals its stride runs as a 1x1 Conv and a DepthToSpace.

``ConvTranspose(x, W)`` with kernel b x b, strides b, no padding, no output padding, one group
(DBNet's and U-Net's upsampling heads) writes each output pixel ``(y·b + i, x·b + j)`` from
one input pixel only: ``out[o, y·b + i, x·b + j] = Σ_c x[c, y, x]·W[c, o, i, j]``. That is a
1x1 convolution with b²·O output channels — channel ``(i·b + j)·O + o`` has the weights
``W[:, o, i, j]`` — followed by ONNX's DepthToSpace in "DCR" mode, which moves channel
``(i·b + j)·O + o`` of pixel (y, x) to channel o of pixel (y·b + i, x·b + j)
(https://onnx.ai/onnx/operators/onnx__DepthToSpace.html). The same integer products, summed
in the same exact int32 (or, in float, each output the same C products), and the same chain
per output channel: every per-channel value of the chain, of the composed attributes (weight
scales, bias, binary and PReLU operands) and of its basic operations (what the unfused mode
runs) is repeated b² times.
Bit-exact; the DepthToSpace is one jit reorder (lower_misc.lower_depth_to_space).

Why: oneDNN 3.2 computes a deconvolution with few output channels on kernels blocked by 16
output channels, as a strided convolution over the output: PP-OCRv4 det's last layer (24 → 1
channel, 2x2 stride 2, 240x320 → 480x640, sigmoid, f32 dst) took 0.76 ms on
``brgconv_strided:avx512_core_vnni`` and on ``jit_uni_int8:avx2`` alike (7.4 M MACs). As a 1x1
convolution to 4 channels (``brgconv_1x1``) and the reorder: 0.17 + 0.04 ms (AVX-512 VNNI), 0.20
+ 0.04 ms (AVX2), measured alone on a 2-core AMD EPYC at 2 threads. With 24 output channels the
deconvolution is as fast or faster (0.15 vs 0.08 + 0.04 ms with VNNI, 0.29 vs 0.28 + 0.05 ms on
AVX2): the rewrite applies below ``MAX_CHANNELS`` output channels only — except where an exact
int8 deconvolution would be split (no VNNI / AMX: ``PassContext.split_int8_deconvolutions``):
oneDNN's AVX2 int8 deconvolution with a source zero point takes no binary post-op, so its
halves run bare and a binary kernel adds them and computes the chain (compiler/lower/
no_vnni.py), where the 1x1 convolution takes the low half or the excess as a post-op like any
convolution. PP-OCRv4 det QDQ's 24 → 24 channel upsampling (2x2, 120x160 → 240x320): hi +
lo + finish 0.48 + 0.48 + 1.63 ms against lo + convolution + reorder 0.27 + 1.57 + 0.12 ms;
det QDQ 0.984x, NNCF 0.993x the latency (in one process, alternating; bit-identical).

Not applied: groups, padding, output padding, dilation, a kernel other than the stride, a
non-square block, run-time weights, chains that read tensors (a residual sum or a binary
operand of the output's shape would need to be laid out as the 1x1 convolution's output), a
per-channel quantize in the chain or a per-channel quantized output. Composer option
``deconv_as_depth_to_space`` (on by default).
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir import Graph, Node, Op, TensorInfo
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs, DepthToSpaceAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.repeat_channels import (
    repeatable,
    repeated_bias,
    repeated_state,
    tiled_quant,
)
from qfuse.passes.replace import replace_nodes

log = logging.getLogger(__name__)

MAX_CHANNELS = 16  # output channels from which oneDNN's deconvolution is as fast (docstring)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("deconv_as_depth_to_space"):
        return 0
    changed = 0
    for node in graph.topo_order():
        b = _block(graph, node, ctx) if node.op is Op.CONV_TRANSPOSE else 0
        if b:
            ctx.visit(node)
            few = graph.info(node.outputs[0]).shape[1] < MAX_CHANNELS
            _rewrite(graph, node, b, "oneDNN's deconvolution computes few output channels in "
                     "blocks of 16" if few else "without VNNI an exact int8 deconvolution's "
                     "split halves would be added by a kernel of their own")
            changed += 1
    if changed:
        graph.remove_unused()  # the ConvTranspose's weights and bias
    return changed


def _block(graph: Graph, node: Node, ctx: PassContext) -> int:
    """The block size b when the rewrite applies to ``node``, else 0."""
    attrs: ConvTransposeAttrs = node.attrs
    x, y = graph.info(node.inputs[0]), graph.info(node.outputs[0])
    weights = graph.constant(node.inputs[1])
    if x.rank != 4 or weights is None or attrs.group != 1:
        return 0
    b = attrs.strides[0]
    square = (tuple(attrs.kernel_shape) == (b, b) == tuple(attrs.strides)
              and weights.shape[2:] == (b, b))
    if (not square or b < 2 or any(attrs.pads) or any(attrs.output_padding)
            or any(d != 1 for d in attrs.dilations)):
        return 0
    n, _, h, w = x.shape
    split = ctx.split_int8_deconvolutions and x.dtype.is_integer
    if y.shape != (n, y.shape[1], h * b, w * b) or (y.shape[1] >= MAX_CHANNELS and not split):
        return 0
    if len(node.inputs) > 2 and node.inputs[2] and graph.constant(node.inputs[2]) is None:
        return 0
    if y.quant is not None and not y.quant.per_tensor:
        return 0
    # a chain reading a tensor (its Residual / TensorOperand items are the composed Sum /
    # TensorBinary post-ops) or quantizing per channel is not repeated
    if node.fused is not None and not repeatable(node.fused.chain):
        return 0
    return b


def _rewrite(graph: Graph, node: Node, b: int, why: str) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    xinfo, out = graph.info(x), graph.info(y)
    reps = b * b
    weights = graph.constant(w)
    assert weights is not None
    c, o = weights.shape[:2]
    # channel (i·b + j)·O + o of the 1x1 convolution: W[:, o, i, j]
    conv_w = np.ascontiguousarray(weights.transpose(2, 3, 1, 0).reshape(reps * o, c, 1, 1))
    wquant = tiled_quant(graph.info(w).quant, reps, 0)  # ConvTranspose's output channels: axis 1
    w_conv = graph.add_constant(graph.unique_name(f"{w}@1x1"), conv_w,
                                TensorInfo(conv_w.shape, graph.info(w).dtype, wquant)).name
    inputs = [x, w_conv, *repeated_bias(graph, node, reps, "@1x1")]
    fused, meta = repeated_state(
        node, reps, f"kernel {b}x{b} = stride: a 1x1 convolution to {reps}·{o} channels and a "
        f"DepthToSpace ({why})")
    name, origin = node.name, list(node.origin)
    n, _, h, width = xinfo.shape
    cells = graph.unique_name(f"{y}@cells")

    def build() -> None:
        conv = graph.add_node(Op.CONV, inputs, [cells],
                              ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1), name=name,
                              infos=[TensorInfo((n, reps * o, h, width), out.dtype, out.quant)],
                              origin=origin)
        conv.fused, conv.meta = fused, meta
        graph.add_node(Op.DEPTH_TO_SPACE, [cells], [y], DepthToSpaceAttrs(b, "DCR"),
                       name=graph.unique_name(f"{name}/depth_to_space"), infos=[out],
                       origin=origin)

    replace_nodes(graph, [node], build)
    log.debug("%s: %dx%d stride-%d ConvTranspose to %d channels as a 1x1 Conv + DepthToSpace",
              name, b, b, b, o)
