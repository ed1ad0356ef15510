"""A DequantizeLinear left after an integer nearest Resize is written by the Resize kernel.

propagate_dequantize moves ``DQ(q) → Resize(nearest)`` to ``Resize(q) → DQ`` so int8 data
flows through the Resize. When the dequantized value then feeds only float32 consumers that
cannot read the 8-bit source — PP-OCRv4 det's FPN adds ``Resize(y)`` to the RSE layer's
``x + x·gate``, which runs as a float32 gate chain (passes/fuse_post_ops.py ``_fuse_gate``)
— the DQ stays behind as its own reorder kernel over the resized tensor. oneDNN's
resampling primitive writes float32 from a u8 / s8 source and takes eltwise and binary
post-ops (measured jit:avx2 with both), so the Resize absorbs the DQ:

    Resize (q → f32, nearest: element copies, exact)  then  Shift(-zp), Scale(s, exact)

i.e. ``f32(q - zp)`` exactly (a small integer), then ``f32((q - zp)·s)`` rounded once by its
own multiply — bit for bit what DequantizeLinear computes (ir/chain.Scale.exact, the same
form as fuse_post_ops' output dequantize). One kernel less, and no 8-bit tensor written and
read again.

Runs after every pass that could take the DQ itself (fuse_post_ops' residual sums and
requantizations, fuse_quantized_norm's integer-source norms): a DQ still standing then is a
kernel of its own. Conditions: the Resize is nearest, not already fused, changes a size, its
integer output is read only by the DQ and is not a graph output; no quantize reads the DQ
(a requantize pair runs as one integer reorder, which writes no float32 tensor); the DQ's
scale and zero point are constants, per tensor or per channel along axis 1. The lowering (compiler/lower/
lower_resize.py) runs oneDNN's resampling with the chain as post-ops where oneDNN's indices
are ONNX's, and the reference (``evaluate_fused``) in numpy otherwise.
"""

from __future__ import annotations

import dataclasses
import logging

from qfuse.ir import Graph, Node, Op
from qfuse.ir.chain import Fused, Scale, Shift
from qfuse.ir.ops import ResizeAttrs, ResizeMode
from qfuse.passes.base import PassContext
from qfuse.passes.post_op_match import retarget
from qfuse.passes.quant_utils import DqParams, dq_params

log = logging.getLogger(__name__)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("fold_resize_dequantize"):
        return 0
    changed = 0
    for dq in graph.topo_order():
        if dq.op is not Op.DEQUANTIZE_LINEAR or not graph.has_node(dq.name):
            continue
        resize = graph.producer(dq.inputs[0])
        if resize is None or resize.op is not Op.RESIZE:
            continue
        ctx.visit(dq)
        found = _params(graph, resize, dq)
        if isinstance(found, str):
            ctx.decline(dq, f"fold_resize_dequantize: {found}")
            continue
        _fold(graph, resize, dq, found)
        changed += 1
    return changed


def _params(graph: Graph, resize: Node, dq: Node) -> DqParams | str:
    """The dequantize's parameters when the Resize can write it (module docstring), or why
    not."""
    attrs: ResizeAttrs = resize.attrs
    q = resize.outputs[0]
    info = graph.info(q)
    if resize.fused is not None:
        return f"{resize} already carries a chain"
    if attrs.mode is not ResizeMode.NEAREST:
        return f"{resize} is {attrs.mode.value}, not nearest"
    if not info.dtype.is_quantized or graph.constant(dq.inputs[0]) is not None:
        return f"{resize} does not output an integer activation"
    if tuple(attrs.sizes) == graph.info(resize.inputs[0]).shape:
        return f"{resize} changes no size (it is its input)"
    if q in graph.outputs or len(graph.consumers(q)) != 1:
        return f"'{q}' has readers besides {dq}"
    requantize = next((r for r, _ in graph.consumers(dq.outputs[0])
                       if r.op is Op.FAKE_QUANTIZE), None)
    if requantize is not None:
        return (f"{requantize} requantizes it (the pair runs as one integer reorder, "
                "no float32 tensor)")
    p = dq_params(graph, dq)
    if p is None:
        return "scale or zero point is not a constant"
    if not p.per_tensor and (p.axis != 1 or info.rank < 2):
        return f"per-axis along {p.axis}, not the channel axis 1"
    return p


def _fold(graph: Graph, resize: Node, dq: Node, p: DqParams) -> None:
    chain = [Shift.of(-p.zero_point), dataclasses.replace(Scale.of(p.scale), exact=True)]
    fused = Fused(chain=chain, absorbed=list(dq.origin))
    out = dq.outputs[0]
    retarget(graph, resize, inputs=list(resize.inputs), output=out, absorbed=[dq], fused=fused,
             info=graph.info(out))
    log.debug("%s writes the dequantized '%s'", resize, out)
