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
    lower_binary,
    lower_compute,
    lower_dynamic,
    lower_gate,
    lower_island,
    lower_matmul,
    lower_misc,
    lower_norm,
    lower_pool,
    lower_quant,
    lower_reduce,
    lower_resize,
)
from qfuse.compiler.lower.context import LowerContext, Options
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.layouts import is_host
from qfuse.compiler.lower.no_vnni import isa_notes
from qfuse.compiler.lower.plan import Plan, Slot
from qfuse.ir import DType, Graph, Node, Op
from qfuse.runtime.onednn import DataType, DnnlError
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
    Op.FAKE_QUANTIZE: lower_gate.lower_fake_quantize,
    Op.QUANTIZE_LINEAR: lower_quant.lower_quantize,
    Op.DEQUANTIZE_LINEAR: lower_quant.lower_dequantize,
    Op.DYNAMIC_QUANTIZE_LINEAR: lower_dynamic.lower_dynamic_quantize,
    # pooling
    Op.MAX_POOL: lower_pool.lower_pool,
    Op.GLOBAL_MAX_POOL: lower_pool.lower_pool,
    Op.AVG_POOL: lower_pool.lower_pool,
    Op.GLOBAL_AVG_POOL: lower_pool.lower_pool,
    # float elementwise and normalization
    Op.RELU: lower_gate.lower_activation,
    Op.LEAKY_RELU: lower_gate.lower_activation,
    Op.CLIP: lower_gate.lower_activation,
    Op.SIGMOID: lower_gate.lower_activation,
    Op.SWISH: lower_gate.lower_activation,
    Op.TANH: lower_gate.lower_activation,
    Op.HARD_SWISH: lower_gate.lower_activation,
    Op.HARD_SIGMOID: lower_gate.lower_activation,
    Op.GELU: lower_gate.lower_activation,
    Op.ADD: lower_gate.lower_binary,
    Op.SUB: lower_gate.lower_binary,
    Op.MUL: lower_gate.lower_binary,
    Op.DIV: lower_gate.lower_binary,
    Op.MAX: lower_binary.lower_binary,
    Op.MIN: lower_binary.lower_binary,
    Op.SUM: lower_binary.lower_binary,
    Op.SOFTMAX: lower_norm.lower_softmax,
    Op.LOG_SOFTMAX: lower_norm.lower_softmax,
    Op.LAYER_NORM: lower_norm.lower_layer_norm,
    Op.BATCH_NORM: lower_misc.lower_batch_norm,
    Op.LRN: lower_reduce.lower_lrn,
    **{op: lower_reduce.lower_reduce for op in lower_reduce.REDUCTIONS},
    Op.SQRT: lower_misc.lower_eltwise,
    Op.EXP: lower_misc.lower_eltwise,
    Op.LOG: lower_misc.lower_log,
    Op.POW: lower_misc.lower_eltwise,
    # data movement
    Op.CONCAT: lower_misc.lower_concat,
    Op.SPLIT: lower_misc.lower_split,
    Op.SLICE: lower_misc.lower_slice,
    Op.RESHAPE: lower_misc.lower_reshape,
    Op.FLATTEN: lower_misc.lower_reshape,
    Op.SQUEEZE: lower_misc.lower_reshape,
    Op.UNSQUEEZE: lower_misc.lower_reshape,
    Op.TRANSPOSE: lower_misc.lower_transpose,
    Op.DEPTH_TO_SPACE: lower_misc.lower_depth_to_space,
    Op.IDENTITY: lower_misc.lower_alias,
    Op.DROPOUT: lower_misc.lower_alias,
    Op.PAD: lower_misc.lower_pad,  # reorders; a crop or too long a reflection: numpy
    # nearest → resampling where its indices are ONNX's; linear: bit-exact numpy kernel
    Op.RESIZE: lower_resize.lower_resize,
    # no oneDNN primitive: the reference semantics in numpy
    Op.PRELU: lower_numpy,
    Op.EXPAND: lower_misc.lower_expand,  # passes/drop_identity bypasses most
    Op.CAST: lower_numpy,
    Op.WHERE: lower_misc.lower_where,
    Op.GATHER: lower_misc.lower_gather,
    Op.LOGIC: lower_numpy,  # bool values: no oneDNN type
    # float islands: the ONNX subgraph run by onnxruntime or onnx.reference
    Op.ISLAND: lower_island.lower_island,
    # an 8-bit elementwise chain as its values for the 256 inputs (passes/table_lookup.py)
    Op.TABLE: lower_island.lower_table,
}

# Ops whose lowering is itself a numpy kernel, reading values oneDNN cannot describe (int64
# indices, a bool condition) as they are
NUMPY_LOWERINGS = frozenset({Op.GATHER, Op.WHERE})

# Inputs from this port on are parameters the oneDNN lowerings read as constants (weights,
# biases, scales, zero points, normalization statistics); when one arrives at run time the node
# runs as a numpy kernel with the reference semantics instead (never read as absent).
PARAMETER_PORTS = {
    Op.CONV: 1, Op.CONV_TRANSPOSE: 1, Op.GEMM: 2, Op.LAYER_NORM: 1, Op.BATCH_NORM: 1,
    Op.QUANTIZE_LINEAR: 1, Op.DEQUANTIZE_LINEAR: 1, Op.FAKE_QUANTIZE: 1, Op.PRELU: 1,
}

# Consumers that tell a reorder producing their input which layout they want.
PROBES = {
    **{op: lower_binary.probe_binary for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SUM,
                                                 Op.MAX, Op.MIN)},
    Op.CONV: lower_compute.probe_conv,
    Op.CONV_TRANSPOSE: lower_compute.probe_conv,
    Op.MAX_POOL: lower_pool.probe_int8_pool,
    Op.GLOBAL_MAX_POOL: lower_pool.probe_int8_pool,
    Op.AVG_POOL: lower_pool.probe_int8_pool,
    Op.GLOBAL_AVG_POOL: lower_pool.probe_int8_pool,
    Op.CONCAT: lower_misc.probe_concat,
    Op.RESIZE: lower_resize.probe_resize,
    Op.DEPTH_TO_SPACE: lower_misc.probe_depth_to_space,
    Op.PAD: lower_misc.probe_plain,
    Op.CAST: lower_misc.probe_plain,
    Op.SOFTMAX: lower_norm.probe_softmax,
    Op.LOG_SOFTMAX: lower_norm.probe_softmax,
    **{op: lower_reduce.probe_reduce for op in lower_reduce.ACROSS_SLICES},
}


class LoweringError(RuntimeError):
    """A node failed to lower; the message names it."""


def lower(graph: Graph, options: Options | None = None) -> Plan:
    """Lower ``graph`` (after the passes) to a finalized Plan."""
    ctx = LowerContext(graph, options)
    ctx.probes.update(PROBES)
    for node in graph.topo_order():
        ctx.current = node
        if node.name in ctx.lowered:  # computed by an earlier node's kernel (lower_dynamic)
            continue
        if _fold(ctx, node):
            ctx.lowered.add(node.name)
            continue
        fn = LOWERINGS.get(node.op)
        if fn is None:
            raise UnsupportedModelError(f"node {node}: no oneDNN lowering for {node.op.value}")
        why = _numpy_instead(ctx, node)
        try:
            if not why:
                _lower_or_numpy(ctx, node, fn)
            elif not _host_view(ctx, node):
                lower_numpy(ctx, node, note=why)
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


# Ops that keep the bytes and change only the shape: over a host value (int64, bool: an
# attention mask's Unsqueeze), a view of the same bytes instead of a numpy copy
HOST_VIEW_OPS = frozenset({Op.RESHAPE, Op.UNSQUEEZE, Op.SQUEEZE, Op.FLATTEN, Op.IDENTITY})


def _host_view(ctx: LowerContext, node: Node) -> bool:
    """``node``'s output as a host slot aliasing its run-time host input (no kernel), where
    ``node`` only reshapes (HOST_VIEW_OPS); False (nothing added) otherwise."""
    if node.op not in HOST_VIEW_OPS or node.fused is not None:
        return False
    x, y = node.inputs[0], node.outputs[0]
    xinfo, yinfo = ctx.info(x), ctx.info(y)
    if (ctx.const(x) is not None or not is_host(xinfo) or not is_host(yinfo)
            or xinfo.dtype is not yinfo.dtype):
        return False
    home = ctx.home_slot(x)
    if ctx.slots[home].host is None:
        return False
    name = ctx.fresh(y)
    ctx.slots[name] = Slot(name, ctx.slots[home].md, alias=home,
                           host=(tuple(yinfo.shape), yinfo.dtype.np))
    ctx.home[y] = name
    return True


def _lower_or_numpy(ctx: LowerContext, node: Node, fn: LowerFn) -> None:
    """``fn``; when oneDNN declines the node (no implementation for these types or shapes),
    the kernels and slots it added are dropped and the node runs as a numpy kernel."""
    if node.fused is not None or node.op not in IMPLS:
        fn(ctx, node)
        return
    restore = ctx.checkpoint()  # (the node may take a dequantize deferred for its readers)
    try:
        fn(ctx, node)
    except (UnsupportedModelError, DnnlError, ValueError) as exc:  # e.g. a rank-0 constant
        restore()
        for value in node.inputs:  # the numpy kernel reads the dequantized value itself
            if value in ctx.deferred:
                lower_quant.undefer(ctx, value)
        lower_numpy(ctx, node, note=f"oneDNN declines it ({str(exc).split(': ', 1)[-1]})")


def _numpy_instead(ctx: LowerContext, node: Node) -> str:
    """Why ``node`` runs as a numpy kernel rather than its oneDNN lowering ("" if it does not):
    it reads or writes a value oneDNN cannot describe, or a parameter arrives at run time."""
    if (node.fused is not None or node.op in (Op.ISLAND, Op.DYNAMIC_QUANTIZE_LINEAR)
            or node.op in NUMPY_LOWERINGS
            or node.op not in IMPLS):  # DynamicQuantizeLinear writes its scalars itself
        return ""
    for value in [*node.inputs, *node.outputs]:  # constants are parameters the lowering reads
        if (node.op in lower_binary.BINARY and value in node.inputs
                and ctx.info(value).dtype is DType.F32 and not ctx.info(value).shape):
            continue  # a rank-0 float32 operand: lower_binary reads it as one value (ranked)
        if value and ctx.const(value) is None and is_host(ctx.info(value)):
            info = ctx.info(value)
            what = "rank 0" if not info.shape else f"element type {info.dtype.name}"
            return f"'{value}' has {what}, which oneDNN does not describe"
    first = PARAMETER_PORTS.get(node.op)
    if first is not None:
        for port, value in enumerate(node.inputs[first:], first):
            if value and ctx.const(value) is None:
                return f"input {port} '{value}' is a parameter computed at run time"
    if node.op is Op.MATMUL and any(len(ctx.info(v).shape) < 2 for v in node.inputs):
        return "a 1-D MatMul operand (oneDNN matmul takes 2-D to 12-D)"
    return ""


# int8 kernels whose implementation has no VNNI / AMX: no_vnni.py splits their weights so the
# accumulators stay exact (decided per primitive from oneDNN's implementation name;
# docs/onednn.md).
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
