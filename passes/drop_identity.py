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

Expand: an Expand read only by elementwise Add / Sub / Mul / Div that broadcast anyway —
``x / Expand(‖x‖, x.shape)`` of torch's ``F.normalize`` — is bypassed: the op broadcasts the
unexpanded tensor to the same output, element for element (ONNX's multidirectional
broadcasting). Only where the expanded tensor is the op's second input, or either input of
Add / Mul (the lowering takes a broadcast second operand; Sub / Div with a broadcast first
one would run in numpy). Exact (no arithmetic). Swin-V2-T: 24 Expand kernels fewer (6.6 ms
of a 144 ms run).
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.ir.ops import ReshapeAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.replace import bypass_keeping_name, replace_nodes

log = logging.getLogger(__name__)

OPS = (Op.IDENTITY, Op.DROPOUT)
BROADCASTING = (Op.ADD, Op.SUB, Op.MUL, Op.DIV)


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
    for node in [n for n in graph.topo_order() if n.op is Op.EXPAND]:
        ctx.visit(node)
        reason = _expand_kept(graph, node)
        if reason is not None:
            ctx.decline(node, reason)
            continue
        graph.replace_all_uses(node.outputs[0], node.inputs[0])
        graph.remove_node(node)
        count += 1
    return count


def _expand_kept(graph: Graph, node: Node) -> str | None:
    """Why the Expand ``node`` stays, or None when its readers broadcast x themselves."""
    out = node.outputs[0]
    if out in graph.outputs:
        return "its output is a graph output"
    x = graph.info(node.inputs[0]).shape
    readers = graph.consumers(out)
    if not readers:
        return "nothing reads it"
    for reader, port in readers:
        if reader.op not in BROADCASTING or len(reader.inputs) != 2:
            return f"read by {reader.op.value} '{reader.name}', which does not broadcast"
        if port == 0 and reader.op in (Op.SUB, Op.DIV):
            return f"the first input of {reader.op.value} '{reader.name}'"
        other = graph.info(reader.inputs[1 - port]).shape
        try:
            shape = tuple(np.broadcast_shapes(x, other))
        except ValueError:
            return f"{reader.op.value} '{reader.name}' would not broadcast it"
        if shape != graph.info(reader.outputs[0]).shape:
            return f"{reader.op.value} '{reader.name}' needs the expanded shape"
    return None


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
