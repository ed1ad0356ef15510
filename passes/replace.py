"""Graph edits the import-cleanup passes share: replace nodes while keeping value names.

A graph output's name is part of the model's interface, and value names are what `qfuse
inspect` and the before/after comparisons (``evaluate(keep=True)``) show; so a rewrite that
replaces nodes gives the new nodes' outputs the old names. A value's name is its identity in
the graph (no rename), hence ``replace_nodes``:

1. park every reader outside the old nodes (nodes and graph-output slots) of the old nodes'
   outputs on a value the old nodes read and that stays (``parking``);
2. remove the old nodes, which frees their node names and value names;
3. call ``build()``, which adds the new nodes and constants, reusing those names;
4. point each parked reader at ``rename.get(value, value)``, which must exist again.

Precondition: ``old`` reads at least one value it does not produce (every op has an input).
The parking value is upstream of ``old`` and the readers downstream, so no cycle appears,
and nothing evaluates the graph between steps 1 and 4.

``bypass_keeping_name`` removes a single-input, single-output node whose output equals its
input (Identity, Dropout, one-input Sum), keeping its output name when that is a graph output
by making the input's producer write it — what OpenVINO's ``replace_output_update_name`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from qfuse.ir import Graph, GraphError, Node, Op, TensorInfo
from qfuse.ir.shapes import infer_node

log = logging.getLogger(__name__)

T = TypeVar("T")


def replace_nodes(
    graph: Graph,
    old: Sequence[Node],
    build: Callable[[], T],
    rename: Mapping[str, str] | None = None,
) -> T:
    """Replace the nodes ``old`` by what ``build()`` adds (module docstring); returns its result."""
    rename = rename or {}
    group = {node.name for node in old}
    produced = {out for node in old for out in node.outputs}
    parking = next((v for node in old for v in node.inputs if v and v not in produced), None)
    if parking is None:
        raise GraphError(f"nodes {[n.name for n in old]} read nothing from outside")
    parked: list[tuple[str, str | None, int]] = []
    for value in [out for node in old for out in node.outputs]:
        for reader, port in graph.consumers(value):
            if reader.name not in group:
                parked.append((value, reader.name, port))
                graph.set_input(reader, port, parking)
        for slot, out in enumerate(graph.outputs):
            if out == value:
                parked.append((value, None, slot))
                graph.outputs[slot] = parking
    pending = list(old)
    while pending:
        free = next((n for n in pending if not any(graph.uses(o) for o in n.outputs)), None)
        if free is None:
            raise GraphError(f"nodes {[n.name for n in pending]} read each other in a cycle")
        graph.remove_node(free)
        pending.remove(free)
    result = build()
    for value, reader, port in parked:
        target = rename.get(value, value)
        if target not in graph.values:
            raise GraphError(f"replacing {sorted(group)}: value '{target}' was not rebuilt")
        if reader is None:
            graph.outputs[port] = target
        else:
            graph.set_input(graph.node(reader), port, target)
    return result


def add_inferred(
    graph: Graph,
    op: Op,
    inputs: Iterable[str],
    outputs: Iterable[str] | int = 1,
    attrs: Any = None,
    *,
    name: str | None = None,
    origin: Iterable[str] = (),
) -> Node:
    """``graph.add_node`` plus the output infos from shape inference (ir.shapes)."""
    node = graph.add_node(op, inputs, outputs, attrs, name=name, origin=origin)
    for out, info in zip(node.outputs, infer_node(graph, node), strict=True):
        graph.set_info(out, info)
    return node


def clone(
    graph: Graph,
    node: Node,
    outputs: list[str],
    infos: list[TensorInfo | None],
    origin: Iterable[str] = (),
) -> Node:
    """A copy of the removed ``node`` (same name, op, attributes, inputs, meta, fused chain)
    writing ``outputs`` with ``infos``; ``origin`` is appended to the node's own."""
    new = graph.add_node(node.op, list(node.inputs), outputs, node.attrs, name=node.name,
                         infos=infos, origin=[*node.origin, *origin])
    new.meta = dict(node.meta)
    new.fused = node.fused
    return new


def bypass_keeping_name(graph: Graph, node: Node) -> str | None:
    """Remove ``node`` (its output equals its input 0); None when done, else why not.

    When the output is a graph output, the producer of the input is rebuilt writing the
    output's name; its other readers follow. That is impossible when the input is a graph
    input, a constant or itself a graph output (both names must stay).
    """
    x, y = node.inputs[0], node.outputs[0]
    if y not in graph.outputs:
        graph.bypass(node)
        return None
    if x in graph.outputs:
        return f"output '{y}' is a graph output and so is its input '{x}': both names must stay"
    producer = graph.producer(x)
    if producer is None:
        kind = "a constant" if graph.constant(x) is not None else "a graph input"
        return (f"output '{y}' is a graph output and its input '{x}' is {kind}: "
                "both names must stay")
    outputs = [y if out == x else out for out in producer.outputs]
    infos = [graph.values[out].info for out in producer.outputs]
    replace_nodes(graph, [producer, node],
                  lambda: clone(graph, producer, outputs, infos, node.origin), {x: y})
    log.debug("%s now writes '%s' in place of %s", producer, y, node)
    return None
