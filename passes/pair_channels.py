"""Channel orders chosen so that oneDNN's int16 pairs of input channels stay within range.

On a CPU without VNNI, oneDNN's int8 convolutions add the products of input channels 2k and
2k + 1 in int16 with saturation (``vpmaddubsw``); compiler/lower/no_vnni.py keeps them exact
with pair-safe weights ``m = w − e`` and runs the excess ``e`` (non-zero only where a pair's
weights have one sign and add up past 128) as a second convolution over the even input
channels. Which channels pair is the order of the channels in memory, and that order is free
wherever every node writing or reading the tensor can take it permuted:

    conv(x, W)[o]        = Σ_i W[o, i] ∗ x[i]     reading x[π]: weights W[:, π]
    conv(x, W)[π(o)]     writing the output in the order π: weights W[π], and every
                         per-channel value of its chain (scales, bias, ranges) taken at π
    f(x)[π] = f(x[π])    elementwise ops, pools, resizes, quantizations (per-channel
                         constants taken at π), concatenations and splits (per block)

so the graph computes the same values, channel for channel, in another order: bit-exact (an
integer sum does not depend on its order, and every float op is per channel). This pass picks
such orders (``reorder``) and rewrites the graph's constants for them (``_apply``).

Which channels must move together. Each value of rank ≥ 3 has its channels (dim 1) cut into
segments; a segment is a piece of an *atom*: a set of channels that every value holding them
holds in one order. Elementwise nodes (and a depthwise convolution) give their input and
output one structure; a concatenation's output is its inputs' segments one after the other,
a split the reverse. A convolution with group 1 ends the structure: its input's order goes
into its weights' columns and its output's into their rows. Everything else (graph inputs and
outputs, reshapes, matmuls, ops this file does not list) pins its values' atoms: their order
stays.

The order of an atom. For each int8 convolution reading it (on an even offset, an even count
of channels), the cost of pairing channels a and b is the number of (output channel, tap)
where ``w_a`` and ``w_b`` have one sign and add up past 128 (runtime/numerics/pairs.py); a pair
unsafe for a reader would cost that reader's excess kernel its MACs per pair. A matching of
the channels over the pairs that cost no reader anything (greedy, fewest partners first)
leaves few unsafe pairs, and those go first (the heaviest reader's first): each excess kernel
then reads a prefix of the even channels (no_vnni ``_leading_pairs``). Kept only where the
excess kernels' MACs go down.
Measured on YOLOv8n NNCF (63 convolutions with weights past ±64): 13 034 unsafe (pair, output
channel, tap) in the given order; the pairs holding one: 79 % of the weights' columns in the
given order, 23 % after a matching per convolution.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.ir.chain import ChainOp, PRelu, Quantize, Residual, Scale, Shift, TensorOperand
from qfuse.ir.ops import ConvAttrs
from qfuse.ir.types import OnnxQuantize, QuantParams
from qfuse.passes.base import PassContext
from qfuse.runtime.numerics.pairs import PAIR_LIMIT, SAFE_WEIGHT

log = logging.getLogger(__name__)

# Comparisons _pair_costs may make for one reader and for the whole graph (``pair_work``):
# trained layers need up to ~17 M, random-weight MobileNetV1's largest 92 M; EfficientViT-L1
# with random weights 9.5 G for one 6144-channel layer and 30 G in all (4.4 GiB of booleans a
# comparison and minutes of numpy). Past either bound an atom keeps its order.
MAX_PAIR_WORK = 1 << 27
AT_ONCE_WORK = 1 << 22  # up to here _pair_costs compares all channels at once
MAX_GRAPH_PAIR_WORK = 1 << 30
# An atom's readers' costs and their sum are n x n matrices: 4096 channels take 64 MiB each.
MAX_PAIR_CHANNELS = 4096

# ops whose output channel c depends on input channel c only (inputs broadcast to the output)
_ELEMENTWISE = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SUM, Op.RELU, Op.CLIP, Op.LEAKY_RELU, Op.PRELU,
    Op.SIGMOID, Op.SWISH, Op.TANH, Op.HARD_SIGMOID, Op.HARD_SWISH, Op.GELU, Op.SQRT, Op.EXP,
    Op.LOG, Op.POW,
    Op.IDENTITY, Op.DROPOUT, Op.CAST, Op.FAKE_QUANTIZE,
})
# ops over the spatial dims only, reading their input at port 0 (other ports: sizes, none)
_SPATIAL = frozenset({Op.MAX_POOL, Op.AVG_POOL, Op.GLOBAL_AVG_POOL, Op.GLOBAL_MAX_POOL,
                      Op.RESIZE})


@dataclass
class _Constraints:
    """What the graph's nodes say about the channel orders of its values."""

    same: list[tuple[str, str]] = field(default_factory=list)
    # (whole, parts): the whole's channels are the parts' one after the other
    blocks: list[tuple[str, list[str]]] = field(default_factory=list)
    pinned: set[str] = field(default_factory=set)
    # (node, port, axis, value): a constant of ``node`` whose ``axis`` follows the channel
    # order of ``value`` (the node's output; a convolution's input for its weights' columns)
    constants: list[tuple[Node, int, int, str]] = field(default_factory=list)


def run(graph: Graph, ctx: PassContext) -> int:
    """Reorder channels where it shortens the excess of pair-safe weights; the count of
    values whose channel order changed."""
    if not ctx.pair_input_channels:
        return 0
    cons = _constraints(graph)
    order = reorder(graph, cons)
    if order:
        _apply(graph, cons, order)
    return len(order)


# ---------------------------------------------------------------------------- structure
def _channels(graph: Graph, value: str) -> int | None:
    """The channel count of a value this pass tracks (a rank ≥ 3 tensor), or None."""
    if not value or graph.values[value].is_constant:
        return None
    shape = graph.info(value).shape
    return int(shape[1]) if len(shape) >= 3 else None


def _broadcast_axis(rank: int, out_rank: int) -> int | None:
    """The axis of a rank-``rank`` input that broadcasts along the output's dim 1."""
    axis = 1 - (out_rank - rank)
    return axis if axis >= 0 else None


def _operand(graph: Graph, node: Node, port: int, out: str, cons: _Constraints) -> bool:
    """Constrain an input that broadcasts to ``out`` (elementwise); False when it cannot
    follow a reordering of the output's channels."""
    value = node.inputs[port]
    if not value:
        return True
    out_shape = graph.info(out).shape
    shape = graph.info(value).shape
    axis = _broadcast_axis(len(shape), len(out_shape))
    if axis is None or shape[axis] == 1:
        return True
    if shape[axis] != out_shape[1]:
        return False
    if graph.values[value].is_constant:
        cons.constants.append((node, port, axis, out))
        return True
    if len(shape) != len(out_shape):
        return False
    cons.same.append((value, out))
    return True


def _chain_ports(node: Node) -> set[int]:
    if node.fused is None:
        return set()
    return {op.port for op in node.fused.chain if isinstance(op, (Residual, TensorOperand))}


def _per_channel_quant(node: Node) -> bool:
    """A FakeQuantize made from a per-channel Q/DQ: its pair is kept in its attributes and in
    ``meta["qdq"]`` (dtype, QuantParams: passes/qdq_to_fake_quantize.py)."""
    onnx = getattr(node.attrs, "onnx", None)
    qdq = node.meta.get("qdq")
    quants = [getattr(onnx, "quant", None), qdq[1] if isinstance(qdq, tuple) else None]
    return any(isinstance(q, QuantParams) and not q.per_tensor for q in quants)


def _conv(graph: Graph, node: Node, cons: _Constraints) -> bool:
    """A convolution with constant weights: group 1 ends the structure (its weights take
    both orders), a depthwise one passes it on; False otherwise."""
    attrs = node.attrs
    w = graph.constant(node.inputs[1])
    src, out = node.inputs[0], node.outputs[0]
    if not isinstance(attrs, ConvAttrs) or w is None or w.ndim != len(graph.info(out).shape):
        return False
    channels_in, channels_out = graph.info(src).shape[1], graph.info(out).shape[1]
    cons.constants.append((node, 1, 0, out))  # rows: the output's order
    if attrs.group == 1:
        cons.constants.append((node, 1, 1, src))  # columns: the input's
    elif attrs.group == channels_in == channels_out and w.shape[1] == 1:
        cons.same.append((src, out))
    else:
        return False
    chain = _chain_ports(node)
    if node.fused is not None and node.fused.src_zero_point_port is not None:
        chain.add(node.fused.src_zero_point_port)
    for port in range(2, len(node.inputs)):
        if port in chain or not node.inputs[port]:
            if not _operand(graph, node, port, out, cons):
                return False
            continue
        bias = graph.constant(node.inputs[port])  # a bias, per output channel
        if port != 2 or bias is None or bias.shape != (channels_out,):
            return False
        cons.constants.append((node, port, 0, out))
    return True


def _quantization(graph: Graph, node: Node, cons: _Constraints) -> bool:
    """QuantizeLinear / DequantizeLinear: per-channel parameters along dim 1 follow it."""
    src, out = node.inputs[0], node.outputs[0]
    axis = node.attrs.axis % len(graph.info(out).shape)
    for port in (1, 2):
        if port >= len(node.inputs) or not node.inputs[port]:
            continue
        data = graph.constant(node.inputs[port])
        if data is None:
            return False
        if data.size > 1 and axis == 1:
            cons.constants.append((node, port, 0, out))
    cons.same.append((src, out))
    return True


def _constrain(graph: Graph, node: Node, cons: _Constraints) -> bool:
    """Add what ``node`` says; False when its values must keep their order."""
    if not node.outputs or _channels(graph, node.outputs[0]) is None:
        return False
    out = node.outputs[0]
    if node.op is Op.CONV:
        return _conv(graph, node, cons)
    if node.op in (Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR) and len(node.outputs) == 1:
        return _quantization(graph, node, cons)
    if node.op in (Op.CONCAT, Op.SPLIT) and getattr(node.attrs, "axis", None) == 1:
        if node.op is Op.CONCAT:
            cons.blocks.append((out, list(node.inputs)))
        else:
            cons.blocks.append((node.inputs[0], list(node.outputs)))
        return all(_channels(graph, v) is not None for v in (*node.inputs, *node.outputs))
    if node.op in (Op.CONCAT, Op.SPLIT):  # along another axis: every channel stays
        cons.same.extend((v, out) for v in (*node.inputs, *node.outputs[1:]))
        return all(_channels(graph, v) is not None for v in (*node.inputs, *node.outputs))
    if node.op in _SPATIAL and len(node.outputs) == 1:
        cons.same.append((node.inputs[0], out))
        return graph.info(node.inputs[0]).shape[1] == graph.info(out).shape[1]
    if node.op in _ELEMENTWISE and len(node.outputs) == 1:
        if node.op is Op.FAKE_QUANTIZE and _per_channel_quant(node):
            return False
        return all(_operand(graph, node, port, out, cons) for port in range(len(node.inputs)))
    return False


def _constraints(graph: Graph) -> _Constraints:
    cons = _Constraints(pinned={*graph.inputs, *graph.outputs})
    for node in graph.topo_order():
        before = (len(cons.same), len(cons.blocks), len(cons.constants))
        kept = _constrain(graph, node, cons)
        related = [*(v for pair in cons.same[before[0]:] for v in pair),
                   *(v for whole, parts in cons.blocks[before[1]:] for v in (whole, *parts))]
        if not kept or any(_channels(graph, v) is None for v in related):
            del cons.same[before[0]:], cons.blocks[before[1]:], cons.constants[before[2]:]
            cons.pinned.update(v for v in (*node.inputs, *node.outputs)
                               if _channels(graph, v) is not None)
    return cons


# ------------------------------------------------------------------------------- atoms
@dataclass
class _Atoms:
    """The tracked values' channel segments ``(offset, size)`` and the atom of each."""

    segments: dict[str, list[tuple[int, int]]]
    parent: dict[tuple[str, int], tuple[str, int]]
    pinned: set[tuple[str, int]]

    def atom(self, value: str, index: int) -> tuple[str, int]:
        key = (value, index)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: tuple[str, int], b: tuple[str, int]) -> None:
        ra, rb = self.atom(*a), self.atom(*b)
        if ra != rb:
            self.parent[rb] = ra


def _cuts(graph: Graph, cons: _Constraints) -> dict[str, set[int]]:
    """Per tracked value, the offsets where its segments start and end: the fixpoint of
    the constraints (cuts only grow, so it ends)."""
    cuts = {v: {0, graph.info(v).shape[1]} for v in graph.values
            if _channels(graph, v) is not None}
    changed = True
    while changed:
        changed = False
        for a, b in cons.same:
            if cuts[a] != cuts[b]:
                cuts[a] = cuts[b] = cuts[a] | cuts[b]
                changed = True
        for whole, parts in cons.blocks:
            offset = 0
            for part in parts:
                size = graph.info(part).shape[1]
                inner = {c - offset for c in cuts[whole] if offset <= c <= offset + size}
                outer = {c + offset for c in cuts[part]}
                if not inner <= cuts[part] or not outer <= cuts[whole]:
                    cuts[part] = cuts[part] | inner
                    cuts[whole] = cuts[whole] | outer
                    changed = True
                offset += size
    return cuts


def _atoms(graph: Graph, cons: _Constraints) -> _Atoms:
    cuts = _cuts(graph, cons)
    segments = {v: [(a, b - a) for a, b in zip(sorted(c), sorted(c)[1:])]
                for v, c in cuts.items()}
    atoms = _Atoms(segments, {(v, i): (v, i) for v, segs in segments.items()
                              for i in range(len(segs))}, set())
    for a, b in cons.same:
        for i in range(len(segments[a])):
            atoms.union((a, i), (b, i))
    for whole, parts in cons.blocks:
        index = {offset: i for i, (offset, _) in enumerate(segments[whole])}
        offset = 0
        for part in parts:
            for i, (start, _) in enumerate(segments[part]):
                atoms.union((part, i), (whole, index[offset + start]))
            offset += graph.info(part).shape[1]
    atoms.pinned = {atoms.atom(v, i) for v in cons.pinned if v in segments
                    for i in range(len(segments[v]))}
    return atoms


# ------------------------------------------------------------------------------- orders
def _pair_costs(w: np.ndarray, work: int | None = None) -> np.ndarray:
    """``[n, n]``: for input channels a and b of integer weights ``[O, n, k…]``, the number
    of (output channel, tap) where ``w_a`` and ``w_b`` have one sign and add past
    PAIR_LIMIT. One of the two is then past SAFE_WEIGHT: with C[a, b] counting the taps
    where ``w_a`` is and ``w_b`` passes the limit with it, and D[a, b] those where both are
    past SAFE_WEIGHT, the count is C + Cᵀ − D; computed a channel a at a time, over the
    taps where ``w_a`` is past SAFE_WEIGHT (``work``: ``pair_work(w)`` when the caller has
    it)."""
    cols = np.moveaxis(w.astype(np.int16), 1, -1).reshape(-1, w.shape[1])
    n = cols.shape[1]
    cost = np.zeros((n, n), np.int32)
    at_once = (pair_work(w) if work is None else work) <= AT_ONCE_WORK
    for part in (np.maximum(cols, 0), np.maximum(-cols, 0)):
        big = part > SAFE_WEIGHT
        if at_once:  # every channel in one comparison (faster for few weights past ±64)
            rows, a = np.nonzero(big)
            if not len(rows):
                continue
            order = np.argsort(a, kind="stable")
            rows, a = rows[order], a[order]
            firsts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
            partners = part[rows]
            c = np.zeros((n, n), np.int32)
            c[a[firsts]] = np.add.reduceat(
                partners > PAIR_LIMIT - part[rows, a][:, None], firsts, axis=0, dtype=np.int32)
            cost += c + c.T
            cost[a[firsts]] -= np.add.reduceat(partners > SAFE_WEIGHT, firsts, axis=0,
                                               dtype=np.int32)
            continue
        for a in np.flatnonzero(big.any(0)):  # a channel at a time, bounded memory
            rows = part[big[:, a]]
            over = np.count_nonzero(rows > PAIR_LIMIT - rows[:, a:a + 1], axis=0)
            cost[a] += over
            cost[:, a] += over
            cost[a] -= np.count_nonzero(rows > SAFE_WEIGHT, axis=0)
    np.fill_diagonal(cost, 0)
    return cost


def pair_work(w: np.ndarray) -> int:
    """The comparisons ``_pair_costs`` makes for weights ``w``: weights past SAFE_WEIGHT
    times input channels."""
    return int(np.count_nonzero(np.abs(w.astype(np.int16)) > SAFE_WEIGHT)) * int(w.shape[1])


def _matching(cost: np.ndarray) -> list[tuple[int, int]]:
    """Pairs of the channels: greedily over the pairs of cost 0, the channel with the fewest
    such partners first, to its free partner with the fewest; the rest by least cost."""
    n = len(cost)
    fits = cost == 0
    np.fill_diagonal(fits, False)
    degree = fits.sum(1)
    free = np.ones(n, bool)
    pairs: list[tuple[int, int]] = []
    for a in np.argsort(degree, kind="stable"):
        if not free[a]:
            continue
        partners = np.flatnonzero(fits[a] & free)
        if len(partners):
            b = int(partners[np.argmin(degree[partners])])
            free[a] = free[b] = False
            pairs.append((int(a), b))
    left = list(np.flatnonzero(free))
    while len(left) > 1:
        a, rest = left[0], np.array(left[1:])
        b = int(rest[np.argmin(cost[a, rest])])
        pairs.append((int(a), b))
        left = [c for c in left[1:] if c != b]
    return pairs


@dataclass
class _Reader:
    """An int8 convolution reading an atom: the MACs of its excess kernel per pair of the
    atom's channels it reads, and those pairs' costs (``_pair_costs``)."""

    macs: int
    cost: np.ndarray


def _excess_macs(readers: list[_Reader], order: np.ndarray) -> int:
    """The excess kernels' MACs with the atom's channels in ``order``: each reader's kernel
    reads the pairs up to its last unsafe one."""
    total = 0
    for reader in readers:
        bad = np.flatnonzero(reader.cost[order[0::2], order[1::2]])
        total += reader.macs * (int(bad[-1]) + 1 if len(bad) else 0)
    return total


def _atom_order(readers: list[_Reader]) -> np.ndarray | None:
    """A better order of an atom's channels than the one they have, or None: a matching on
    the excess MACs each pair would cost its readers, the unsafe pairs first (those of the
    reader with the most MACs before the others')."""
    weight = sum(r.macs * (r.cost > 0) for r in readers)
    assert isinstance(weight, np.ndarray)
    if not weight.any():
        return None
    heavy = sorted(readers, key=lambda r: -r.macs)
    pairs = sorted(_matching(weight), key=lambda p: (
        weight[p] == 0, *(r.cost[p] == 0 for r in heavy), min(p)))
    order = np.array([c for p in pairs for c in p], np.int64)
    if _excess_macs(readers, order) >= _excess_macs(readers, np.arange(len(weight))):
        return None
    return order


def pairing_weights(graph: Graph, node: Node) -> np.ndarray | None:
    """``w − zw`` (int16) of a one-group int8 convolution with constant weights, whose input
    channels oneDNN's AVX2 kernels pair; None for any other node."""
    w = graph.constant(node.inputs[1]) if node.op is Op.CONV else None
    if (w is None or node.fused is None or not isinstance(node.attrs, ConvAttrs)
            or node.attrs.group != 1 or w.dtype.kind not in "iu" or w.ndim < 3):
        return None
    return w.astype(np.int16) - node.fused.wei_zero_point


def _readers(graph: Graph, atoms: _Atoms) -> dict[tuple[str, int], list[_Reader]]:
    """Per atom the int8 convolutions that read it (group 1, constant weights past ±64, on an
    even offset and count); an atom one of them reads at an odd offset or count keeps its
    order."""
    readers: dict[tuple[str, int], list[_Reader]] = {}
    fixed: set[tuple[str, int]] = set()
    spent = 0
    for node in graph:
        w = pairing_weights(graph, node)
        if (w is None or node.inputs[0] not in atoms.segments
                or np.abs(w).max(initial=0) <= SAFE_WEIGHT):
            continue
        macs = int(np.prod(graph.info(node.outputs[0]).shape)) * int(np.prod(w.shape[2:]))
        for i, (offset, size) in enumerate(atoms.segments[node.inputs[0]]):
            atom = atoms.atom(node.inputs[0], i)
            if atom in atoms.pinned:
                continue
            piece = w[:, offset:offset + size]
            work = pair_work(piece)
            costly = (work > MAX_PAIR_WORK or spent + work > MAX_GRAPH_PAIR_WORK
                      or size > MAX_PAIR_CHANNELS)
            if costly:
                log.info("%s: %d channels, %d comparisons to cost their pairs: its input "
                         "keeps its channel order", node.name, size, work)
            if offset % 2 or size % 2 or costly:
                fixed.add(atom)
                continue
            spent += work
            readers.setdefault(atom, []).append(_Reader(macs, _pair_costs(piece, work)))
    return {a: r for a, r in readers.items() if a not in fixed}


def reorder(graph: Graph, cons: _Constraints) -> dict[str, np.ndarray]:
    """The new channel order of each value whose order changes (``new[i] = old[order[i]]``)."""
    atoms = _atoms(graph, cons)
    orders = {a: o for a, r in _readers(graph, atoms).items()
              if (o := _atom_order(r)) is not None}
    result: dict[str, np.ndarray] = {}
    for value, segments in atoms.segments.items():
        held = [atoms.atom(value, i) for i in range(len(segments))]
        if any(atom in orders for atom in held):
            result[value] = np.concatenate([
                offset + orders[atom] if atom in orders else np.arange(offset, offset + size)
                for atom, (offset, size) in zip(held, segments)])
    return result


# ------------------------------------------------------------------------------- rewrite
def _take(values: tuple[float, ...], order: np.ndarray) -> tuple[float, ...]:
    return tuple(values[i] for i in order) if len(values) == len(order) > 1 else values


def _quant_taken(quant: QuantParams, order: np.ndarray) -> QuantParams:
    if quant.per_tensor:
        return quant
    return QuantParams(_take(quant.scale, order), tuple(quant.zero_point[i] for i in order),
                       quant.axis)


def _chain_item(op: ChainOp, order: np.ndarray) -> ChainOp:
    """A chain item's per-channel values in the new channel order."""
    if isinstance(op, (Scale, Shift)):
        return dataclasses.replace(op, values=_take(op.values, order))
    if isinstance(op, PRelu):
        return PRelu(_take(op.slopes, order))
    if isinstance(op, Quantize):
        onnx = op.onnx
        if onnx is not None:
            onnx = OnnxQuantize(onnx.dtype, _quant_taken(onnx.quant, order), onnx.dequantize)
        return dataclasses.replace(
            op, input_low=_take(op.input_low, order), input_high=_take(op.input_high, order),
            output_low=_take(op.output_low, order), output_high=_take(op.output_high, order),
            onnx=onnx)
    return op


def _set_constant(graph: Graph, node: Node, port: int, data: np.ndarray) -> None:
    name = graph.unique_name(f"{node.inputs[port]}@order")
    graph.add_constant(name, data)
    graph.set_input(node, port, name)


def _apply(graph: Graph, cons: _Constraints, order: dict[str, np.ndarray]) -> None:
    """Rewrite the graph for the new channel orders (module docstring): it then computes
    every value in its new order."""
    taken: dict[tuple[str, int], np.ndarray] = {}
    for node, port, axis, value in cons.constants:
        new = order.get(value)
        if new is not None:
            data = taken.get((node.name, port), graph.constant(node.inputs[port]))
            assert data is not None
            taken[(node.name, port)] = np.take(data, new, axis=axis)
    for (name, port), data in taken.items():
        _set_constant(graph, graph.node(name), port, data)
    for node in graph:
        new = order.get(node.outputs[0]) if node.outputs else None
        if new is not None and node.fused is not None:
            node.fused.chain = [_chain_item(op, new) for op in node.fused.chain]
    for value, new in order.items():
        given = graph.channel_orders.get(value)
        graph.channel_orders[value] = new if given is None else given[new]
        info = graph.info(value)
        if info.quant is not None and info.quant.axis is not None and (
                info.quant.axis % len(info.shape) == 1):
            graph.set_info(value, dataclasses.replace(info, quant=_quant_taken(info.quant,
                                                                               new)))
