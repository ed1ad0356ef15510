"""Shape and element-type inference: one rule per op, keyed by ``Op`` (``SHAPE_RULES``).

A rule reads the infos of a node's inputs (and the constants among them) and returns the
infos of its outputs; it raises ``GraphError`` naming the node when the inputs do not fit
together (channels, broadcasting, ranks). Shapes are static: every dim is a known int.

Quantization metadata travels with the element type (ir.types.QuantParams): QuantizeLinear
creates it from its constant scale and zero point, precision-preserving ops pass it on (see
layout.py for how per-axis parameters follow their axis), everything else drops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from qfuse.ir.graph import Graph, GraphError, Node
from qfuse.ir.ops import Op
from qfuse.ir.shapes import arith, layout, quant, spatial
from qfuse.ir.shapes._common import broadcast, fail
from qfuse.ir.types import DType, TensorInfo

logger = logging.getLogger(__name__)

Rule = Callable[[Graph, Node], list[TensorInfo]]

SHAPE_RULES: dict[Op, Rule] = {
    Op.QUANTIZE_LINEAR: quant.quantize_linear,
    Op.DEQUANTIZE_LINEAR: quant.dequantize_linear,
    Op.FAKE_QUANTIZE: quant.fake_quantize,
    Op.CONV: spatial.conv,
    Op.CONV_TRANSPOSE: spatial.conv_transpose,
    Op.GEMM: arith.gemm,
    Op.MATMUL: arith.matmul,
    Op.ADD: arith.elementwise_binary,
    Op.SUB: arith.elementwise_binary,
    Op.MUL: arith.elementwise_binary,
    Op.DIV: arith.elementwise_binary,
    Op.MAX: arith.elementwise_binary,
    Op.MIN: arith.elementwise_binary,
    Op.SUM: arith.elementwise_binary,
    Op.RELU: arith.preserving,
    Op.CLIP: arith.unary,
    Op.LEAKY_RELU: arith.unary,
    Op.PRELU: arith.prelu,
    Op.SIGMOID: arith.unary,
    Op.SWISH: arith.unary,
    Op.TANH: arith.unary,
    Op.HARD_SIGMOID: arith.unary,
    Op.HARD_SWISH: arith.unary,
    Op.GELU: arith.unary,
    Op.SOFTMAX: arith.softmax,
    Op.LOG_SOFTMAX: arith.softmax,
    Op.LAYER_NORM: arith.layer_norm,
    Op.BATCH_NORM: arith.batch_norm,
    Op.LRN: arith.lrn,
    **{op: arith.reduce for op in (Op.REDUCE_MEAN, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_SUM,
                                   Op.REDUCE_PROD, Op.REDUCE_L1, Op.REDUCE_L2,
                                   Op.REDUCE_SUM_SQUARE)},
    Op.SQRT: arith.unary,
    Op.EXP: arith.unary,
    Op.LOG: arith.unary,
    Op.POW: arith.unary,
    Op.MAX_POOL: spatial.max_pool,
    Op.AVG_POOL: spatial.avg_pool,
    Op.GLOBAL_AVG_POOL: spatial.global_avg_pool,
    Op.GLOBAL_MAX_POOL: spatial.global_max_pool,
    Op.CONCAT: layout.concat,
    Op.SPLIT: layout.split,
    Op.SLICE: layout.slice_,
    Op.RESHAPE: layout.reshape,
    Op.FLATTEN: layout.flatten,
    Op.TRANSPOSE: layout.transpose,
    Op.SQUEEZE: layout.squeeze,
    Op.UNSQUEEZE: layout.unsqueeze,
    Op.PAD: layout.pad,
    Op.EXPAND: layout.expand,
    Op.DEPTH_TO_SPACE: layout.depth_to_space,
    Op.RESIZE: spatial.resize,
    Op.IDENTITY: arith.preserving,
    Op.DYNAMIC_QUANTIZE_LINEAR: quant.dynamic_quantize_linear,
    Op.DROPOUT: arith.preserving,
    Op.CAST: arith.cast,
    Op.WHERE: arith.where,
    Op.GATHER: arith.gather,
    Op.LOGIC: arith.logic,
    Op.ISLAND: lambda graph, node: list(node.attrs.infos),  # fixed when the island was built
    Op.TABLE: lambda graph, node: [node.attrs.info],  # the output of the nodes it stands for
}


def infer_node(graph: Graph, node: Node) -> list[TensorInfo]:
    """The infos of ``node``'s outputs, in output order (the graph is not modified)."""
    rule = SHAPE_RULES.get(node.op)
    if rule is None:
        raise fail(node, f"no shape rule for op {node.op.value}")
    try:
        infos = rule(graph, node)
    except GraphError as exc:
        if str(exc).startswith(f"node {node}"):
            raise
        raise fail(node, str(exc)) from exc
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as exc:
        raise fail(node, f"shape inference failed: {type(exc).__name__}: {exc}") from exc
    if len(infos) != len(node.outputs):
        raise fail(node, f"rule gives {len(infos)} outputs, the node has {len(node.outputs)}")
    if node.fused is not None:
        # A fused node's output type is set by its chain (its final Quantize), not by its op.
        kept = [graph.values[o].info for o in node.outputs]
        infos = [info if old is None else TensorInfo(info.shape, old.dtype, old.quant)
                 for info, old in zip(infos, kept, strict=True)]
    return infos


def infer_shapes(graph: Graph) -> None:
    """Fill in the info of every value, in topological order.

    Constants without info get it from their data; graph inputs must already have one.
    Output infos are recomputed (passes may have changed the inputs); see the rules for the
    cases where an existing output type is kept (quantize-only FakeQuantize, fused outputs).
    """
    for name, value in graph.values.items():
        if value.info is None and value.data is not None:
            value.info = TensorInfo(tuple(value.data.shape), DType.from_numpy(value.data.dtype))
    for name in graph.inputs:
        if graph.values[name].info is None:
            raise GraphError(f"graph input '{name}' has no tensor info")
    for node in graph.topo_order():
        for out, info in zip(node.outputs, infer_node(graph, node), strict=True):
            graph.set_info(out, info)


__all__ = ["SHAPE_RULES", "Rule", "broadcast", "infer_node", "infer_shapes"]
