"""Constant folding: a node whose inputs are all constants becomes constants.

Identity: ``op(c_1, ..., c_n) = value`` computed once by the reference interpreter's own
implementation of the op (runtime.reference.IMPLS), so the folded graph computes exactly what
the reference computes on the unfolded one (bit-exact). The folded constants keep the output
names and TensorInfos (QuantParams included), so graph outputs and readers are unchanged.

Never folded:
- QuantizeLinear, DequantizeLinear and FakeQuantize: the quantization passes need the integer
  weights and their scales as they are (a DequantizeLinear on an s8 initializer is a quantized
  weight, not a float constant);
- a node that changes the element type (e.g. Cast) and feeds one of them: that would change
  the type of a quantization op's constant input;
- nodes with a fused post-op chain, ops without a reference implementation, and results whose
  shape or type differ from the output's TensorInfo (not convertible exactly).
These are not declines of a matched rewrite, so nothing is recorded.

Folding runs in topological order, so a chain of constant nodes folds in one run; the
constants that nobody reads any more are then dropped (``graph.remove_unused``).
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir import Graph, Node, Op, TensorInfo
from qfuse.passes.base import PassContext
from qfuse.passes.replace import replace_nodes
from qfuse.runtime.reference import IMPLS

log = logging.getLogger(__name__)

QUANTIZATION_OPS = frozenset({Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR, Op.FAKE_QUANTIZE})


def run(graph: Graph, ctx: PassContext) -> int:
    count = 0
    for node in graph.topo_order():
        if not _foldable(graph, node):
            continue
        ctx.visit(node)
        values = evaluate(graph, node)
        if values is None:
            continue
        outputs = list(node.outputs)
        infos = [graph.info(out) for out in outputs]

        def build(outputs: list[str] = outputs, values: list[np.ndarray] = values,
                  infos: list[TensorInfo] = infos) -> None:
            for out, value, info in zip(outputs, values, infos, strict=True):
                graph.add_constant(out, value, info)

        replace_nodes(graph, [node], build)
        log.debug("folded %s", node)
        count += 1
    if count:
        graph.remove_unused()
    return count


def _foldable(graph: Graph, node: Node) -> bool:
    if node.op in QUANTIZATION_OPS or node.fused is not None or node.op not in IMPLS:
        return False
    inputs = [name for name in node.inputs if name]
    if not inputs or any(graph.constant(name) is None for name in inputs):
        return False
    return not (_changes_dtype(graph, node) and _feeds_quantization(graph, node))


def _changes_dtype(graph: Graph, node: Node) -> bool:
    in_types = {graph.info(name).dtype for name in node.inputs if name}
    return any(graph.info(out).dtype not in in_types for out in node.outputs)


def _feeds_quantization(graph: Graph, node: Node) -> bool:
    return any(reader.op in QUANTIZATION_OPS
               for out in node.outputs for reader, _ in graph.consumers(out))


def evaluate(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """The node's outputs conformed to their infos, or None when they do not fit."""
    args: list[np.ndarray | None] = [graph.constant(name) if name else None
                                     for name in node.inputs]
    results = IMPLS[node.op](node, args)
    conformed = []
    for out, array in zip(node.outputs, results, strict=True):
        info = graph.info(out)
        array = np.asarray(array)
        if array.shape != info.shape:
            return None
        if array.dtype != info.dtype.np:
            cast = array.astype(info.dtype.np)
            with np.errstate(invalid="ignore"):
                if not np.array_equal(cast.astype(array.dtype), array, equal_nan=True):
                    return None
            array = cast
        conformed.append(array)
    return conformed
