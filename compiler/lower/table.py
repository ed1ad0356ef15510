"""The oneDNN lowering table (one entry per op) and the driver that walks the graph with it.

``lower(graph, options)`` visits the nodes in topological order. A node whose inputs are all
constants (a DequantizeLinear on a weight initializer in a graph the passes did not rewrite, a
shape computation) is evaluated once at compile time with the reference implementation and
becomes a constant. Every other node is lowered by ``LOWERINGS[node.op]``; an op without an
entry raises ``UnsupportedModelError`` naming the node and the op. Errors raised while lowering
a node are re-raised with the node named.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower import (
    lower_compute,
    lower_matmul,
    lower_misc,
    lower_norm,
    lower_pool,
    lower_quant,
    lower_resize,
)
from qfuse.compiler.lower.context import LowerContext, Options
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.no_vnni import isa_notes
from qfuse.compiler.lower.plan import Plan
from qfuse.ir import Graph, Node, Op
from qfuse.runtime.onednn import DataType
from qfuse.runtime.reference import IMPLS

log = logging.getLogger(__name__)

LowerFn = Callable[[LowerContext, Node], None]

LOWERINGS: dict[Op, LowerFn] = {
    # int8 / float compute
    Op.CONV: lower_compute.lower_conv,
    Op.CONV_TRANSPOSE: lower_compute.lower_conv,
    Op.MATMUL: lower_matmul.lower_matmul,
    Op.GEMM: lower_matmul.lower_gemm,
    # quantization
    Op.FAKE_QUANTIZE: lower_quant.lower_quantize,
    Op.QUANTIZE_LINEAR: lower_quant.lower_quantize,
    Op.DEQUANTIZE_LINEAR: lower_quant.lower_dequantize,
    # pooling
    Op.MAX_POOL: lower_pool.lower_pool,
    Op.AVG_POOL: lower_pool.lower_pool,
    Op.GLOBAL_AVG_POOL: lower_pool.lower_pool,
    # float elementwise and normalization
    Op.RELU: lower_misc.lower_eltwise,
    Op.LEAKY_RELU: lower_misc.lower_eltwise,
    Op.CLIP: lower_misc.lower_eltwise,
    Op.SIGMOID: lower_misc.lower_eltwise,
    Op.SWISH: lower_misc.lower_eltwise,
    Op.TANH: lower_misc.lower_eltwise,
    Op.HARD_SWISH: lower_misc.lower_eltwise,
    Op.HARD_SIGMOID: lower_misc.lower_eltwise,
    Op.GELU: lower_misc.lower_eltwise,
    Op.ADD: lower_misc.lower_binary,
    Op.SUB: lower_misc.lower_binary,
    Op.MUL: lower_misc.lower_binary,
    Op.DIV: lower_misc.lower_binary,
    Op.SUM: lower_misc.lower_binary,
    Op.SOFTMAX: lower_norm.lower_softmax,
    Op.LAYER_NORM: lower_norm.lower_layer_norm,
    Op.BATCH_NORM: lower_misc.lower_batch_norm,
    # data movement
    Op.CONCAT: lower_misc.lower_concat,
    Op.SPLIT: lower_misc.lower_split,
    Op.SLICE: lower_misc.lower_slice,
    Op.RESHAPE: lower_misc.lower_reshape,
    Op.FLATTEN: lower_misc.lower_reshape,
    Op.SQUEEZE: lower_misc.lower_reshape,
    Op.UNSQUEEZE: lower_misc.lower_reshape,
    Op.TRANSPOSE: lower_misc.lower_transpose,
    Op.IDENTITY: lower_misc.lower_alias,
    Op.DROPOUT: lower_misc.lower_alias,
    # nearest → resampling where its indices are ONNX's; linear: bit-exact numpy kernel
    Op.RESIZE: lower_resize.lower_resize,
    # no oneDNN primitive: the reference semantics in numpy
    Op.PRELU: lower_numpy,
    Op.PAD: lower_numpy,
    Op.CAST: lower_numpy,
}

# Consumers that tell a reorder producing their input which layout they want.
PROBES = {
    Op.CONV: lower_compute.probe_conv,
    Op.CONV_TRANSPOSE: lower_compute.probe_conv,
    Op.MAX_POOL: lower_pool.probe_int8_pool,
    Op.AVG_POOL: lower_pool.probe_int8_pool,
    Op.GLOBAL_AVG_POOL: lower_pool.probe_int8_pool,
    Op.CONCAT: lower_misc.probe_concat,
    Op.RESIZE: lower_resize.probe_resize,
    Op.PAD: lower_misc.probe_plain,
    Op.CAST: lower_misc.probe_plain,
}


class LoweringError(RuntimeError):
    """A node failed to lower; the message names it."""


def lower(graph: Graph, options: Options | None = None) -> Plan:
    """Lower ``graph`` (after the passes) to a finalized Plan."""
    ctx = LowerContext(graph, options)
    ctx.probes.update(PROBES)
    for node in graph.topo_order():
        ctx.current = node
        if _fold(ctx, node):
            ctx.lowered.add(node.name)
            continue
        fn = LOWERINGS.get(node.op)
        if fn is None:
            raise UnsupportedModelError(f"node {node}: no oneDNN lowering for {node.op.value}")
        try:
            fn(ctx, node)
        except (UnsupportedModelError, LoweringError):
            raise
        except Exception as exc:
            raise LoweringError(f"lowering node {node} failed: {type(exc).__name__}: "
                                f"{exc}") from exc
        ctx.lowered.add(node.name)
    if ctx.deferred:
        raise LoweringError(f"dequantize(s) deferred but never consumed: {sorted(ctx.deferred)}")
    plan = ctx.finish()
    plan.notes.update(isa_notes(ctx, _int8(plan)))
    log.info("lowered %s: %d kernels, %d reorders, %d io reorders", graph.name,
             len(plan.kernels), plan.reorders, plan.io_reorders)
    return plan


# ISAs with exact int8 dot products (VNNI / AMX): no_vnni.EXACT_INT8_ISAS; without them
# no_vnni.py splits the int8 weights so the accumulators stay exact (docs/onednn.md).
def _int8(plan: Plan) -> bool:
    return any(k.kind in ("convolution", "deconvolution", "matmul") and k.reads
               and plan.slots[k.reads[0]].md.dtype in (DataType.u8, DataType.s8)
               for k in plan.kernels)


def _fold(ctx: LowerContext, node: Node) -> bool:
    """Evaluate a node of constant inputs at compile time (no kernel)."""
    if node.fused is not None or not node.inputs:
        return False
    if any(v and ctx.const(v) is None for v in node.inputs):
        return False
    impl = IMPLS.get(node.op)
    if impl is None:
        return False
    args = [ctx.const(v) if v else None for v in node.inputs]
    outs = impl(node, args)
    for value, array in zip(node.outputs, outs, strict=True):
        info = ctx.graph.values[value].info
        dtype = info.dtype.np if info is not None else array.dtype
        ctx.folded[value] = np.asarray(array).astype(dtype, copy=False)
    return True
