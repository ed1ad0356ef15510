"""Nodes that compute the same value from the same inputs become one (common subexpression
elimination).

Quantizers write such duplicates: onnxruntime's ``quantize_static`` with
``extra_options={"DedicatedQDQPair": True}`` gives every reader of a tensor its own
QuantizeLinear → DequantizeLinear pair (same input, same scale and zero point), and exporters
repeat shape arithmetic. Each copy would otherwise be its own kernel, and a quantize with two
copies has two readers, so the chain of the op before it stops there.

Pattern: two nodes with the same op, the same attributes and the same inputs in port order,
where an input is the same if it is the same value, or two constants of equal dtype, shape
and bytes (quantizers give each pair its own scale and zero point initializers). Every IR op
is a function of its inputs and attributes (no random ops), so the second node's outputs are
the first's: its readers read the first node's outputs and it goes. Exact (no arithmetic).
Nodes are visited in topological order, so a merge makes the readers of both copies equal
too and merges them in the same sweep (the DequantizeLinear after two merged quantizes).

Declined, with the reason recorded: the duplicate's output is a graph output (both names must
stay). The kept node's ``origin`` lists the merged node's, so `inspect` shows it absorbed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any

import numpy as np

from qfuse.ir import Graph, Node
from qfuse.passes.base import PassContext

log = logging.getLogger(__name__)

#: Constants up to this many bytes are compared by value; larger ones by name only (hashing
#: every weight tensor would cost more than it finds).
MAX_VALUE_BYTES = 1 << 16


def _attrs_key(attrs: Any) -> Any:
    """A hashable form of an attribute dataclass (numpy arrays by dtype, shape and bytes)."""
    if dataclasses.is_dataclass(attrs) and not isinstance(attrs, type):
        return (type(attrs).__name__,
                tuple((f.name, _attrs_key(getattr(attrs, f.name)))
                      for f in dataclasses.fields(attrs)))
    if isinstance(attrs, np.ndarray):
        return ("array", attrs.dtype.str, attrs.shape, attrs.tobytes())
    if isinstance(attrs, (list, tuple)):
        return (type(attrs).__name__, tuple(_attrs_key(a) for a in attrs))
    if isinstance(attrs, dict):
        return ("dict", tuple(sorted((k, _attrs_key(v)) for k, v in attrs.items())))
    if isinstance(attrs, float) and attrs != attrs:  # NaN equals itself here
        return ("nan",)
    return attrs


def _input_key(graph: Graph, name: str) -> Any:
    if not name:
        return ""
    data = graph.constant(name)
    if data is None or data.nbytes > MAX_VALUE_BYTES:
        return name
    digest = hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()
    return ("const", data.dtype.str, data.shape, digest)


def _key(graph: Graph, node: Node) -> Any:
    return (node.op, len(node.outputs), tuple(_input_key(graph, v) for v in node.inputs),
            _attrs_key(node.attrs))


def run(graph: Graph, ctx: PassContext) -> int:
    seen: dict[Any, Node] = {}
    count = 0
    outputs = set(graph.outputs)
    for node in graph.topo_order():
        if node.fused is not None:
            continue
        try:
            key = _key(graph, node)
            hash(key)
        except TypeError:  # an attribute holds something unhashable: compare nothing
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        ctx.visit(node)
        if outputs.intersection(node.outputs):
            ctx.decline(node, f"computes the same as {first} but writes a graph output "
                              "(both names must stay)")
            continue
        for mine, theirs in zip(node.outputs, first.outputs, strict=True):
            graph.replace_all_uses(mine, theirs)
        graph.remove_node(node)
        first.origin.extend(o for o in node.origin if o not in first.origin)
        log.debug("merged %s into %s", node, first)
        count += 1
    return count
