"""Elementwise ops after a Concat, up to a quantize, run on each of its inputs before it.

``Concat(x_1, …, x_k)`` along ``axis`` followed by elementwise ops ``f`` — each a map of one
element (Relu, Sigmoid, Clip, …), an Add / Sub / Mul / Div of the region's values and of
constants that broadcast, a BatchNormalization, a QuantizeLinear / DequantizeLinear —
equals ``Concat(f_1(x_1), …, f_k(x_k))``, where ``f_i`` is ``f`` with every constant cut to
input i's range along ``axis`` (a constant of size 1 there stays whole): each output element
is computed from the same elements by the same operations (ONNX's broadcasting:
https://onnx.ai/onnx/repo-docs/Broadcasting.html). Exact.

Why: MixNet's (and MixConv's) mixed convolutions split a tensor's channels into groups, run a
convolution per group, concatenate the groups and apply the batch norm and the activation to
the concatenation; NNCF quantizes each group's convolution output and the activation's
output. The batch norm, the activation and the quantize then ran as one more kernel over the
whole concatenation (a dequantize per channel, 0.108 ms for 96 x 112 x 112 on a 2-core EPYC);
moved before the Concat, each group's copy joins its convolution's post-op chain
(passes/fuse_post_ops.py) and the Concat moves 8-bit values of one quantizer.

Applied when the region is closed — its values are read only inside it, except the output of
the DequantizeLinear that alone reads its one QuantizeLinear with the same parameters, which
ends it (nothing it computes is a graph output): each input gets the pair, and the new Concat
joins dequantized values of one quantizer (an 8-bit concat once the dequantize moves past
it, passes/propagate_dequantize.py) — and every
input of the Concat is read only by it and is a Conv / ConvTranspose / MatMul output, directly
or through a QuantizeLinear → DequantizeLinear pair, so that each copy has a kernel to join.
A BatchNormalization (per channel) joins when the Concat is along channels. A pair whose
dequantized value only such ops read does not end the region (quantize_static quantizes the
concatenation itself before its batch norm); the region then ends at the next pair, or at
this one when going on fails. Not on a CPU whose oneDNN int8 depthwise kernel applies
per-channel binary post-ops wrong on a channel tail (AVX2, SSE4.1: ``PassContext.
depthwise_binary_block``) when an input is such a depthwise convolution and the region
brings per-channel operands: there the copy would run on ``ref:any`` (MixNet-S's 90-channel
groups under AVX2), and the region stays one kernel after the Concat. Composer option
``distribute_concat`` (on by default).
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.passes.base import PassContext
from qfuse.passes.canonicalize_arith import constant_value
from qfuse.passes.quant_utils import infer_into
from qfuse.passes.replace import replace_nodes

log = logging.getLogger(__name__)

ELEMENTWISE = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.RELU, Op.CLIP, Op.LEAKY_RELU, Op.SIGMOID, Op.TANH,
    Op.HARD_SIGMOID, Op.HARD_SWISH, Op.SWISH, Op.GELU, Op.QUANTIZE_LINEAR,
    Op.DEQUANTIZE_LINEAR, Op.BATCH_NORM})
COMPUTE = frozenset({Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL})


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("distribute_concat"):
        return 0
    changed = 0
    for concat in [n for n in graph.topo_order() if n.op is Op.CONCAT]:
        if not graph.has_node(concat.name):
            continue
        region = _region(graph, concat, through=True) or _region(graph, concat, through=False)
        if region is None:
            continue
        ctx.visit(concat)
        if not all(_joins_a_kernel(graph, x) for x in concat.inputs):
            ctx.decline(concat, "distribute_concat: an input is not a convolution's or "
                        "matmul's output read only by the concat")
            continue
        tail = _depthwise_tail(graph, concat, region, ctx.depthwise_binary_block)
        if tail:
            ctx.decline(concat, f"distribute_concat: a depthwise convolution of {tail} "
                        "channels would take per-channel binary post-ops, which oneDNN's "
                        f"int8 depthwise kernel on this CPU applies wrong unless the channels "
                        f"are a multiple of {ctx.depthwise_binary_block} (ref:any instead)")
            continue
        _rewrite(graph, concat, region)
        changed += 1
    return changed


def _depthwise_tail(graph: Graph, concat: Node, region: list[Node], block: int) -> int:
    """The channels of a depthwise convolution among the concat's inputs that is not a
    multiple of ``block`` when the region brings per-channel operands (a batch norm, a
    per-channel Mul or Add, a per-channel quantizer), else 0."""
    if not block or not any(node.op is Op.BATCH_NORM or any(
            (data := constant_value(graph, v)) is not None and data.size > 1
            for v in node.inputs[1:] if v) for node in region):
        return 0
    for value in concat.inputs:
        node = _kernel_of(graph, value)
        channels = graph.info(value).shape[1] if node is not None else 0
        if (node is not None and node.op is Op.CONV and node.attrs.group == channels
                and graph.info(node.inputs[0]).shape[1] == channels and channels % block):
            return channels
    return 0


def _region(graph: Graph, concat: Node, *, through: bool) -> list[Node] | None:
    """The elementwise nodes after ``concat`` up to one Quantize → Dequantize pair, in
    topological order (that dequantize last), when they form a closed region (module
    docstring); else None. ``through``: a pair whose dequantized value only elementwise ops
    read is not the end — the region goes on through it (quantize_static quantizes the
    concatenation itself, then its batch norm and activation)."""
    out = concat.outputs[0]
    if out in graph.outputs:
        return None
    shape = tuple(graph.info(out).shape)
    axis = concat.attrs.axis % len(shape)
    inside: dict[str, Node] = {}
    produced, pending, ends = {out}, [out], []
    while pending:
        value = pending.pop()
        if value in graph.outputs:
            return None
        for reader, _ in graph.consumers(value):
            if reader.name in inside:
                continue
            if not _joins(graph, reader, shape, axis, produced):
                return None
            inside[reader.name] = reader
            if reader.op is Op.QUANTIZE_LINEAR:
                dequantize = _pair(graph, reader)
                if dequantize is None:
                    return None
                inside[dequantize.name] = dequantize
                produced.update(reader.outputs)
                after = graph.consumers(dequantize.outputs[0])
                if through and after and dequantize.outputs[0] not in graph.outputs and all(
                        _joins(graph, r, shape, axis, produced | set(dequantize.outputs))
                        for r, _ in after):
                    produced.update(dequantize.outputs)
                    pending.extend(dequantize.outputs)
                    continue
                ends.append(dequantize)  # the region's end: its readers are outside
                continue
            produced.update(reader.outputs)
            pending.extend(reader.outputs)
    if len(ends) != 1:
        return None
    # every input of the region's nodes is a constant or computed inside (checked by
    # _joins against the values known when the reader was met; re-check now all are known)
    if not all(v in produced or constant_value(graph, v) is not None
               for n in inside.values() for v in n.inputs if v):
        return None
    order = [n for n in graph.topo_order() if n.name in inside]
    return order if order[-1] is ends[0] else None


def _pair(graph: Graph, quantize: Node) -> Node | None:
    """The DequantizeLinear that alone reads ``quantize``'s output with the same parameters
    (the pair the quantized model has there; each input then gets its own pair and the
    Concat joins dequantized values of one quantizer, as before)."""
    readers = graph.consumers(quantize.outputs[0])
    if len(readers) != 1 or quantize.outputs[0] in graph.outputs:
        return None
    dequantize = readers[0][0]
    if (dequantize.op is not Op.DEQUANTIZE_LINEAR or dequantize.inputs[1:] != quantize.inputs[1:]
            or dequantize.attrs.axis != quantize.attrs.axis):
        return None
    return dequantize


def _joins(graph: Graph, node: Node, shape: tuple[int, ...], axis: int,
           produced: set[str]) -> bool:
    """May ``node`` belong to the region: an elementwise op of the concat's output shape whose
    constants can be cut along ``axis``."""
    if node.op not in ELEMENTWISE or node.fused is not None or len(node.outputs) != 1:
        return False
    if tuple(graph.info(node.outputs[0]).shape) != shape:
        return False
    if node.op is Op.QUANTIZE_LINEAR and not graph.info(node.outputs[0]).dtype.is_quantized:
        return False
    for value in node.inputs:
        if not value or value in produced:
            continue
        data = constant_value(graph, value)  # quantize_static quantizes a lone BN's γ and β
        if data is None:
            producer = graph.producer(value)
            if producer is None or producer.op not in ELEMENTWISE:
                return False  # a run-time tensor from outside the region
            continue  # computed inside, met later (a gate: x·sigmoid(x))
        if _cut_axis(node, data, shape, axis) is None:
            return False
    return True


def _cut_axis(node: Node, data: np.ndarray, shape: tuple[int, ...], axis: int) -> int | None:
    """The axis of constant ``data`` (an input of ``node``) to cut along the concat's
    ``axis``: -1 when it is the same for every input (size 1 or no such axis), None when it
    cannot be cut (another size along it)."""
    if node.op in (Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR, Op.BATCH_NORM):
        if data.size == 1 and node.op is not Op.BATCH_NORM:
            return -1
        channel = 1 if node.op is Op.BATCH_NORM else node.attrs.axis % len(shape)
        return 0 if data.ndim == 1 and channel == axis and data.shape[0] == shape[axis] else None
    if data.ndim > len(shape):
        return None
    own = axis - (len(shape) - data.ndim)
    if own < 0 or data.shape[own] == 1:
        return -1
    return own if data.shape[own] == shape[axis] else None


def _joins_a_kernel(graph: Graph, value: str) -> bool:
    """``value`` is read only by the concat and written by a Conv / ConvTranspose / MatMul,
    directly or through a QuantizeLinear → DequantizeLinear pair read only by each other."""
    if graph.uses(value) != 1 or value in graph.outputs:
        return False
    return _kernel_of(graph, value) is not None


def _kernel_of(graph: Graph, value: str) -> Node | None:
    """The Conv / ConvTranspose / MatMul writing ``value``, directly or through a
    QuantizeLinear → DequantizeLinear pair read only by each other, or None."""
    producer = graph.producer(value)
    if producer is not None and producer.op is Op.DEQUANTIZE_LINEAR:
        quantize = graph.producer(producer.inputs[0])
        if quantize is None or quantize.op is not Op.QUANTIZE_LINEAR or graph.uses(
                producer.inputs[0]) != 1 or graph.uses(quantize.inputs[0]) != 1:
            return None
        producer = graph.producer(quantize.inputs[0])
    return producer if producer is not None and producer.op in COMPUTE else None


def _rewrite(graph: Graph, concat: Node, region: list[Node]) -> None:
    shape = tuple(graph.info(concat.outputs[0]).shape)
    axis = concat.attrs.axis % len(shape)
    end = region[-1]
    y = end.outputs[0]
    y_info = graph.info(y)
    starts = np.cumsum([0] + [graph.info(x).shape[axis] for x in concat.inputs])
    inputs = list(concat.inputs)
    origin = list(concat.origin)

    def build() -> None:
        parts = []
        for i, x in enumerate(inputs):
            lo, hi = int(starts[i]), int(starts[i + 1])
            names = {concat.outputs[0]: x}
            for node in region:
                args = [_cut(graph, node, v, shape, axis, lo, hi) if v and v not in names
                        else names.get(v, v) for v in node.inputs]
                copy = graph.add_node(node.op, args, 1, node.attrs,
                                      name=graph.unique_name(f"{node.name}/part{i}"),
                                      origin=node.origin)
                infer_into(graph, copy)
                names[node.outputs[0]] = copy.outputs[0]
            parts.append(names[y])
        graph.add_node(Op.CONCAT, parts, [y], concat.attrs, name=concat.name, infos=[y_info],
                       origin=origin)

    replace_nodes(graph, [concat, *region], build)
    graph.remove_unused()
    log.debug("%s: %d elementwise nodes moved before it", concat, len(region))


def _cut(graph: Graph, node: Node, value: str, shape: tuple[int, ...], axis: int, lo: int,
         hi: int) -> str:
    """Constant ``value`` for the input covering ``[lo, hi)`` along the concat's axis (a
    DequantizeLinear of constants cut as its float32 values: what the batch norm's folding
    reads of it anyway, passes/decompose_batchnorm.py)."""
    data = constant_value(graph, value)
    assert data is not None
    own = _cut_axis(node, data, shape, axis)
    assert own is not None  # _joins took the node only where every constant can be cut
    if own < 0:
        return value
    part = np.ascontiguousarray(np.take(data, np.arange(lo, hi), axis=own))
    name = graph.unique_name(f"{value}@{lo}-{hi}")
    graph.add_constant(name, part)
    return name
