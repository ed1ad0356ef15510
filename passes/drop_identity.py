"""Drop Identity and (inference) Dropout nodes.

Identity: ``y = x``. Dropout in inference: ``y = x`` (the importer refuses training_mode and
a used mask output, so the IR's Dropout has one input and one output). Both are bypassed: the
readers of y read x. Exact (no arithmetic).

Names: when y is a graph output, its name must survive. The producer of x is then rebuilt
writing y (passes/replace.py, as OpenVINO's ``replace_output_update_name``); x's other readers
read y. Declined, with the reason recorded, when that cannot be done: x is a graph input, a
constant or itself a graph output (both names must stay), or the node has extra outputs.
"""

from __future__ import annotations

import logging

from qfuse.ir import Graph, Op
from qfuse.passes.base import PassContext
from qfuse.passes.replace import bypass_keeping_name

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
    return count
