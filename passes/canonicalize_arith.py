"""Canonical arithmetic: Sum → Add chain, Sub by a constant → Add, Div by a constant → Mul.

Later passes (dequantize movement, post-op fusion) only need to know Add and Mul.

- ``Sum(x)`` = x: bypassed (the output name is kept as in drop_identity).
  ``Sum(x0, ..., xn)`` = ``Add(...Add(Add(x0, x1), x2)..., xn)``: bit-exact, because the
  reference (like ONNX Runtime) sums left to right in float32, one rounding per addition.
- ``Sub(x, c)`` = ``Add(x, -c)`` for a float constant c: bit-exact, IEEE 754 defines x - c as
  x + (-c) and negation is exact.
- ``Div(x, c)`` → ``Mul(x, r)`` with ``r = float32(1 / float64(c))`` for a float constant c.
  NOT bit-exact in float32: x/c is correctly rounded, x·r rounds twice (r, then the product).
  |x·r - x/c| ≤ 2⁻²⁴·|x/c| < 1 ulp(x/c) before the last rounding, so the two float32 results
  are at most 1 ulp apart (test_canonicalize_arith.py measures the ulp difference on random
  data and pins it to ≤ 1). Precondition: every c is finite and non-zero and every r is a
  normal float32 (a subnormal r would lose precision, an infinite one overflow).

A c given as ``DequantizeLinear`` of constant integers (with constant scale and zero point)
counts as a constant: it is evaluated with the reference implementation and the new constant
is a plain float32 (the Sub / Div keeps no quantized form; ONNX Runtime does not quantize
Sub or Div). The last new node writes the old output value, with the old node's name.

Declined (reason recorded): Sub / Div whose second input is not a constant, integer Sub / Div
(integer Div truncates; it has no reciprocal), a Div by a c that breaks the precondition, a
one-input Sum whose output and input names cannot both be kept.
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.passes.base import PassContext
from qfuse.passes.replace import add_inferred, bypass_keeping_name, replace_nodes
from qfuse.runtime.reference import IMPLS

log = logging.getLogger(__name__)

F32 = np.float32
TINY = np.finfo(F32).tiny


def run(graph: Graph, ctx: PassContext) -> int:
    count = 0
    for node in [n for n in graph.topo_order() if n.op in (Op.SUM, Op.SUB, Op.DIV)]:
        ctx.visit(node)
        if node.op is Op.SUM:
            reason = _sum(graph, node)
        else:
            reason = _by_constant(graph, node)
        if reason is not None:
            ctx.decline(node, reason)
            continue
        count += 1
    if count:
        graph.remove_unused()
    return count


def _sum(graph: Graph, node: Node) -> str | None:
    if len(node.inputs) == 1:
        return bypass_keeping_name(graph, node)
    inputs, y, origin = list(node.inputs), node.outputs[0], node.origin

    def build() -> None:
        value = inputs[0]
        for i, other in enumerate(inputs[1:], 1):
            last = i == len(inputs) - 1
            out = y if last else graph.unique_name(f"{y}_add{i}")
            name = node.name if last else f"{node.name}_add{i}"
            value = add_inferred(graph, Op.ADD, [value, other], [out], name=name,
                                 origin=origin).outputs[0]

    replace_nodes(graph, [node], build)
    return None


def constant_value(graph: Graph, name: str) -> np.ndarray | None:
    """The value of ``name`` when it is a constant or a DequantizeLinear of constants."""
    data = graph.constant(name)
    if data is not None:
        return data
    dq = graph.producer(name)
    if dq is None or dq.op is not Op.DEQUANTIZE_LINEAR:
        return None
    args = [graph.constant(v) if v else None for v in dq.inputs]
    if any(arg is None for arg, v in zip(args, dq.inputs, strict=True) if v):
        return None
    return IMPLS[Op.DEQUANTIZE_LINEAR](dq, args)[0]


def _by_constant(graph: Graph, node: Node) -> str | None:
    x, c_name, y = node.inputs[0], node.inputs[1], node.outputs[0]
    c = constant_value(graph, c_name)
    if c is None:
        return f"second input '{c_name}' is not a constant"
    if c.dtype != F32 or graph.info(x).dtype.np != F32:
        return (f"{graph.info(x).dtype.name} {node.op.value} by {c.dtype} is kept "
                "(only float32 is rewritten)")
    if node.op is Op.SUB:
        op, operand, suffix = Op.ADD, -c, "neg"
    else:
        with np.errstate(divide="ignore", over="ignore"):
            operand = (1.0 / c.astype(np.float64)).astype(F32)
        if not (np.all(np.isfinite(c)) and np.all(np.isfinite(operand))
                and np.all(np.abs(operand) >= TINY)):
            return (f"divisor '{c_name}' has a zero, non-finite or huge element: 1/c is not "
                    "a normal float32")
        op, suffix = Op.MUL, "recip"
    const = graph.add_constant(graph.unique_name(f"{c_name}_{suffix}"), operand).name
    origin = node.origin
    replace_nodes(graph, [node],
                  lambda: add_inferred(graph, op, [x, const], [y], name=node.name,
                                       origin=origin))
    log.debug("rewrote %s as %s", node, op.value)
    return None
