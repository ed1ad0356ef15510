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
from collections.abc import Callable

import numpy as np

from qfuse.ir import Graph, Node, Op
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
        replace_by_constants(graph, node, values)
        log.debug("folded %s", node)
        count += 1
    if count:
        graph.remove_unused()
    return count


def replace_by_constants(graph: Graph, node: Node, values: list[np.ndarray]) -> None:
    """``node`` replaced by constants of its outputs, each keeping its name and TensorInfo."""
    outputs = list(node.outputs)
    infos = [graph.info(out) for out in outputs]

    def build() -> None:
        for out, value, info in zip(outputs, values, infos, strict=True):
            graph.add_constant(out, value, info)

    replace_nodes(graph, [node], build)


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


def run_constant_cones(graph: Graph, ctx: PassContext) -> int:
    """Every value computed from constants alone, through quantization ops and compute ops
    too, becomes a constant, except where a run-time node reads its integers.

    ``run`` folds nothing past a quantization op, so a subgraph of quantized constants ran
    on every call: quantize_static without quant_pre_process (whose optimizer folds such
    subgraphs before quantizing) quantizes ConViT's positional projection of a constant index
    table, ``MatMul(DQ(Q(Expand(c))), DQ(w))``, its bias Add and its gating ``sigmoid(p)``:
    ten MatMuls with their Adds, quantizes, dequantizes and Transposes per call. Here each
    such value is evaluated through its producers by the reference interpreter's own op table,
    as ``run`` evaluates, so the folded graph computes exactly what the reference computes on
    the unfolded one (bit-exact).

    Kept as they are: every node a run-time Conv, ConvTranspose, MatMul, Gemm or quantization
    op reads through constant nodes (a weight's quantizer and views: the passes need its
    integers), and a quantization op only run-time nodes read (``DQ(c)`` an Add reads is
    already a constant operand to the fusion passes)."""
    derived = _constant_derived(graph)
    kept = _read_as_integers(graph, derived)
    cone = Cone(graph)
    folds: list[tuple[Node, list[np.ndarray]]] = []
    for node in graph.topo_order():
        if (node.name in kept or not node.outputs or node.outputs[0] not in derived
                or _read_at_run_time_only(graph, node, derived)):
            continue
        ctx.visit(node)
        values = [cone(out) for out in node.outputs]
        if all(value is not None for value in values):
            folds.append((node, values))  # type: ignore[arg-type]  (checked just above)
    for node, values in folds:
        replace_by_constants(graph, node, values)
        log.debug("folded %s, computed from constants", node)
    if folds:
        graph.remove_unused()
    return len(folds)


# Run-time readers of a constant's integers: a weight's, or a requantize's.
_INTEGER_READERS = frozenset({Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL, Op.GEMM,
                              *QUANTIZATION_OPS, Op.DYNAMIC_QUANTIZE_LINEAR})


def _constant_derived(graph: Graph) -> set[str]:
    """The values computed from constants alone (constants included), by nodes the reference
    interpreter implements and no pass has fused."""
    derived = {name for name in graph.values if graph.constant(name) is not None}
    for node in graph.topo_order():
        inputs = [v for v in node.inputs if v]
        if (inputs and node.fused is None and node.op in IMPLS
                and all(v in derived for v in inputs)):
            derived.update(node.outputs)
    return derived


def _read_at_run_time_only(graph: Graph, node: Node, derived: set[str]) -> bool:
    """``node`` is a quantization op only run-time nodes read (``DQ(c)`` an Add reads)."""
    return node.op in QUANTIZATION_OPS and not any(
        reader.outputs and reader.outputs[0] in derived
        for out in node.outputs for reader, _ in graph.consumers(out))


def _read_as_integers(graph: Graph, derived: set[str]) -> set[str]:
    """The names of the nodes computing, from constants, a value a run-time
    ``_INTEGER_READERS`` node reads, with every node they read from."""
    kept: set[str] = set()
    waiting = [v for node in graph if node.op in _INTEGER_READERS
               and not (node.outputs and node.outputs[0] in derived)
               for v in node.inputs if v in derived]
    while waiting:
        producer = graph.producer(waiting.pop())
        if producer is not None and producer.name not in kept:
            kept.add(producer.name)
            waiting.extend(v for v in producer.inputs if v)
    return kept


class Cone:
    """Values computed from constants alone, each evaluated once through its producers by the
    reference interpreter's op table (as ``run`` evaluates): ``cone(name)`` is the array, or
    None when some producer on the way reads a run-time value, is fused, has no reference
    implementation or does not evaluate to its TensorInfo. Iterative (post-order), so a long
    chain needs no deep recursion."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.arrays: dict[str, np.ndarray | None] = {}

    def __call__(self, name: str) -> np.ndarray | None:
        constant = self.graph.constant(name)
        if constant is not None:
            return constant
        pending: list[tuple[str, bool]] = [(name, False)]
        while pending:
            value, ready = pending.pop()
            if self.graph.constant(value) is not None or value in self.arrays:
                continue
            producer = self.graph.producer(value)
            if producer is None or producer.fused is not None or producer.op not in IMPLS:
                self.arrays[value] = None
                continue
            if ready:  # its inputs are done: evaluate (None when one of them is None)
                values = evaluate(self.graph, producer, self) or [None] * len(producer.outputs)
                self.arrays.update(zip(producer.outputs, values, strict=True))
                continue
            pending.append((value, True))
            pending.extend((v, False) for v in producer.inputs
                           if v and self.graph.constant(v) is None and v not in self.arrays)
        return self.arrays[name]


def evaluate(graph: Graph, node: Node, source: Callable[[str], np.ndarray | None] | None = None
             ) -> list[np.ndarray] | None:
    """The node's outputs conformed to their infos, or None when they do not fit (or an
    input, read by ``source`` instead of as a constant, has no array)."""
    source = source or graph.constant
    args: list[np.ndarray | None] = [source(name) if name else None for name in node.inputs]
    if any(arg is None for name, arg in zip(node.inputs, args, strict=True) if name):
        return None
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
