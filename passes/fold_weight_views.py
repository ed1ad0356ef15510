"""A view of a dequantized constant as the dequantize of a viewed integer constant.

Pattern: Transpose, Reshape, Flatten, Squeeze or Unsqueeze reading ``DQ(q)``, q an integer
constant (a quantized weight). Rewrite: ``view(DQ(q)) = DQ(view(q))`` — the view moves
values, and each keeps its own ``(q - zp)·s`` — with ``view(q)`` computed once (the
reference interpreter's implementation, as passes/constant_fold.py) and the per-channel axis
carried to its new place by the view's shape inference (ir/shapes: a Transpose permutes it, a
Reshape keeping the channel dim moves it). Exact: no arithmetic.

torch.onnx exports a Linear of a PyTorch-quantized model (FX graph mode, ``convert_fx``)
as ``MatMul(x, Transpose(DQ(w_q)))``, w_q the ``[out, in]`` s8 weight per channel along axis
0. The MatMul's lowering takes integer weights only as ``DQ(constant)``: without this pass
the transposed weights are a float32 constant the lowering evaluates once, and every
Linear runs as a float32 matmul between a dequantize and a quantize (Swin-T FX-quantized:
76 float32 matmuls).

Declined, with the reason: the dequantize's parameters are not constants or not the
constant's QuantParams, or a per-channel axis does not survive the view (a Reshape merging
the channel dim with another). The old dequantize stays while it has other readers.
"""

from __future__ import annotations

import logging

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.passes.base import PassContext
from qfuse.passes.constant_fold import evaluate
from qfuse.passes.quant_utils import (
    add_dequantize,
    dq_params,
    infer_into,
    is_op,
    rebuild,
    remove_if_unused,
)

log = logging.getLogger(__name__)

VIEWS = (Op.TRANSPOSE, Op.RESHAPE, Op.FLATTEN, Op.SQUEEZE, Op.UNSQUEEZE)


def run(graph: Graph, ctx: PassContext) -> int:
    count = 0
    # _fold removes only the view it rewrites (and a dequantize): the list stays valid
    for node in [n for n in graph.topo_order() if n.op in VIEWS]:
        dq = graph.producer(node.inputs[0])
        if not is_op(dq, Op.DEQUANTIZE_LINEAR) or graph.constant(dq.inputs[0]) is None:
            continue
        ctx.visit(node)
        reason = _fold(graph, node, dq)  # type: ignore[arg-type]
        if reason is not None:
            ctx.decline(node, reason)
            continue
        log.debug("folded %s into its dequantized constant", node)
        count += 1
    return count


def _fold(graph: Graph, view: Node, dq: Node) -> str | None:
    """Rewrite ``view(DQ(q))`` as ``DQ(view(q))``; None when done, else why not."""
    params = dq_params(graph, dq)
    if params is None:
        return "the dequantize's scale or zero point is not a constant"
    q = dq.inputs[0]
    if graph.info(q).quant != params.quant():
        return "the integer constant's QuantParams differ from its dequantize's"
    twin = graph.add_node(view.op, [q], 1, view.attrs,
                          name=graph.unique_name(f"{view.name}_int"), origin=view.origin)
    info = infer_into(graph, twin)[0]
    values = evaluate(graph, twin)
    graph.remove_node(twin)
    if info.quant is None:
        return (f"the per-channel dequantize's axis {params.axis} does not survive "
                f"{view.op.value}")
    if values is None:
        return f"{view.op.value} of the integer constant does not evaluate to its shape"
    out = view.outputs[0]

    def build() -> None:
        viewed = graph.add_constant(graph.unique_name(f"{q}/{view.name}"), values[0], info)
        add_dequantize(graph, viewed.name, info.quant, out,  # type: ignore[arg-type]
                       origin=[*dq.origin, *view.origin], name=f"{dq.name}/{view.name}")

    rebuild(graph, [view], build)
    remove_if_unused(graph, dq)
    return None
