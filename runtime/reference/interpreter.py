"""The reference interpreter: walk the graph in topological order, look each op up in IMPLS.

``evaluate`` is the `reference` mode of qfuse and the oracle the passes are checked against
(before vs after each rewrite, with ``keep=True`` to compare intermediate tensors). The
semantics of every op live in the ``ops_*`` modules; this loop only moves arrays around.

An output whose TensorInfo declares another element type than the op computed is converted
only when that is exact (a quantize-only FakeQuantize computes integer-valued float32 and
declares u8/s8); anything else is an error naming the node, as is a shape mismatch.
"""

from __future__ import annotations

import numpy as np

from qfuse.ir.errors import InputError, QfuseError
from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.runtime.reference import (  # noqa: F401
    ops_elementwise,
    ops_island,
    ops_nn,
    ops_quant,
    ops_reduce,
    ops_shape,
)
from qfuse.runtime.reference.fused import evaluate_fused
from qfuse.runtime.reference.registry import IMPLS


class MissingImplError(NotImplementedError):
    """No reference implementation for an op; the message names the node and the op."""


class EvaluationError(RuntimeError):
    """An op failed; the message names the node, the original exception is chained."""


def evaluate(
    graph: Graph, feeds: dict[str, np.ndarray], *, keep: bool = False, composed: bool = False
) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``feeds``; the graph outputs, or every non-constant value if ``keep``.

    Fused nodes evaluate their post-op chain (runtime/reference/fused.py); with ``composed``
    they evaluate the oneDNN attributes the composer recorded for them instead.
    """
    env = check_feeds(graph, feeds)
    for node in graph.topo_order():
        fn = IMPLS.get(node.op)
        if fn is None:
            raise MissingImplError(f"node {node}: no reference implementation of {node.op.value}")
        args = [_read(graph, env, name) if name else None for name in node.inputs]
        try:
            outs = run_node(node, args, graph, composed=composed)
            dynamic = node.attrs.dynamic if node.op is Op.ISLAND else (False,) * len(outs)
            for name, array, free in zip(node.outputs, outs, dynamic, strict=True):
                env[name] = array if free else conform(graph, name, array)
        except QfuseError:  # the user's to act on (an island's engine refusing its inputs)
            raise
        except Exception as exc:
            raise EvaluationError(f"node {node}: {type(exc).__name__}: {exc}") from exc
    if keep:
        return env
    return {name: _read(graph, env, name) for name in graph.outputs}


def run_node(
    node: Node, args: list[np.ndarray | None], graph: Graph, *, composed: bool = False
) -> list[np.ndarray]:
    """One node on its input arrays: its op's function, or its fused chain."""
    if node.fused:
        return evaluate_fused(node, args, graph, composed=composed)
    return IMPLS[node.op](node, args)


def _read(graph: Graph, env: dict[str, np.ndarray], name: str) -> np.ndarray:
    data = graph.constant(name)
    return env[name] if data is None else data


def check_feeds(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise InputError(f"feeds name {unknown}, which are not inputs of graph '{graph.name}'")
    env: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in feeds:
            raise InputError(f"input '{name}' is not fed")
        array, info = np.asarray(feeds[name]), graph.info(name)
        if array.shape != info.shape or array.dtype != info.dtype.np:
            raise InputError(f"input '{name}': got {array.dtype}{list(array.shape)}, "
                             f"the graph wants {info.dtype.np}{list(info.shape)}")
        env[name] = array
    return env


def conform(graph: Graph, name: str, array: np.ndarray) -> np.ndarray:
    info = graph.values[name].info
    if info is None:
        return array
    if array.shape != info.shape:
        raise ValueError(f"output '{name}' has shape {array.shape}, its info says {info.shape}")
    if array.dtype == info.dtype.np:
        return array
    with np.errstate(invalid="ignore", over="ignore"):
        cast = array.astype(info.dtype.np)
        exact = np.array_equal(cast.astype(array.dtype), array)
    if not exact:
        raise ValueError(f"output '{name}' is {array.dtype}, its info says {info.dtype.np} "
                         "and the values do not convert exactly")
    return cast
