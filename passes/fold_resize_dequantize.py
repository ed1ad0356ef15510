"""A DequantizeLinear left after an integer nearest Resize is written by the Resize kernel, or
runs before it on the smaller map where the Resize enlarges.

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

Where the Resize enlarges its input on oneDNN, the dequantize moves before it instead: ``DQ(q)
→ Resize``, the dequantize a reorder on the smaller map and the Resize copying float32 values
with no post-ops (quant_utils ``move_before``; exact, since a nearest Resize copies elements and
the dequantize is elementwise, per tensor or per channel). oneDNN 3.2's jit resampling runs its
post-ops slowly: PP-OCRv4 det's x2 upsampling of 96 channels 60x80 took 1.38 ms u8 → f32 with
the dequantize as post-ops, 0.39 ms without them, the f32 copy 0.13–0.22 ms and the
dequantize reorder on the small map 0.16 ms (2 threads, AVX2). PP-OCRv4 det NNCF 0.95x, QDQ
0.98x, PP-OCRv5 det 0.96x, PP-OCRv6 det 0.97–0.98x (interleaved); bit-identical.

Except where the enlargement is by whole factors of the spatial dims and the dequantize has
one zero point: the dequantize then stays with the Resize, and the lowering
(compiler/lower/lower_resize.py ``_copied_runs``) runs both as one reorder from a view of
the 8-bit map that repeats each element (stride 0; output index ``o`` of a dim enlarged k
times reads ``o // k``, the index oneDNN's and ONNX's nearest read there) into the float32
output, the zero point and scale as the reorder's own: ``f32(q - zp)·s`` rounded once, as the
dequantize (a zero point is checked once at compile time against numpy on every byte value:
oneDNN 3.2's reorders drop it in some layout changes, compiler/lower/reorder_check.py; where
the check fails the resampling takes the chain as post-ops). 96 channels 60x80 → 2x: the
dequantize on the small map and the float32 resampling 50 + 51 us, the one reorder 59 us
(2-core AVX-512 EPYC).

Runs after every pass that could take the DQ itself (fuse_post_ops' residual sums and
requantizations, fuse_quantized_norm's integer-source norms): a DQ still standing then is a
kernel of its own. Conditions: the Resize is nearest, not already fused, changes a size, its
integer output is read only by the DQ and is not a graph output; the DQ's scale and zero
point are constants, per tensor or per channel along axis 1.

A DQ whose only reader is a per-tensor quantize into another scale (a requantization: the
FPN's Concat scale) is folded with it: the chain then ends in that Quantize, and the Resize
writes the requantized integers — ``f32(q − zp)·s`` rounded once, then ONNX's
``saturate(rint(x / s2) + zp2)``, the requantize kernel's own operations — instead of an 8-bit
tensor a requantize kernel reads again (PP-OCRv4 det NNCF: two 0.1 ms kernels; an enlarging
Resize's requantize has moved before it already, passes/quantize_before_reshape.py). The
lowering (compiler/lower/lower_resize.py) runs oneDNN's resampling with the chain as post-ops
where oneDNN's indices are ONNX's, and the reference (``evaluate_fused``) in numpy otherwise.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.ir.chain import ChainOp, Fused, Quantize, Scale, Shift
from qfuse.ir.ops import ResizeAttrs, ResizeMode
from qfuse.passes.base import PassContext
from qfuse.passes.post_op_match import retarget
from qfuse.passes.quant_utils import DqParams, dq_params, move_before, per_tensor_quantize
from qfuse.runtime.reference.ops_shape import (
    onednn_nearest_mismatch,
    whole_factor_enlargement,
)

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
        if found[1] is None and _enlarges(graph, resize) and not _repeats(graph, resize,
                                                                         found[0]):
            move_before(graph, resize, [dq])  # onto the smaller map (module docstring)
            log.debug("%s moved before %s", dq, resize)
        else:
            _fold(graph, resize, dq, *found)
        changed += 1
    return changed


def _enlarges(graph: Graph, resize: Node) -> bool:
    """An enlarging Resize that runs on oneDNN's resampling (where oneDNN's indices are
    ONNX's; the numpy gather the lowering runs otherwise picks dequantized values of the small
    input itself, a kernel less)."""
    x = graph.info(resize.inputs[0])
    return (graph.info(resize.outputs[0]).size > x.size
            and onednn_nearest_mismatch(resize.attrs, x.shape) is None)


def _repeats(graph: Graph, resize: Node, p: DqParams) -> bool:
    """An enlargement by whole factors of the spatial dims whose dequantize has one zero
    point: the lowering copies and dequantizes in one reorder (lower_resize
    ``_copied_runs``), so the dequantize stays with the Resize."""
    return np.unique(p.zero_point).size == 1 and whole_factor_enlargement(
        graph.info(resize.inputs[0]).shape, graph.info(resize.outputs[0]).shape)


Requantize = tuple[Node, Quantize] | None


def _params(graph: Graph, resize: Node, dq: Node) -> tuple[DqParams, Requantize] | str:
    """The dequantize's parameters and the requantization it feeds, if one, when the Resize
    can write them (module docstring), or why not."""
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
    p = dq_params(graph, dq)
    if p is None:
        return "scale or zero point is not a constant"
    if not p.per_tensor and (p.axis != 1 or info.rank < 2):
        return f"per-axis along {p.axis}, not the channel axis 1"
    requantize = _requantize(graph, dq)
    if isinstance(requantize, str):
        return requantize
    return p, requantize


def _requantize(graph: Graph, dq: Node) -> Requantize | str:
    """The requantizing FakeQuantize the Resize writes as well (the DQ's only reader, per
    tensor) with its chain item, None when no quantize reads the DQ, or why the pair cannot
    be folded."""
    readers = [r for r, _ in graph.consumers(dq.outputs[0])]
    fqs = [r for r in readers if r.op is Op.FAKE_QUANTIZE]
    if not fqs:
        return None
    if len(readers) != 1 or dq.outputs[0] in graph.outputs:
        return (f"{fqs[0]} requantizes it and the dequantized value has other readers (one "
                "kernel writes one output)")
    item = per_tensor_quantize(graph, fqs[0])
    if item is None:
        return f"{fqs[0]} is not a per-tensor quantize with constant ranges"
    return fqs[0], item


def _fold(graph: Graph, resize: Node, dq: Node, p: DqParams, requantize: Requantize) -> None:
    chain: list[ChainOp] = [Shift.of(-p.zero_point),
                            dataclasses.replace(Scale.of(p.scale), exact=True)]
    absorbed, out = [dq], dq.outputs[0]
    if requantize is not None:  # the requantization too: its quantize is the chain's end
        fq, item = requantize
        chain.append(item)
        absorbed, out = [dq, fq], fq.outputs[0]
    fused = Fused(chain=chain, absorbed=[o for n in absorbed for o in n.origin])
    retarget(graph, resize, inputs=list(resize.inputs), output=out, absorbed=absorbed,
             fused=fused, info=graph.info(out))
    log.debug("%s writes '%s'", resize, out)
