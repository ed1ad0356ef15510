"""The emulating interpreter: the reference interpreter, except at quantized patterns.

``plan(graph, framework)`` decides, for every QuantizeLinear of the imported graph (before any
pass), whether the framework computes it with an integer kernel (runtime/emulate/table.py) or
on the float path, and why. ``emulate(graph, feeds, framework)`` then walks the graph in
topological order like ``runtime.reference.evaluate``: a QuantizeLinear planned as integer gets
its kernel's output, computed from the *quantized* inputs of the pattern (which are themselves
emulated upstream); every other node runs its reference implementation. Nodes that only feed
integer kernels (the DequantizeLinear / Conv / Relu inside a pattern) are skipped unless
``keep`` asks for every value, in which case they are computed on the float path (their values
are what the float model would see; the Q output is the framework's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.runtime.emulate.kernel import Prepared
from qfuse.runtime.emulate.patterns import Decline, Match, Pattern, match, quantize_match
from qfuse.runtime.emulate.table import TABLE, Framework, float_reason
from qfuse.runtime.reference import IMPLS, EvaluationError, MissingImplError
from qfuse.runtime.reference.interpreter import check_feeds, conform

__all__ = ["Decision", "emulate", "plan"]


@dataclass(frozen=True)
class Decision:
    """How one quantized tensor (a QuantizeLinear output) is computed."""

    tensor: str
    layer: str  # the node that produced the Q's input (after a fused Relu/Clip: the op)
    pattern: Pattern | None
    integer: bool  # an integer kernel computes it (False: the float path)
    how: str  # the kernel's description, or why the float path is used
    match: Match | None = None
    prepared: Prepared | None = None  # set for integer kernels and framework quantizers

    def summary(self) -> str:
        kind = "integer" if self.integer else "float"
        if self.pattern is Pattern.QUANTIZE:
            kind = "quantize"
        return f"{kind}: {self.how}"


def _layer(graph: Graph, q: Node) -> str:
    producer = graph.producer(q.inputs[0])
    return producer.name if producer is not None else q.inputs[0]


def plan(graph: Graph, framework: Framework | str) -> list[Decision]:
    """One Decision per QuantizeLinear, in topological order."""
    fw = Framework(framework)
    decisions = []
    for node in graph.topo_order():
        if node.op is not Op.QUANTIZE_LINEAR:
            continue
        m = match(graph, node)
        if isinstance(m, Decline):
            decisions.append(_float_quantize(graph, node, fw, m.reason))
            continue
        kernel = TABLE.get((fw, m.pattern))
        if kernel is None:
            decisions.append(_float_quantize(graph, node, fw, float_reason(fw, m.pattern)))
            continue
        prepared = kernel(m)
        if isinstance(prepared, Decline):
            decisions.append(_float_quantize(graph, node, fw, prepared.reason))
        else:
            decisions.append(Decision(m.tensor, m.op.name, m.pattern, True, prepared.describe,
                                      m, prepared))
    return decisions


def _float_quantize(graph: Graph, q: Node, fw: Framework, reason: str) -> Decision:
    """A Q on the float path (no pattern, no integer form, or a declined precondition): the
    float path's value, quantized with the framework's own quantizer if it has one."""
    kernel = TABLE.get((fw, Pattern.QUANTIZE))
    m = quantize_match(graph, q)
    prepared = kernel(m) if kernel is not None and not isinstance(m, Decline) else None
    if prepared is None or isinstance(prepared, Decline) or isinstance(m, Decline):
        return Decision(q.outputs[0], _layer(graph, q), None, False, reason)
    return Decision(q.outputs[0], _layer(graph, q), Pattern.QUANTIZE, False,
                    f"{prepared.describe} of the float path ({reason})", m, prepared)


def _skippable(graph: Graph, integer: dict[str, Decision]) -> set[str]:
    """Nodes whose outputs only feed integer kernels that absorbed them (reverse topo)."""
    absorbed: dict[str, set[str]] = {}
    for d in integer.values():
        assert d.match is not None
        for node in d.match.absorbed:
            absorbed.setdefault(node.name, set()).add(d.match.root.name)
    skip: set[str] = set()
    outputs = set(graph.outputs)
    for node in reversed(graph.topo_order()):
        if node.name not in absorbed or any(o in outputs for o in node.outputs):
            continue
        readers = [c for o in node.outputs for c, _ in graph.consumers(o)]
        if all(c.name in skip or c.name in absorbed[node.name] for c in readers):
            skip.add(node.name)
    return skip


def emulate(
    graph: Graph,
    feeds: dict[str, np.ndarray],
    framework: Framework | str,
    keep: bool = True,
    *,
    decisions: list[Decision] | None = None,
) -> dict[str, np.ndarray]:
    """Run ``graph`` as ``framework`` would; every non-constant value if ``keep`` (default),
    else the graph outputs. ``decisions`` reuses a ``plan`` of the same graph."""
    decisions = plan(graph, framework) if decisions is None else decisions
    integer = {d.match.root.name: d for d in decisions
               if d.prepared is not None and d.match is not None}
    skip = set() if keep else _skippable(graph, integer)
    env = check_feeds(graph, feeds)

    def read(name: str) -> np.ndarray:
        data = graph.constant(name)
        return env[name] if data is None else data

    for node in graph.topo_order():
        if node.name in skip:
            continue
        decision = integer.get(node.name)
        try:
            if decision is not None:
                assert decision.prepared is not None
                outs = [decision.prepared.run(read)]
            else:
                fn = IMPLS.get(node.op)
                if fn is None:
                    raise MissingImplError(
                        f"node {node}: no reference implementation of {node.op.value}")
                outs = fn(node, [read(n) if n else None for n in node.inputs])
            for name, array in zip(node.outputs, outs, strict=True):
                env[name] = conform(graph, name, array)
        except MissingImplError:
            raise
        except Exception as exc:
            raise EvaluationError(f"node {node}: {type(exc).__name__}: {exc}") from exc
    if keep:
        return env
    return {name: read(name) for name in graph.outputs}
