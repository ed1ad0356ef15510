"""A per-tensor quantize after a Reshape-like op or a Transpose moves before it: ``x → Reshape →
Q`` becomes ``x → Q → Reshape`` (the Reshape then moves 8-bit values; its output keeps its name).

Where it matters: torch.export writes ResNet's ``avgpool`` then ``flatten`` as ReduceMean (a
GlobalAveragePool at import) and a Reshape, and quantize_static quantizes after the Reshape, so
the pool's output was not read by a quantize: it ran in float32 between a dequantize reorder
and a quantize kernel, where the TorchScript export's GlobalAveragePool → Q is one int8 pooling
kernel (ResNet-18 QDQ exported with dynamo=True: 30 → 28 kernels, as exported by TorchScript).

A Transpose likewise (XCiT's keys in quantize_static's form: ``k / ‖k‖`` → Transpose → Q): the
Div's chain then ends in the quantize, one kernel, and the Transpose moves 8-bit values
(XCiT-N12 QDQ 488 → 464 kernels).

Exact: a per-tensor quantize is elementwise, ``Q(reshape(x)) = reshape(Q(x))`` value for value.
Only a quantize-only FakeQuantize with one range (scalar ranges: per channel, its axis would
move) that is the Reshape's only reader, and only on a float32 Reshape (an integer one is
already moved by propagate_dequantize).

A nearest Resize that enlarges its input is moved past the same way: each output element is a
copy of one input element, so ``Q(resize(x)) = resize(Q(x))`` too, and the quantize then runs
on the smaller tensor. Where it matters: an FPN that requantizes each upsampled map into its
Concat's scale (PP-OCRv4 det NNCF: a ×8 and a ×4 nearest Resize of the quantized lateral maps,
each quantized again after the Resize). The quantize then meets the dequantize before the
Resize, a requantize its producer's kernel absorbs (passes/fuse_post_ops.py), and the Resize
moves bytes only: its copy goes straight into the Concat's output
(compiler/lower/in_place_concat.py).

A requantize after such a Resize — its dequantize and a quantize into other parameters, the
Resize's and the dequantize's only readers — moves before it too (``run_requantize``, run
after propagate_dequantize has made a Concat's requantizes of its inputs; option
``requantize_before_resize``). Where the Resize's source has other readers, the quantize above
meets a dequantize of its own source and stays, so the Resize read 8-bit values and requantized
its larger output as post-ops (YOLOv8's FPN in quantize_static's form: each upsampled map into
its Concat's scale). Requantized first, the small map is requantized by its producer's kernel
or by one kernel of its own, and the Resize moves bytes: oneDNN 3.2's jit resampling with that
chain took 0.22 ms for 128 channels 20x20 → 40x40 (2 threads, AVX2), without it 0.03 ms, the
requantize on the small map 0.01 ms. Exact for the same reason: each op is elementwise, per
tensor or per channel (the channels keep their places).
"""

from __future__ import annotations

import logging

from qfuse.ir import DType, Graph, Node, Op
from qfuse.ir.ops import ResizeMode
from qfuse.passes.base import PassContext
from qfuse.passes.quant_utils import (
    dq_params,
    fq_ranges,
    move_before,
    quantize_only,
    range_axis,
)

log = logging.getLogger(__name__)

RESHAPES = (Op.RESHAPE, Op.FLATTEN, Op.SQUEEZE, Op.UNSQUEEZE)
# ops before which a per-tensor quantize moves: they move elements without changing any
MOVES = (*RESHAPES, Op.TRANSPOSE)


def run(graph: Graph, ctx: PassContext) -> int:
    """Each quantize moves before such an op, and before every such op in a row above it
    when the node those ops read can write the quantize itself (a window partition's Reshape
    → Transpose → Reshape between a LayerNorm and the quantize: Swin in onnxruntime's
    QOperator form, which quantizes after the float data movement). Under a dequantize or
    another data movement (a Slice of a QOperator attention's packed q, k, v) it moves one
    op only: further up it would stand between a Slice and the Transpose that reads the
    Slice's source in place (PP-OCRv4 rec QOperator: a copy more)."""
    changed = 0
    for fq in [n for n in graph.topo_order() if n.op is Op.FAKE_QUANTIZE]:
        first = graph.producer(fq.inputs[0])
        if first is None or fq.fused is not None or not _moves(graph, first):
            continue
        ctx.visit(fq)
        ops = _movable_run(graph, fq, first)
        if isinstance(ops, str):
            ctx.decline(fq, ops)
            continue
        top = graph.producer(ops[-1].inputs[0])
        if top is None or top.op in _NOT_WRITERS:
            ops = ops[:1]
        for op in ops:
            out = fq.outputs[0]  # the op writes it now, after the moved quantize
            move_before(graph, op, [fq])
            log.debug("%s moved before %s", fq, op)
            fq = graph.producer(graph.producer(out).inputs[0])
            changed += 1
    return changed


# Producers that would not write a quantize moved onto their output themselves: a dequantize
# (the quantize then requantizes its integers), data movement.
_NOT_WRITERS = frozenset({Op.DEQUANTIZE_LINEAR, Op.SLICE, Op.SPLIT, Op.CONCAT, Op.GATHER,
                          Op.PAD, Op.EXPAND, *MOVES})


def _moves(graph: Graph, node: Node) -> bool:
    """``node`` moves elements without changing any (a quantize commutes with it)."""
    return node.op in MOVES or _enlarging_nearest(graph, node)


def _movable_run(graph: Graph, fq: Node, first: Node) -> list[Node] | str:
    """The ops, nearest first (``first``: ``fq``'s producer), ``fq`` can move before one
    after another; or why it cannot move before ``first``."""
    if quantize_only(graph, fq) is None:
        return "not a quantize-only FakeQuantize"
    ranges = fq_ranges(graph, fq)
    if ranges is None or any(r.size != 1 for r in ranges):
        return f"quantizes per channel after a {first.op.value} (its axis would move)"
    ops: list[Node] = []
    op: Node | None = first
    while op is not None and _moves(graph, op):
        reason = _why_not(graph, op, ops[-1] if ops else fq)
        if reason:
            return ops or reason
        ops.append(op)
        op = graph.producer(op.inputs[0])
    return ops


def run_requantize(graph: Graph, ctx: PassContext) -> int:
    """Each requantize after an enlarging nearest Resize moves before it (module docstring)."""
    if not ctx.composer.on("requantize_before_resize"):
        return 0
    changed = 0
    for name in [n.name for n in graph.topo_order() if n.op is Op.DEQUANTIZE_LINEAR]:
        dq = graph.node(name)
        resize = graph.producer(dq.inputs[0])
        if resize is None or not _enlarging_nearest(graph, resize):
            continue
        fq = _requantize_after(graph, resize, dq)
        if fq is not None:
            move_before(graph, resize, [dq, fq])
            log.debug("%s and %s moved before %s", dq, fq, resize)
            changed += 1
    return changed


def _enlarging_nearest(graph: Graph, node: Node) -> bool:
    """A nearest Resize whose output has no fewer elements than its input."""
    if node.op is not Op.RESIZE or node.attrs.mode is not ResizeMode.NEAREST:
        return False
    return graph.info(node.outputs[0]).size >= graph.info(node.inputs[0]).size


def _why_not(graph: Graph, op: Node, reader: Node) -> str:
    """Why a quantize cannot move before ``op``, whose output ``reader`` reads ("" if it
    can)."""
    if graph.info(op.inputs[0]).dtype is not DType.F32:
        return f"the {op.op.value} reads {graph.info(op.inputs[0]).dtype.name}"
    if [r for r, _ in graph.consumers(op.outputs[0])] != [reader] or op.outputs[0] in graph.outputs:
        return f"the {op.op.value}'s output has other readers"
    return ""


def _requantize_after(graph: Graph, resize: Node, dq: Node) -> Node | None:
    """The quantize-only FakeQuantize of a requantize ``dq`` → it after ``resize`` that can
    move before it (per tensor or per channel, each the only reader of what it reads), else
    None."""
    fq = next((n for n, _ in graph.consumers(dq.outputs[0])), None)
    if fq is None or quantize_only(graph, fq) is None:
        return None
    rank = graph.info(dq.outputs[0]).rank
    params = dq_params(graph, dq)
    ranges = fq_ranges(graph, fq)
    if params is None or params.axis not in (None, 1) or ranges is None or any(
            range_axis(r.shape, rank) not in (None, 1) for r in ranges):
        return None
    per_channel = params.axis == 1 or any(range_axis(r.shape, rank) == 1 for r in ranges)
    if per_channel and (graph.info(resize.outputs[0]).shape[:2]
                        != graph.info(resize.inputs[0]).shape[:2]):
        return None  # the Resize moves channels: per-channel values would not follow them
    sole = all(len(graph.consumers(v)) == 1 and v not in graph.outputs
               for v in (resize.outputs[0], dq.outputs[0]))
    return fq if sole else None
