"""A quantizer on constants whose integers no kernel reads becomes a float32 constant, with the
nodes that compute from it and constants alone.

NNCF quantizes every float parameter a model reads, the attention-bias tables of LeViT and
EfficientViT-M included: a Q/DQ pair on the table ``[heads, offsets]``, a Gather of it by a
constant index map, a Slice per head, and an Add into that head's attention logits.
fold_weight_quantize leaves ``DequantizeLinear(s8 table)``, and constant_fold folds nothing past
a quantization op (the passes need a weight's integers), so the Gather and the Slices stayed
run-time nodes: the lowering evaluated them once, at compile time, but the fusion passes saw a
run-time operand of another shape than the logits — the logits MatMul stopped at its output
quantize, and a dequantize kernel and an Add kernel followed it, per head.

Here a quantization op whose inputs are all constants is evaluated now, with every node after
it that computes from constants alone (in topological order), by the reference interpreter's
own op table as constant_fold evaluates: the folded graph computes exactly what the reference
computes on the unfolded one (bit-exact), and the lowering had evaluated the same values.
Declined (nothing folded) when one of those values reaches a Conv, ConvTranspose, Gemm or
MatMul, or another quantization op — there the integers are the weights (a Transpose of a
MatMul's quantized weights stays) — and when no node computes from it alone: a ``DQ(c)`` an Add
reads directly is already a constant operand to the fusion passes. Neither is a decline of
a matched rewrite (a weight's quantizer is the common case), so nothing is recorded.
"""

from __future__ import annotations

import logging

from qfuse.ir import Graph, Node, Op
from qfuse.passes.base import PassContext
from qfuse.passes.constant_fold import QUANTIZATION_OPS, evaluate, replace_by_constants
from qfuse.passes.post_op_match import COMPUTE_OPS

log = logging.getLogger(__name__)

# Readers that would take the integers: a weight's, or a requantize's.
_INTEGER_READERS = frozenset({*COMPUTE_OPS, Op.GEMM, *QUANTIZATION_OPS,
                              Op.DYNAMIC_QUANTIZE_LINEAR})


def run(graph: Graph, ctx: PassContext) -> int:
    count = 0
    for node in graph.topo_order():
        if (node.op not in QUANTIZATION_OPS or node.fused is not None
                or any(graph.constant(v) is None for v in node.inputs if v)):
            continue
        ctx.visit(node)
        after = _computed_from(graph, node)
        if not after:  # weights (None), or read directly by run-time nodes: not declines
            continue
        for member in (node, *after):
            if not _fold(graph, member):
                log.debug("%s: %s does not evaluate to its TensorInfo", node, member)
                break
        else:
            log.debug("folded %s and %s", node, [n.name for n in after])
            count += 1
    if count:
        graph.remove_unused()
    return count


def _computed_from(graph: Graph, node: Node) -> list[Node] | None:
    """The nodes after ``node`` computing from its outputs and constants alone, each after
    the members it reads (a topological order); None when any of those values is read by an
    ``_INTEGER_READERS`` op. Walks the readers only (a weight's quantizer: one step)."""
    known = set(node.outputs)
    members: list[Node] = []
    waiting = list(node.outputs)
    while waiting:
        for reader, _ in graph.consumers(waiting.pop()):
            if reader.op in _INTEGER_READERS:
                return None
            if reader in members or reader.fused is not None or not all(
                    v in known or graph.constant(v) is not None for v in reader.inputs if v):
                continue  # (one waiting for another member is met again from that one)
            members.append(reader)
            known.update(reader.outputs)
            waiting.extend(reader.outputs)
    return members


def _fold(graph: Graph, node: Node) -> bool:
    """``node`` replaced by constants of its outputs (its inputs are constants by now)."""
    values = evaluate(graph, node)
    if values is None:
        return False
    replace_by_constants(graph, node, values)
    return True
