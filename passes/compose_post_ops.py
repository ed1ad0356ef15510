"""Record the composer's oneDNN mapping on every fused node (docs/design.md, pass 7).

For each node with ``fused`` set: ``compose(chain, channels, dst_dtype, options=ctx.composer)``
with the node's output channels (axis 1 for conv / deconv / pools, the last dim for matmul)
and its output element type. The result goes to ``node.meta["composed"]`` (a
``passes.composer.Composed``: weight scales, bias, post-ops, dst scale / zero point) and the
names of the optimizations that fired, in order and without repeats, to
``node.meta["optimizations"]``, for lowering and ``inspect``. Where a stretch of the post-ops
runs on a few hundred integers, passes/integer_requantize.py shortens it first (the same
results, checked on every one of them). Where the ONNX quantizations
divide (``onnx_divide``), the same chain composed with ·(1/s) instead goes to
``node.meta["composed_multiply"]``, for the kernels on which oneDNN has no fast
implementation taking a binary_div post-op (compiler/lower/lower_compute.emit); the chain's basic operations
(``to_basic``, what the unfused mode runs one primitive each) go to ``node.meta["basic"]``.

fuse_post_ops only extends a chain after compose() accepted it, so a ComposeError here means
that pass (or a later one) is wrong: it is raised, with the node named, not declined.
"""

from __future__ import annotations

import logging

from qfuse.ir import Graph
from qfuse.ir.postops import Composed
from qfuse.passes import integer_requantize
from qfuse.passes.base import PassContext
from qfuse.passes.composer import ComposeError, compose, to_basic
from qfuse.passes.post_op_match import out_channels

log = logging.getLogger(__name__)


def _shortened(composed: Composed, ctx: PassContext) -> Composed:
    """The post-ops passes/integer_requantize.py can shorten, shortened (the same results)."""
    if ctx.composer.on("integer_requantize") and integer_requantize.simplify(composed):
        composed.fired.append("integer_requantize")
    return composed


def run(graph: Graph, ctx: PassContext) -> int:
    count = 0
    for node in graph.topo_order():
        if node.fused is None:
            continue
        ctx.visit(node)
        dst = graph.info(node.outputs[0]).dtype
        try:
            composed = compose(node.fused.chain, channels=out_channels(graph, node),
                               dst_dtype=dst, options=ctx.composer)
        except ComposeError as exc:
            raise AssertionError(f"{node}: fused chain does not compose ({exc}); "
                                 "fuse_post_ops should not have built it") from exc
        node.meta["composed"] = _shortened(composed, ctx)
        if "onnx_divide" in composed.fired:  # lowering's fallback where binary_div is slow
            node.meta["composed_multiply"] = _shortened(compose(
                node.fused.chain, channels=out_channels(graph, node), dst_dtype=dst,
                options=ctx.composer.without("onnx_divide")), ctx)
        node.meta["basic"] = to_basic(node.fused.chain, ctx.composer, [])
        node.meta["optimizations"] = list(dict.fromkeys(composed.fired))
        log.debug("%s: post-ops %s, fired %s", node, composed.describe(),
                  node.meta["optimizations"])
        count += 1
    return count
