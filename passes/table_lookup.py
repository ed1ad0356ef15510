"""An 8-bit tensor's elementwise float chain, up to a quantize, as a table of 256 entries.

quantize_static writes GELU as ``x·(1 + erf(x/√2))·0.5`` with a QuantizeLinear /
DequantizeLinear pair after nearly every op:

    q ─DQ─ x ─ Div √2 ─ Erf ─Q─DQ─ Add 1 ─Q─DQ─ Mul x ─Q─DQ─ Mul 0.5 ─Q─ y

Erf has no oneDNN primitive, so it ran as an onnxruntime island between a float32 Div and a
quantize kernel (timm EfficientFormer-L1 QDQ: 15 islands, 1.6 ms of 6.9). Every value on the
way is a function of the one 8-bit tensor q alone: x is read twice, the other operands are
scalar constants. So y is a function of q's 256 values, and the chain is the table ``y =
T[q]``, one numpy kernel (``take`` over pairs of bytes, about 0.32 ns a byte at one thread,
compiler/lower/lower_island.py ``lower_table``) that also lets q's producer write 8 bits
instead of float32.

The table is the chain's own arithmetic: the reference interpreter (runtime/reference, each
op's ONNX semantics; an island by onnxruntime, as the plan runs it) evaluates the chain once,
at compile time, on tensors of q's shape holding every 8-bit value (several when q has fewer
than 256 elements), and the pass checks that each value gave one result wherever it stood (an
elementwise op's result does not depend on the position; this checks it). Bit-identical,
then, to the chain op by op as the graph has it here (after canonicalize_arith: a Div by a
constant is already the Mul by its reciprocal the fused and unfused modes compute).

Which chains: from a DequantizeLinear of a run-time 8-bit tensor q (per tensor), the
elementwise ops (``ELEMENTWISE``; an island of unary elementwise ONNX ops) whose every input
is q's dequantized value, a value of the chain, or a one-element constant, all of q's shape;
up to the last QuantizeLinear to 8 bits whose chain's values nothing else reads. Only a chain
with an island or an op whose oneDNN jit eltwise is slow (``SLOW_OPS``: Tanh, GELU): the jit
binary kernels of lower_gate run a chain of other oneDNN operations at 0.2-0.6 ns an element
(a QDQ SiLU gate's nine post-ops, logistic included), as fast as the table or faster, and
measured on the PP-OCR models (HardSwish and a learnable affine written out, six ops or more
in a chain) tables 1.05-1.27x slower. A slow op only counts in a gate (a chain reading a
value twice, its own binary kernel): a chain read once runs as post-ops of the kernel
writing q, where a table adds a kernel (PP-OCRv6 NNCF's GELUs: 1.22-1.27x slower as
tables). A tanh-approximated GELU written out (EfficientViT's: 40 post-ops, tanh among them,
5 ns an element) is 0.78x the model's time as tables. Any size: an island's call costs more than a
look-up of a small tensor (Whisper's encoder, tiny: 0.24 → 0.16 ms). Not in the unfused mode
(compiler/modes.py), which runs each op by itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.ir.ops import UNARY_ELEMENTWISE, IslandAttrs, TableAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.canonicalize_arith import constant_value
from qfuse.passes.replace import replace_nodes
from qfuse.runtime.reference.interpreter import run_node

ELEMENTWISE = frozenset({
    Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.RELU,
    Op.CLIP, Op.LEAKY_RELU, Op.SIGMOID, Op.TANH, Op.HARD_SIGMOID, Op.HARD_SWISH, Op.GELU,
    Op.SWISH, Op.SQRT, Op.EXP, Op.LOG, Op.ISLAND})
# Ops whose oneDNN jit eltwise costs more than the whole table look-up (AVX2, 2 threads, an
# element: tanh 1.55 ns, gelu 1.8 ns against the table's 0.3-0.6 ns at one thread; logistic
# 0.28 ns is not among them: a QDQ SiLU gate's chain of 9 post-ops takes 0.6 ns).
SLOW_OPS = frozenset({Op.TANH, Op.GELU})
# Ops no kernel takes as a post-op (fuse_post_ops): a chain with one is a dequantize, the op
# and a quantize kernel otherwise, so the table pays as it does for an island (openWakeWord's
# log-mel, one table when its Log was an island)
NOT_POST_OPS = frozenset({Op.EXP, Op.LOG})


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for node in [n for n in graph.topo_order() if n.op is Op.DEQUANTIZE_LINEAR]:
        if not graph.has_node(node.name):
            continue
        region = _region(graph, node)
        if region is None:
            continue
        if _rewrite(graph, ctx.visit(node), *region, ctx):
            changed += 1
    return changed


def _source(graph: Graph, dq: Node) -> str | None:
    """q when ``dq`` dequantizes a run-time 8-bit tensor per tensor."""
    q = dq.inputs[0]
    info = graph.info(q)
    if (graph.constant(q) is not None or not info.dtype.is_quantized
            or int(np.prod(info.shape)) == 0
            or not all(_scalar(graph, v) for v in dq.inputs[1:] if v)):
        return None
    return q


def _scalar(graph: Graph, value: str) -> bool:
    """A one-element constant, or the dequantized value of one (quantize_static's 1 and 0.5
    of GELU are DequantizeLinear nodes of constants)."""
    data = constant_value(graph, value)
    return data is not None and data.size == 1


def _joins(graph: Graph, node: Node, shape: tuple[int, ...], produced: set[str]) -> bool:
    """May ``node`` belong to the chain: an elementwise op of q's shape reading only the
    chain's values and one-element constants."""
    if node.op not in ELEMENTWISE or node.fused is not None:
        return False
    if node.op is Op.ISLAND:
        attrs: IslandAttrs = node.attrs
        if (not set(attrs.ops) <= UNARY_ELEMENTWISE or any(attrs.dynamic)
                or len(node.inputs) != 1 or len(node.outputs) != 1):
            return False
    if node.op is Op.QUANTIZE_LINEAR and not graph.info(node.outputs[0]).dtype.is_quantized:
        return False
    if any(tuple(graph.info(out).shape) != shape for out in node.outputs):
        return False
    return all(not v or v in produced or _scalar(graph, v) for v in node.inputs)


def _region(graph: Graph, dq: Node) -> tuple[str, list[Node], Node, bool] | None:
    """(q, the chain's nodes in topological order, its final quantize, keep ``dq``: read
    outside the chain too), or None."""
    q = _source(graph, dq)
    if q is None:
        return None
    shape = tuple(graph.info(q).shape)
    inside: dict[str, Node] = {dq.name: dq}
    produced = set(dq.outputs)
    pending = list(dq.outputs)
    while pending:
        value = pending.pop()
        for reader, _ in graph.consumers(value):
            if reader.name in inside or not _joins(graph, reader, shape, produced):
                continue
            inside[reader.name] = reader
            produced.update(reader.outputs)
            pending.extend(reader.outputs)
    if not _pays(inside.values()):
        return None
    order = [n for n in graph.topo_order() if n.name in inside]
    for end in reversed(order):
        if end.op is not Op.QUANTIZE_LINEAR:
            continue
        chain = _ancestors(graph, end, inside)
        if not _pays(chain):
            continue
        names = {n.name for n in chain}
        keep = False
        closed = True
        for node in chain:
            for out in node.outputs:
                if out == end.outputs[0]:
                    continue
                outside = out in graph.outputs or any(
                    r.name not in names for r, _ in graph.consumers(out))
                if outside and node is dq:
                    keep = True
                elif outside:
                    closed = False
        if closed:
            return q, [n for n in order if n.name in names], end, keep
    return None


def _pays(chain: Iterable[Node]) -> bool:
    """A chain the table runs faster than oneDNN's kernels would: with an island, or with an
    op whose jit eltwise is slow (``SLOW_OPS``) in a chain that reads a value twice (a gate:
    its own binary kernel; a chain read once is post-ops of the kernel that writes q, which
    a table would only add a kernel to). Module docstring."""
    nodes = list(chain)
    if any(n.op is Op.ISLAND or n.op in NOT_POST_OPS for n in nodes):
        return True
    reads = Counter(v for n in nodes for v in n.inputs if v)
    gate = any(reads[v] > 1 for n in nodes for v in n.outputs)
    return gate and any(n.op in SLOW_OPS for n in nodes)


def _ancestors(graph: Graph, end: Node, inside: dict[str, Node]) -> list[Node]:
    """``end`` and the chain's nodes it reads from, transitively."""
    found: dict[str, Node] = {}
    pending = [end]
    while pending:
        node = pending.pop()
        if node.name in found:
            continue
        found[node.name] = node
        for value in node.inputs:
            producer = graph.producer(value) if value else None
            if producer is not None and producer.name in inside:
                pending.append(producer)
    return list(found.values())


def _evaluate(graph: Graph, q: str, chain: list[Node], y: str, values: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    """The bytes of y the chain computes from q = ``values`` (the reference interpreter)."""
    env: dict[str, np.ndarray] = {q: values}
    for node in chain:
        args = [None if not v else env[v] if v in env else constant_value(graph, v)
                for v in node.inputs]
        for out, array in zip(node.outputs, run_node(node, args, graph), strict=True):
            env[out] = np.asarray(array)
    return np.ascontiguousarray(env[y].astype(dtype)).reshape(-1).view(np.uint8)


def _rewrite(graph: Graph, dq: Node, q: str, chain: list[Node], end: Node, keep: bool,
             ctx: PassContext) -> bool:
    info = graph.info(q)
    y = end.outputs[0]
    out_info = graph.info(y)
    lo, hi = info.dtype.range
    size = int(np.prod(info.shape))
    every = np.arange(lo, hi + 1).astype(info.dtype.np)
    # tensors of q's shape that hold every 8-bit value, together (several when q is small)
    inputs = [np.resize(np.roll(every, -start), info.shape) for start in range(0, 256, size)]
    index = np.concatenate([a.reshape(-1).view(np.uint8) for a in inputs])
    try:
        result = np.concatenate([_evaluate(graph, q, chain, y, a, out_info.dtype.np)
                                 for a in inputs])
    except Exception as exc:  # noqa: BLE001 - a chain the reference cannot run stays as it is
        ctx.decline(end, f"table: the reference could not evaluate the chain ({exc})")
        return False
    by_byte = np.zeros(256, np.uint8)
    by_byte[index] = result
    if not np.array_equal(by_byte[index], result):
        ctx.decline(end, "table: an input value gave different results at different positions")
        return False
    removed = [n for n in chain if not (keep and n is dq)]
    names = tuple(n.name for n in chain)
    ops = tuple(n.attrs.ops[0] if n.op is Op.ISLAND else n.op.value for n in chain)
    origin = [o for n in chain for o in n.origin]

    def build() -> None:
        graph.add_node(Op.TABLE, [q], [y], TableAttrs(by_byte, out_info, names, ops),
                       name=f"{end.name}#table", infos=[out_info], origin=origin)

    replace_nodes(graph, removed, build)
    graph.remove_unused()  # a constant's dequantize only the chain read
    return True
