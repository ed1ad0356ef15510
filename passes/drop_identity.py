"""Drop Identity and (inference) Dropout nodes; a Transpose that moves no data becomes a Reshape.

Identity: ``y = x``. Dropout in inference: ``y = x`` (the importer refuses training_mode and
a used mask output, so the IR's Dropout has one input and one output). Both are bypassed: the
readers of y read x. Exact (no arithmetic).

Names: when y is a graph output, its name must survive. The producer of x is then rebuilt
writing y (passes/replace.py, as OpenVINO's ``replace_output_update_name``); x's other readers
read y. Declined, with the reason recorded, when that cannot be done: x is a graph input, a
constant or itself a graph output (both names must stay), or the node has extra outputs.

Transpose: a permutation that keeps the dims of size > 1 in their order moves only size-1
dims — ``[197, 1, 768]`` → ``[1, 197, 768]`` of batch-1 attention (torch's ``transpose(0, 1)``
around ``nn.MultiheadAttention``), NCHW → NHWC of a 1x1 image — so its row-major output holds
the input's bytes in the same order: it is a Reshape to its output shape (OpenVINO's
``TransposeToReshape``). Exact (no arithmetic). The later passes then see a shape op, which a
MatMul's post-op chain walks through (passes/matmul_reshape.py) and a dequantize moves
through, where a Transpose stops the chain.
"""

from __future__ import annotations

import logging

from qfuse.ir import Graph, Node, Op
from qfuse.ir.ops import ReshapeAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.replace import bypass_keeping_name, replace_nodes

log = logging.getLogger(__name__)

OPS = (Op.IDENTITY, Op.DROPOUT)


def run(graph: Graph, ctx: PassContext) -> int:
    count = 0
    for node in [n for n in graph.topo_order() if n.op in OPS]:
        ctx.visit(node)
        if len(node.outputs) != 1 or len(node.inputs) != 1:
            ctx.decline(node, f"has {len(node.inputs)} inputs and {len(node.outputs)} "
                              "outputs, want 1 and 1")
            continue
        reason = bypass_keeping_name(graph, node)
        if reason is not None:
            ctx.decline(node, reason)
            continue
        count += 1
    for node in [n for n in graph.topo_order() if n.op is Op.TRANSPOSE]:
        if _moves_no_data(graph, node):
            ctx.visit(node)
            _as_reshape(graph, node)
            count += 1
    return count


def _moves_no_data(graph: Graph, node: Node) -> bool:
    """The permutation keeps the order of the input's dims of size > 1 (module docstring)."""
    shape = graph.info(node.inputs[0]).shape
    perm = tuple(node.attrs.perm)
    if len(perm) != len(shape) or perm == tuple(range(len(shape))):
        return False
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)


def _as_reshape(graph: Graph, node: Node) -> None:
    out = node.outputs[0]
    info = graph.info(out)

    def build() -> None:
        graph.add_node(Op.RESHAPE, [node.inputs[0]], [out], ReshapeAttrs(tuple(info.shape)),
                       name=node.name, infos=[info], origin=node.origin)

    replace_nodes(graph, [node], build)
