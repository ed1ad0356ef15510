"""Softmax / LayerNormalization with an integer source and/or an integer output: one node, the
DequantizeLinear before it and the output quantize after it folded in (oneDNN 3.2's int8
softmax and layer normalization; docs/design.md, pass 6 for ops that are not compute ops).

Pattern: N = Softmax(x) or LayerNormalization(x, γ, β) in float32 with

- an *integer source*: ``x = DequantizeLinear(x_q, s, zp)``, per tensor, x_q a non-constant
  u8/s8 activation (LayerNormalization only, see below), and/or
- an *integer output*: N's output read only by a quantize-only FakeQuantize F (u8/s8, per
  tensor) that is a dst scale and an integer zero point onto the whole type (``dst_quant``).

Rewrite: N reads x_q (else x) and writes F's output (else its own), with
``Fused(chain=[Quantize(F)] or [], src_zero_point=zp, src_scale=s)``. Its meaning
(ir/chain.py, runtime/reference/fused.py), exactly the nodes it replaces:

    x   = f32(x_q - zp)·s        the DequantizeLinear              (integer source)
    y   = N(x, γ, β)             the op's reference (ONNX Runtime's float32 kernels)
    out = F(y)                   the FakeQuantize, stored as u8/s8  (integer output)

so the reference interpreter gives bit-identical outputs before and after the rewrite.

What oneDNN 3.2 computes (measured on this machine, tests/compiler/test_lower_norm.py): both
primitives take u8/s8 src and dst with a src and a dst scale (mask 0), on jit kernels
(softmax ``jit:avx512_core_fp16``, layer normalization ``jit:uni``; on AVX2 the int8-dst
softmax is ``ref:any`` and the lowering splits it again), and no zero points (unimplemented). The dst is ``saturate(rint(y/s_dst))``. The src scale, however, multiplies
the *output* — ``dst = s_src·op(src)/s_dst`` — it does not dequantize the source. Hence:

- Softmax: ``softmax(s·(q - zp))`` depends on s (a temperature): there is no integer source.
  The DequantizeLinear before a Softmax is folded into its producer instead, which then
  writes float32 (passes/fuse_post_ops.py); here only the output quantize is taken, and only
  with zero point 0 (the primitive has no dst zero point and no shift to fold one into).
- LayerNormalization is shift-invariant and ``LN_ε(s·(q - zp)) = LN_{ε/s²}(q)`` for s > 0
  (``(q - m)·s / sqrt(s²·var + ε) = (q - m) / sqrt(var + ε/s²)``): the lowering gives the
  primitive the integer source with ε' = ε/s² and no src scale. A dst zero point folds into
  the shift: ``rint(y/s_d) + zp = rint((y + zp·s_d)/s_d)`` (zp an integer).

Both primitives round differently from ONNX Runtime's kernels (float ulps), so the kernels
agree with this reference to within 1 LSB, on ≥ 99.9 % of the elements (the lowering tests
state the measured figures). A node that matches a side but fails its check keeps that side
in float32, with the reason recorded (on the DequantizeLinear or the FakeQuantize left
standalone).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.ir.chain import ChainOp, Fused, Quantize, dst_quant
from qfuse.ir.ops import LayerNormAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.post_op_match import retarget
from qfuse.passes.propagate_dequantize import dequantize_of
from qfuse.passes.quant_utils import per_tensor_quantize, quantize_only, remove_if_unused

log = logging.getLogger(__name__)

NORM_OPS = frozenset({Op.SOFTMAX, Op.LAYER_NORM})
NO_INT_SOURCE = ("oneDNN's softmax has no dequantizing integer source: its src scale "
                 "multiplies the output (dst = s_src·softmax(src)/s_dst), and softmax(s·x) "
                 "depends on s")


@dataclass
class _Rewrite:
    """What one node takes: its source (and the DequantizeLinear read through), its output."""

    src: str
    dq: Node | None = None
    src_scale: float | None = None
    src_zero_point: int = 0
    fq: Node | None = None
    chain: list[ChainOp] = field(default_factory=list)


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for node in graph.topo_order():
        if node.op not in NORM_OPS or node.fused is not None:
            continue
        if _fuse(graph, ctx, ctx.visit(node)):
            changed += 1
    return changed


def _fuse(graph: Graph, ctx: PassContext, node: Node) -> bool:
    rewrite = _Rewrite(node.inputs[0])
    src = _source(graph, node)
    if isinstance(src, tuple):
        rewrite.dq, rewrite.src_scale, rewrite.src_zero_point = src
        rewrite.src = rewrite.dq.inputs[0]
    elif src is not None:  # the DequantizeLinear stays standalone
        dq = graph.producer(node.inputs[0])
        assert dq is not None
        ctx.decline(dq, f"{node.op.value} source: {src}")
    out = _output(graph, node)
    if isinstance(out, tuple):
        rewrite.fq, item = out
        rewrite.chain = [item]
    elif out is not None:  # the FakeQuantize stays standalone
        ctx.decline(graph.consumers(node.outputs[0])[0][0], f"{node.op.value} output: {out}")
    if rewrite.dq is None and rewrite.fq is None:
        return False
    _commit(graph, node, rewrite)
    return True


def _source(graph: Graph, node: Node) -> tuple[Node, float, int] | str | None:
    """(DequantizeLinear, s, zp) when the node can read the integer source, else why not
    (None: the source is no DequantizeLinear of an integer activation)."""
    found = dequantize_of(graph, node.inputs[0])
    if found is None:
        return None
    dq, p = found
    if not p.dtype.is_quantized:
        return None
    if node.op is Op.SOFTMAX:
        return NO_INT_SOURCE
    if not p.per_tensor:
        return f"per-channel dequantize along axis {p.axis} (one source scale is folded)"
    s = float(p.scale[0])
    attrs: LayerNormAttrs = node.attrs
    if not (math.isfinite(s) and s > 0):
        return f"dequantize scale {s:g} is not positive (LN(s·x) = LN(x) needs s > 0)"
    if not math.isfinite(float(np.float32(attrs.epsilon / (s * s)))):
        return f"epsilon / s² overflows float32 (s = {s:g})"
    if any(graph.uses(o) for o in node.outputs[1:]):
        return "the Mean / InvStdDev outputs are used"
    return dq, s, int(p.zero_point[0])


def _output(graph: Graph, node: Node) -> tuple[Node, Quantize] | str | None:
    """(FakeQuantize, its chain item) when the node can write the integer output, else why
    not (None: the output is not read by a quantize-only FakeQuantize alone)."""
    out = node.outputs[0]
    readers = graph.consumers(out)
    if out in graph.outputs or len(readers) != 1:
        return None
    fq = readers[0][0]
    if quantize_only(graph, fq) is None:
        return None
    item = per_tensor_quantize(graph, fq)
    if item is None:
        return "the quantize is per channel or has non-constant ranges (one dst scale)"
    if node.op is Op.LAYER_NORM and any(graph.uses(o) for o in node.outputs[1:]):
        return "the Mean / InvStdDev outputs are used"
    found = dst_quant(item)
    if isinstance(found, str):
        return found
    if node.op is Op.SOFTMAX and found[1]:
        return (f"zero point {found[1]}: oneDNN's softmax takes no dst zero point (and has no "
                "shift to fold it into)")
    return fq, item


def _commit(graph: Graph, node: Node, rewrite: _Rewrite) -> None:
    absorbed = [o for n in (rewrite.dq, node, rewrite.fq) if n is not None for o in n.origin]
    fused = Fused(chain=rewrite.chain, src_zero_point=rewrite.src_zero_point,
                  src_scale=rewrite.src_scale, absorbed=list(dict.fromkeys(absorbed)))
    final = rewrite.fq if rewrite.fq is not None else node
    new = retarget(graph, node, inputs=[rewrite.src, *node.inputs[1:]],
                   output=final.outputs[0], absorbed=[rewrite.fq] if rewrite.fq else [],
                   fused=fused)
    if rewrite.dq is not None:
        remove_if_unused(graph, rewrite.dq)
    log.debug("%s: reads %s, writes %s", new, graph.info(new.inputs[0]).dtype.name,
              graph.info(new.outputs[0]).dtype.name)
