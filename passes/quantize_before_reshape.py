"""A per-tensor quantize after a Reshape-like op moves before it: ``x → Reshape → Q`` becomes
``x → Q → Reshape`` (the Reshape then moves 8-bit values; its output keeps its name).

Where it matters: torch.export writes ResNet's ``avgpool`` then ``flatten`` as ReduceMean (a
GlobalAveragePool at import) and a Reshape, and quantize_static quantizes after the Reshape, so
the pool's output was not read by a quantize: it ran in float32 between a dequantize reorder
and a quantize kernel, where the TorchScript export's GlobalAveragePool → Q is one int8 pooling
kernel (ResNet-18 QDQ exported with dynamo=True: 30 → 28 kernels, as exported by TorchScript).

Exact: a per-tensor quantize is elementwise, ``Q(reshape(x)) = reshape(Q(x))`` value for value.
Only a quantize-only FakeQuantize with one range (scalar ranges: per channel, its axis would
move) that is the Reshape's only reader, and only on a float32 Reshape (an integer one is
already moved by propagate_dequantize).

A nearest Resize that enlarges its input is moved past the same way: each output element is a
copy of one input element, so ``Q(resize(x)) = resize(Q(x))`` too, and the quantize then runs
on the smaller tensor. Where it matters: an FPN that requantizes each upsampled map into its
Concat's scale (PP-OCRv4 det NNCF: a ×8 and a ×4 nearest Resize of the quantized lateral maps,
each quantized again after the Resize). The quantize then meets the dequantize before the
Resize, a requantize its producer's kernel absorbs (passes/fuse_post_ops.py), and the Resize
moves bytes only: its copy goes straight into the Concat's output
(compiler/lower/in_place_concat.py).
"""

from __future__ import annotations

import logging

from qfuse.ir import DType, Graph, Node, Op
from qfuse.ir.ops import ResizeMode
from qfuse.passes.base import PassContext
from qfuse.passes.quant_utils import fq_ranges, quantize_only, rebuild

log = logging.getLogger(__name__)

RESHAPES = (Op.RESHAPE, Op.FLATTEN, Op.SQUEEZE, Op.UNSQUEEZE)


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for fq in [n for n in graph.topo_order() if n.op is Op.FAKE_QUANTIZE]:
        reshape = graph.producer(fq.inputs[0])
        if reshape is None or fq.fused is not None or not (
                reshape.op in RESHAPES or _enlarging_nearest(graph, reshape)):
            continue
        ctx.visit(fq)
        reason = _why_not(graph, reshape, fq)
        if reason:
            ctx.decline(fq, reason)
            continue
        _swap(graph, reshape, fq)
        changed += 1
    return changed


def _enlarging_nearest(graph: Graph, node: Node) -> bool:
    """A nearest Resize whose output has no fewer elements than its input."""
    if node.op is not Op.RESIZE or node.attrs.mode is not ResizeMode.NEAREST:
        return False
    return graph.info(node.outputs[0]).size >= graph.info(node.inputs[0]).size


def _why_not(graph: Graph, reshape: Node, fq: Node) -> str:
    if quantize_only(graph, fq) is None:
        return "not a quantize-only FakeQuantize"
    ranges = fq_ranges(graph, fq)
    if ranges is None or any(r.size != 1 for r in ranges):
        return f"quantizes per channel after a {reshape.op.value} (its axis would move)"
    if graph.info(reshape.inputs[0]).dtype is not DType.F32:
        return f"the {reshape.op.value} reads {graph.info(reshape.inputs[0]).dtype.name}"
    if len(graph.consumers(reshape.outputs[0])) != 1 or reshape.outputs[0] in graph.outputs:
        return f"the {reshape.op.value}'s output has other readers"
    return ""


def _swap(graph: Graph, reshape: Node, fq: Node) -> None:
    x, y = reshape.inputs[0], fq.outputs[0]
    out = graph.info(y)
    quantized = out.with_shape(graph.info(x).shape)
    moved = graph.unique_name(f"{y}/before_{reshape.name}")

    def build() -> None:
        graph.add_node(Op.FAKE_QUANTIZE, [x, *fq.inputs[1:]], [moved], fq.attrs, name=fq.name,
                       infos=[quantized], origin=fq.origin)
        graph.add_node(reshape.op, [moved], [y], reshape.attrs, name=reshape.name,
                       infos=[out], origin=reshape.origin)

    meta = dict(fq.meta)
    rebuild(graph, [reshape, fq], build)
    graph.node(fq.name).meta.update(meta)
    log.debug("%s moved before %s", fq, reshape)
