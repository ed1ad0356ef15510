"""DequantizeLinear → quantize-only FakeQuantize with the same parameters is the identity on
the integers: the FakeQuantize's readers read the DQ's integer input (docs/design.md, pass 4;
what remains of ONNX Runtime's "Reshape/Flatten/MaxPool reuse their input's scale" once the
dequantize has been moved through those ops).

Pattern: ``F(DQ(q))`` with F a quantize-only FakeQuantize.
Check: F's output type and QuantParams equal the DQ's (type, scales, zero points, axis), and
the round trip is the identity for every integer the type holds. Why it is exact in float32
for the F a Q/DQ pair gave (il = f32(s·(qmin - zp)), ih = f32(s·(qmax - zp)), L = 256):
x = f32((q - zp)·s) lies within one rounding of the real s·(q - zp); x - il and ih - il
are within a few ulps of s·(q - qmin) and 255·s, so (x - il)/(ih - il)·255 is within
~1e-4 of the integer q - qmin and rounds to it; the ends are exact because x = il at q = qmin
(the same float32 product, taken by the "x <= il → ol" branch) and x = ih at q = qmax. So
round(...) + qmin = q. Rather than rely on that argument for every F (a decomposed general
FakeQuantize has other ranges), the check evaluates F(DQ(q)) for all q of the type, per
channel, with the reference formulas, and requires F(DQ(q)) = q: a proof by exhaustion.

The same holds for a QuantizeLinear left as it is (its output read by something other than
a DequantizeLinear, so qdq_to_fake_quantize kept it: a table of GELU reads it, made by
passes/table_lookup.py before the pairs are converted): ``Q(DQ(q))`` with the same type,
scales, zero points and axis is ``saturate(rint(((q - zp)·s) / s) + zp)`` = q, again checked
for every integer of the type with the reference's own formulas (``quantize_onnx``).
quantize_static quantizes a Gemm's output and again, with the same parameters, the Reshape
after it: in every GELU MLP of DeiT, CaiT or BERT that second quantize was a kernel.

Rewrite: F's readers read q; F goes; the DQ goes too when nothing else reads it.
Otherwise (other scale, zero point or type) the pair is a requantization, lowered later as one
kernel per quantize (compiler/lower/lower_quant.py: a reorder with both scales, or in ONNX's
rounding a binary primitive reading the integers): it is left alone, counted as nothing, and
recorded as declined so that `inspect` shows it.
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.ir.types import DType, OnnxQuantize, QuantParams
from qfuse.passes.base import PassContext
from qfuse.passes.decompose_fake_quantize import channel_vector
from qfuse.passes.quant_utils import dq_params, fq_ranges, is_op, quantize_only, remove_if_unused
from qfuse.runtime.reference.ops_quant import fake_quantize_f32, onnx_pair, quantize_onnx

log = logging.getLogger(__name__)

F32 = np.float32


def round_trip_exact(dtype: DType, quant: QuantParams, ranges: tuple[np.ndarray, ...],
                     levels: int, shape: tuple[int, ...]) -> bool:
    """F(DQ(q)) == q for every q of ``dtype`` and every channel (reference float32)."""
    lo, hi = dtype.range
    q = np.arange(lo, hi + 1, dtype=np.int64)
    axis = quant.axis
    channels = shape[axis] if axis is not None else 1
    per = [channel_vector(r, len(shape), axis, channels) for r in ranges]
    scale, zp = quant.scale_array(), quant.zero_point_array()
    for c in range(channels):
        x = (q - int(zp[c % zp.size])).astype(F32) * scale[c % scale.size]
        y = fake_quantize_f32(x, *(v[c % v.size] for v in per), levels)
        if not np.array_equal(y, q.astype(F32)):
            return False
    return True


def check(graph: Graph, dq: Node, fq: Node) -> str | None:
    """None when F(DQ(q)) = q; otherwise why the pair stays."""
    p = dq_params(graph, dq)
    target = quantize_only(graph, fq)
    if p is None or target is None:
        return "dequantize or FakeQuantize parameters are not constants"
    dtype, quant = target
    if dtype is not p.dtype or quant != p.quant():
        return (f"requantize {p.describe()} → {dtype.name.lower()} "
                f"{_show(quant)}: kept as one requantize kernel{_why_kernel(graph, dq, fq)}")
    ranges = fq_ranges(graph, fq)
    shape = graph.info(fq.inputs[0]).shape
    if ranges is None or not round_trip_exact(dtype, quant, ranges, fq.attrs.levels, shape):
        return "same parameters, but the FakeQuantize ranges do not map DQ(q) back to q"
    return None


def _why_kernel(graph: Graph, dq: Node, fq: Node) -> str:
    """Why the requantize cannot go into the kernel producing its source (post-op fusion
    folds it there, both roundings kept, when the source has no other reader)."""
    q = dq.inputs[0]
    others = sorted({c.name for c, _ in graph.consumers(q) if c is not dq}
                    | {c.name for c, _ in graph.consumers(dq.outputs[0]) if c is not fq})
    if not others and q not in graph.outputs:
        producer = graph.producer(q)
        what = f"'{producer.name}' ({producer.op.value})" if producer is not None else "input"
        return (f" (its source is written by {what}, a kernel without the post-ops an "
                "ONNX-exact requantize needs: x·s1 / s2, round, + zp)")
    shown = ", ".join(f"'{n}'" for n in others[:3]) + (" ..." if len(others) > 3 else "")
    return (f" (its source '{q}' is also read at its own scale{' by ' + shown if shown else ''}: "
            "a kernel writes one output, and writing only the requantized one would round "
            "once where the model rounds twice, not bit-exact)")


def _show(quant: QuantParams) -> str:
    if quant.axis is None:
        return f"s={quant.scale[0]:.6g} zp={quant.zero_point[0]}"
    return f"per-channel axis {quant.axis}"


def check_quantize(graph: Graph, dq: Node, q: Node) -> str | None:
    """None when the QuantizeLinear ``q`` maps DQ(x) back to x for every integer x."""
    source, target = dq_params(graph, dq), dq_params(graph, q)
    if source is None or target is None:
        return "dequantize or quantize parameters are not constants"
    if not source.same_as(target):
        return (f"requantize {source.describe()} → {target.describe()}: kept as one "
                f"requantize kernel{_why_kernel(graph, dq, q)}")
    if not _quantize_round_trip(source.dtype, tuple(source.scale.tolist()),
                                tuple(source.zero_point.tolist())):
        return "same parameters, but QuantizeLinear does not map DQ(q) back to q"
    return None


@functools.lru_cache(maxsize=256)
def _quantize_round_trip(dtype: DType, scale: tuple[float, ...], zp: tuple[int, ...]) -> bool:
    """QuantizeLinear(DequantizeLinear(q)) == q for every q of ``dtype`` in every channel
    (the reference's float32 formulas)."""
    lo, hi = dtype.range
    q = np.arange(lo, hi + 1, dtype=np.int64)[:, None]
    s, z = np.asarray(scale, F32)[None, :], np.asarray(zp, np.int64)[None, :]
    x = (q - z).astype(F32) * s
    back = quantize_onnx(x, s.ravel(), z.ravel(), dtype, 1)
    return bool(np.array_equal(back, np.broadcast_to(q, back.shape).astype(F32)))


def _requantized(graph: Graph, node: Node) -> tuple[Node, str | None] | None:
    """(DQ, why the pair stays or None) for a quantize-only FakeQuantize or a QuantizeLinear
    reading a DequantizeLinear; None for any other node."""
    fake = quantize_only(graph, node) is not None
    if not fake and node.op is not Op.QUANTIZE_LINEAR:
        return None
    dq = graph.producer(node.inputs[0])
    if not is_op(dq, Op.DEQUANTIZE_LINEAR):
        return None
    assert dq is not None
    return dq, check(graph, dq, node) if fake else check_quantize(graph, dq, node)


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for fq in graph.topo_order():
        if not graph.has_node(fq.name):
            continue
        found = _requantized(graph, fq)
        if found is None:
            continue
        ctx.visit(fq)
        dq, reason = found
        if reason is None and fq.outputs[0] in graph.outputs:
            reason = f"the {fq.op.value} output is a graph output"
        if reason is not None:
            ctx.decline(fq, reason)
            continue
        graph.replace_all_uses(fq.outputs[0], dq.inputs[0])
        graph.remove_node(fq)
        remove_if_unused(graph, dq)
        changed += 1
    changed += _drop_repeated_pairs(graph, ctx)
    if changed:
        graph.remove_unused()
    return changed


# ops that move values without changing any
_VIEWS = frozenset({Op.RESHAPE, Op.FLATTEN, Op.TRANSPOSE, Op.SQUEEZE, Op.UNSQUEEZE,
                    Op.IDENTITY})


def _drop_repeated_pairs(graph: Graph, ctx: PassContext) -> int:
    """A FakeQuantize standing for a whole Q → DQ pair (float output: 16-bit activations,
    convert_quant.SIXTEEN_BIT) reading, through ops that only move values, the output of one
    with the same type and parameters: quantize_static quantizes a Gemm's output and again the
    Reshape after it. The second is the identity on the first's values (checked for every
    integer of the type, as ``round_trip_exact``), so its readers read its input."""
    changed = 0
    for second in graph.topo_order():
        pair = _whole_pair(second)
        if pair is None or not graph.has_node(second.name):
            continue
        source = graph.producer(second.inputs[0])
        while source is not None and source.op in _VIEWS:
            source = graph.producer(source.inputs[0])
        if source is None or _whole_pair(source) != pair or not _idempotent(pair):
            continue
        ctx.visit(second)
        if second.outputs[0] in graph.outputs:
            continue
        graph.replace_all_uses(second.outputs[0], second.inputs[0])
        graph.remove_node(second)
        changed += 1
    return changed


def _whole_pair(node: Node) -> OnnxQuantize | None:
    """The per-tensor Q → DQ pair a FakeQuantize stands for whole (its float values)."""
    pair = node.attrs.onnx if node.op is Op.FAKE_QUANTIZE else None
    if pair is None or not pair.dequantize or pair.quant.axis is not None:
        return None
    return pair


@functools.lru_cache(maxsize=64)
def _idempotent(pair: OnnxQuantize) -> bool:
    """The pair maps every value x = (q − zp)·s it writes to itself (its reference,
    runtime/reference/ops_quant.onnx_pair, on all integers of the type)."""
    lo, hi = pair.dtype.range
    q = np.arange(lo, hi + 1, dtype=np.int64) - pair.quant.zero_point[0]
    x = q.astype(F32) * F32(pair.quant.scale[0])
    return bool(np.array_equal(onnx_pair(x, pair), x))

