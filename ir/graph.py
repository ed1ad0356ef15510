"""The graph: typed op nodes connected by named values, over a networkx MultiDiGraph.

This is the only module that imports networkx. A ``Node`` lists its input and output value
names in port order (an empty string marks a missing optional input, as in ONNX). A ``Value``
is a named tensor: a graph input, a constant (``data`` set) or the output of exactly one node.
The networkx graph holds one vertex per node and one edge per (producer output, consumer
input) pair, so topological order, reachability and cycle checks come from networkx.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from qfuse.ir.chain import Fused
from qfuse.ir.ops import ATTRS, Op, arity
from qfuse.ir.types import DType, TensorInfo


def in_model_order(array: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """A value a graph holds with its channels (dim 1) in ``order`` (``Graph.channel_orders``)
    as the model holds it; unchanged without an order or with another channel count."""
    if order is None or array.ndim < 2 or array.shape[1] != len(order):
        return array
    return np.take(array, np.argsort(order), axis=1)


def in_graph_order(array: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """The inverse of ``in_model_order``."""
    if order is None or array.ndim < 2 or array.shape[1] != len(order):
        return array
    return np.take(array, order, axis=1)


def shifted_levels(array: np.ndarray, offset: int, dtype: np.dtype) -> np.ndarray:
    """Integers ``array + offset`` as ``dtype``: a value a graph re-encodes
    (``Graph.level_offsets``) between the model's integers and its own, either way."""
    return (array.astype(np.int16) + offset).astype(dtype)


class GraphError(ValueError):
    """A broken invariant of the graph; the message names the node or value."""


@dataclass
class Value:
    name: str
    info: TensorInfo | None = None
    data: np.ndarray | None = None

    @property
    def is_constant(self) -> bool:
        return self.data is not None


@dataclass
class Node:
    name: str
    op: Op
    attrs: Any
    inputs: list[str]
    outputs: list[str]
    # Names of the ONNX nodes this node stands for (the importer seeds it with its own name;
    # fusions append the names they absorb) and free-form notes passes leave for `inspect`.
    origin: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # Set on compute nodes that the passes turned into int8 kernels (ir/chain.py).
    fused: Fused | None = None

    def __str__(self) -> str:
        return f"'{self.name}' ({self.op.value})"


class Graph:
    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.values: dict[str, Value] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self._nodes: dict[str, Node] = {}
        self._nx = nx.MultiDiGraph()
        self._producer: dict[str, str] = {}
        self._counter = itertools.count()
        self._seq: dict[str, int] = {}
        self._seq_counter = itertools.count()
        # graph input -> the dims the model leaves symbolic (the importer fixed them: batch 1,
        # or the caller's input_shapes); compiler/api.py re-specializes for other sizes
        self.free_dims: dict[str, tuple[int, ...]] = {}
        # value -> the order this graph holds its channels (dim 1) in: position i holds the
        # model's channel order[i] (passes/pair_channels.py); values not listed are as given
        self.channel_orders: dict[str, np.ndarray] = {}
        # integer value -> (what this graph adds to the model's integers there, the model's
        # type): an activation re-encoded with another zero point and type
        # (passes/decompose_fake_quantize.py: the zero level, unsigned activations), the same
        # dequantized values; others as given
        self.level_offsets: dict[str, tuple[int, DType]] = {}

    # ----------------------------------------------------------------- values
    def add_input(self, name: str, info: TensorInfo) -> Value:
        value = self._new_value(name, info)
        self.inputs.append(name)
        return value

    def add_constant(self, name: str, data: np.ndarray, info: TensorInfo | None = None) -> Value:
        array = np.array(data, copy=True)
        array.setflags(write=False)
        if info is None:
            info = TensorInfo(tuple(array.shape), DType.from_numpy(array.dtype))
        return self._new_value(name, info, array)

    def constant(self, name: str) -> np.ndarray | None:
        """The data of a constant value, or None when ``name`` is not a constant."""
        value = self.values.get(name)
        return None if value is None else value.data

    def info(self, name: str) -> TensorInfo:
        value = self.values[name]
        if value.info is None:
            raise GraphError(f"value '{name}' has no tensor info (shapes not inferred)")
        return value.info

    def set_info(self, name: str, info: TensorInfo) -> None:
        self.values[name].info = info

    def unique_name(self, base: str) -> str:
        name = base
        while name in self.values or name in self._nodes:
            name = f"{base}_{next(self._counter)}"
        return name

    def _new_value(
        self, name: str, info: TensorInfo | None, data: np.ndarray | None = None
    ) -> Value:
        if not name:
            raise GraphError("a value needs a non-empty name")
        if name in self.values:
            raise GraphError(f"value '{name}' is defined twice")
        value = Value(name, info, data)
        self.values[name] = value
        return value

    # ------------------------------------------------------------------ nodes
    def add_node(
        self,
        op: Op,
        inputs: Iterable[str],
        outputs: Iterable[str] | int = 1,
        attrs: Any = None,
        *,
        name: str | None = None,
        infos: Iterable[TensorInfo | None] | None = None,
        origin: Iterable[str] = (),
    ) -> Node:
        """Add a node; ``outputs`` are new value names (or a count, to have them named)."""
        name = self.unique_name(name or op.value.lower())
        if isinstance(outputs, int):
            outputs = [self.unique_name(f"{name}_out{i}" if outputs > 1 else name)
                       for i in range(outputs)]
        outputs = list(outputs)
        inputs = list(inputs)
        if attrs is None:
            attrs = ATTRS[op]()
        for value in inputs:
            if value and value not in self.values:
                raise GraphError(f"node '{name}' ({op.value}) reads unknown value '{value}'")
        infos = list(infos) if infos is not None else [None] * len(outputs)
        for out, info in zip(outputs, infos, strict=True):
            self._new_value(out, info)
            self._producer[out] = name
        node = Node(name, op, attrs, inputs, outputs, list(origin) or [name])
        self._nodes[name] = node
        self._seq[name] = next(self._seq_counter)
        self._nx.add_node(name)
        for port, value in enumerate(inputs):
            self._link(value, name, port)
        return node

    def _link(self, value: str, consumer: str, port: int) -> None:
        producer = self._producer.get(value)
        if producer is not None:
            self._nx.add_edge(producer, consumer, key=(value, port))

    def _unlink(self, value: str, consumer: str, port: int) -> None:
        producer = self._producer.get(value)
        if producer is not None and self._nx.has_edge(producer, consumer, key=(value, port)):
            self._nx.remove_edge(producer, consumer, key=(value, port))

    def node(self, name: str) -> Node:
        return self._nodes[name]

    def has_node(self, name: str) -> bool:
        return name in self._nodes

    def __iter__(self) -> Iterator[Node]:
        return iter(self.topo_order())

    def __len__(self) -> int:
        return len(self._nodes)

    def producer(self, value: str) -> Node | None:
        name = self._producer.get(value)
        return None if name is None else self._nodes[name]

    def consumers(self, value: str) -> list[tuple[Node, int]]:
        """Every (node, input port) that reads ``value``, in topological order of the nodes."""
        found: list[tuple[Node, int]] = []
        producer = self._producer.get(value)
        candidates = (
            (self._nodes[c] for c in dict.fromkeys(self._nx.successors(producer)))
            if producer is not None
            else self._nodes.values()
        )
        for node in candidates:
            found.extend((node, port) for port, v in enumerate(node.inputs) if v == value)
        return found

    def uses(self, value: str) -> int:
        """Number of reads of ``value``, graph outputs included."""
        return len(self.consumers(value)) + self.outputs.count(value)

    def reaches(self, source: Node, target: Node) -> bool:
        """True when a path of data edges leads from ``source`` to ``target``."""
        return nx.has_path(self._nx, source.name, target.name)

    def topo_order(self) -> list[Node]:
        try:
            order = list(nx.lexicographical_topological_sort(self._nx, key=self._order_key))
        except nx.NetworkXUnfeasible as exc:
            cycle = nx.find_cycle(self._nx)
            raise GraphError(f"graph has a cycle through {[e[0] for e in cycle]}") from exc
        return [self._nodes[n] for n in order]

    def _order_key(self, name: str) -> str:
        # Ties are broken by insertion order, so the order is stable across runs.
        return f"{self._seq[name]:012d}"

    # -------------------------------------------------------------- rewriting
    def set_input(self, node: Node, port: int, value: str) -> None:
        """Make ``node`` read ``value`` at input ``port``."""
        if value and value not in self.values:
            raise GraphError(f"node {node} cannot read unknown value '{value}'")
        old = node.inputs[port]
        self._unlink(old, node.name, port)
        node.inputs[port] = value
        self._link(value, node.name, port)

    def set_inputs(self, node: Node, values: list[str]) -> None:
        """Make ``node`` read ``values`` (any count) in place of its inputs."""
        for value in values:
            if value and value not in self.values:
                raise GraphError(f"node {node} cannot read unknown value '{value}'")
        for port, old in enumerate(node.inputs):
            self._unlink(old, node.name, port)
        node.inputs[:] = values
        for port, value in enumerate(values):
            self._link(value, node.name, port)

    def append_input(self, node: Node, value: str) -> int:
        """Make ``node`` read ``value`` at a new last input port; returns the port."""
        if value not in self.values:
            raise GraphError(f"node {node} cannot read unknown value '{value}'")
        node.inputs.append(value)
        port = len(node.inputs) - 1
        self._link(value, node.name, port)
        return port

    def replace_all_uses(self, old: str, new: str) -> int:
        """Every reader of ``old`` (graph outputs included) reads ``new``; returns the count."""
        count = 0
        for node, port in self.consumers(old):
            self.set_input(node, port, new)
            count += 1
        for i, out in enumerate(self.outputs):
            if out == old:
                self.outputs[i] = new
                count += 1
        return count

    def insert_after(self, node: Node, port: int, op: Op, attrs: Any, info: TensorInfo, *,
                     name: str | None = None) -> Node:
        """Make a new ``op`` node produce ``node``'s output ``port`` (same name, same readers,
        graph outputs included), reading a new value of ``info`` that ``node`` writes instead."""
        value = node.outputs[port]
        readers = self.consumers(value)
        for reader, reader_port in readers:
            self._unlink(value, reader.name, reader_port)
        inner = self.unique_name(f"{value}@{op.value.lower()}")
        self._new_value(inner, info)
        self._producer[inner] = node.name
        node.outputs[port] = inner
        new_name = self.unique_name(name or f"{node.name}/{op.value.lower()}")
        new = Node(new_name, op, ATTRS[op]() if attrs is None else attrs, [inner], [value],
                   list(node.origin))
        self._nodes[new_name] = new
        self._seq[new_name] = next(self._seq_counter)
        self._nx.add_node(new_name)
        self._producer[value] = new_name
        self._link(inner, new_name, 0)
        for reader, reader_port in readers:
            self._link(value, reader.name, reader_port)
        return new

    def remove_node(self, node: Node) -> None:
        """Remove a node whose outputs nobody reads; its output values go with it."""
        for out in node.outputs:
            if self.uses(out):
                raise GraphError(f"cannot remove node {node}: its output '{out}' is still read")
        for port, value in enumerate(node.inputs):
            self._unlink(value, node.name, port)
        for out in node.outputs:
            del self.values[out]
            del self._producer[out]
        self._nx.remove_node(node.name)
        del self._nodes[node.name]
        del self._seq[node.name]

    def bypass(self, node: Node, port: int = 0) -> None:
        """Remove a single-output node, its readers reading its input ``port`` instead."""
        if len(node.outputs) != 1:
            raise GraphError(f"cannot bypass node {node}: it has {len(node.outputs)} outputs")
        self.replace_all_uses(node.outputs[0], node.inputs[port])
        self.remove_node(node)

    def remove_unused(self) -> int:
        """Drop nodes whose outputs reach no graph output, and unread constants."""
        removed = 0
        changed = True
        while changed:
            changed = False
            for node in reversed(self.topo_order()):
                if not any(self.uses(out) for out in node.outputs):
                    self.remove_node(node)
                    removed += 1
                    changed = True
        read = {v for n in self._nodes.values() for v in n.inputs} | set(self.outputs)
        for name in [n for n, v in self.values.items() if v.is_constant and n not in read]:
            del self.values[name]
        return removed

    def copy(self) -> Graph:
        return copy.deepcopy(self)

    # ------------------------------------------------------------ invariants
    def problems(self) -> list[str]:
        """Every broken invariant, each naming the node or value involved."""
        found: list[str] = []
        for name in self.inputs:
            if name not in self.values:
                found.append(f"graph input '{name}' is not a value")
            elif name in self._producer or self.values[name].is_constant:
                found.append(f"graph input '{name}' is also produced or constant")
        for name in self.outputs:
            if name not in self.values:
                found.append(f"graph output '{name}' is not a value")
        sources = set(self.inputs) | set(self._producer)
        for name, value in self.values.items():
            if not value.is_constant and name not in sources:
                found.append(f"value '{name}' has no producer and is neither input nor constant")
            if value.is_constant and name in self._producer:
                found.append(f"constant '{name}' also has a producer")
        for node in self._nodes.values():
            found.extend(self._node_problems(node))
        if not nx.is_directed_acyclic_graph(self._nx):
            found.append(f"graph has a cycle through {[e[0] for e in nx.find_cycle(self._nx)]}")
        return found

    def _node_problems(self, node: Node) -> list[str]:
        found = []
        expected = ATTRS.get(node.op)
        if expected is None:
            found.append(f"node {node}: op has no attribute class")
        elif not isinstance(node.attrs, expected):
            found.append(f"node {node}: attrs {type(node.attrs).__name__}, want {expected.__name__}")
        low, high = arity(node.op)
        if node.fused is not None:
            high = None  # residual inputs of the post-op chain follow the op's own inputs
        if len(node.inputs) < low or (high is not None and len(node.inputs) > high):
            found.append(f"node {node}: {len(node.inputs)} inputs, want {low}..{high or 'n'}")
        for port, value in enumerate(node.inputs):
            if value and value not in self.values:
                found.append(f"node {node}: input {port} '{value}' is not a value")
            elif port < low and not value:
                found.append(f"node {node}: required input {port} is missing")
        for out in node.outputs:
            if self._producer.get(out) != node.name:
                found.append(f"node {node}: output '{out}' is not registered to it")
        for port, value in enumerate(node.inputs):
            producer = self._producer.get(value)
            if producer and not self._nx.has_edge(producer, node.name, key=(value, port)):
                found.append(f"node {node}: edge for input {port} '{value}' is missing")
        return found

    def verify(self) -> None:
        """Raise GraphError listing every broken invariant."""
        found = self.problems()
        if found:
            raise GraphError(f"graph '{self.name}' is invalid:\n  " + "\n  ".join(found))

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self._nodes)} nodes, {len(self.values)} values)"


def scale_product(graph: Graph, value: str,
                  const: Callable[[str], np.ndarray | None] | None = None
                  ) -> tuple[str, np.ndarray] | None:
    """``value = Mul(s, c)`` (either order) with s a run-time float32 scalar and c a float32
    constant — dynamic quantization's ``s_x·s_w``, a DynamicQuantizeLinear's scale times the
    weight scales — as (s, c); None otherwise. ``const`` reads constants (default: the
    graph's; the lowering passes its own, which also holds the values it folded)."""
    const = const or graph.constant
    mul = graph.producer(value)
    if mul is None or mul.op is not Op.MUL or mul.fused is not None or len(mul.inputs) != 2:
        return None
    data = [const(v) for v in mul.inputs]
    runtime = [i for i, d in enumerate(data) if d is None]
    if len(runtime) != 1:
        return None
    s, c = mul.inputs[runtime[0]], data[1 - runtime[0]]
    info = graph.info(s)
    if info.dtype is not DType.F32 or info.size != 1 or c is None or c.dtype != np.float32:
        return None
    return s, c
