"""QuantizeLinear → DequantizeLinear pairs become one FakeQuantize (docs/design.md, pass 2).

Pattern: ``QuantizeLinear(x, s, zp)`` whose output is read only by DequantizeLinear nodes
(ONNX Runtime writes one Q → DQ pair per tensor, the DQ shared by every consumer; a Q can
also feed several DQs with the same parameters).

Check: every reader is a DequantizeLinear with the same scale, zero point and axis (compared
by value, not by constant name), and the Q's output is not a graph output.

Rewrite: one FAKE_QUANTIZE (f32 output) replaces the Q and all its DQs, with L = 256 and

    il = ol = s·(qmin - zp),   ih = oh = s·(qmax - zp)          (float32 products)

per tensor, or per channel shaped [1, .., C, .., 1] to broadcast on the axis. In real
arithmetic ``FQ(x) = (clip(round(x/s) + zp, qmin, qmax) - zp)·s``: (x - il)/(ih - il)·255 =
x/s - (qmin - zp), so round(...) + qmin = round(x/s) + zp clipped, and k/255·(oh - ol) + ol =
s·(k + qmin - zp). In float32 the two formulas round differently (the level can differ where
x/s is within float32 rounding of a .5 tie, and on exact ties with an odd zero point), so the
FakeQuantize carries the pair itself (``FakeQuantizeAttrs.onnx``: type, scale, zero point) and
means exactly ``DequantizeLinear(QuantizeLinear(x))``; the ranges stay for the passes that
read them.

A QuantizeLinear only tables read (table_lookup took its DequantizeLinear into a table of the
integers) becomes the quantize-only FakeQuantize decompose_fake_quantize writes for a pair
(``_quantize_only``): the chains of fuse_post_ops end in it.

The FakeQuantize records the pair it came from in ``meta["qdq"]`` (dtype and QuantParams) and
the ONNX node names in ``meta["q_origin"]`` / ``meta["dq_origin"]`` and the Q's output name in
``meta["q_output"]``, so that the decomposition recovers exactly the original u8/s8 type, scale
and zero point, and names the nodes and the integer tensor as ONNX Runtime's model does. DequantizeLinear on constants
(weights, biases) has no QuantizeLinear before it and is not touched.
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.ir.types import DType, OnnxQuantize, TensorInfo
from qfuse.passes.base import PassContext
from qfuse.passes.quant_utils import DqParams, add_fake_quantize, along, dq_params, rebuild

log = logging.getLogger(__name__)

F32 = np.float32


def qdq_ranges(params: DqParams, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) = (s·(qmin - zp), s·(qmax - zp)) in float32, shaped for ``rank``."""
    qmin, qmax = params.dtype.range
    low = params.scale * (F32(qmin) - params.zero_point.astype(F32))
    high = params.scale * (F32(qmax) - params.zero_point.astype(F32))
    return along(low, rank, params.axis), along(high, rank, params.axis)


def _mismatch(graph: Graph, q: Node, params: DqParams) -> str | None:
    """Why the readers of ``q`` do not form Q → DQ pairs, or None when they do."""
    out = q.outputs[0]
    if out in graph.outputs:
        return "QuantizeLinear output is a graph output"
    for reader, port in graph.consumers(out):
        if reader.op is not Op.DEQUANTIZE_LINEAR or port != 0:
            return (f"QuantizeLinear output is read by {reader} (input {port}), not only by "
                    "DequantizeLinear")
        other = dq_params(graph, reader)
        if other is None:
            return f"DequantizeLinear {reader} has a non-constant scale or zero point"
        if not params.same_as(other):
            return (f"DequantizeLinear {reader} ({other.describe()}) differs from the "
                    f"QuantizeLinear ({params.describe()})")
    return None


def _rewrite(graph: Graph, q: Node, params: DqParams) -> None:
    dqs = [reader for reader, _ in graph.consumers(q.outputs[0])]
    x = q.inputs[0]
    rank = graph.info(x).rank
    low, high = qdq_ranges(params, rank)
    keep = dqs[0].outputs[0]
    q_origin, dq_origin = list(q.origin), [o for d in dqs for o in d.origin]
    meta = {"qdq": (params.dtype, params.quant()), "q_origin": q_origin,
            "dq_origin": dq_origin, "q_output": q.outputs[0]}
    info = TensorInfo(graph.info(x).shape, DType.F32)
    # Every DQ's readers move to the first DQ's output, whose name the FakeQuantize takes.
    for dq in dqs[1:]:
        graph.replace_all_uses(dq.outputs[0], keep)

    def build() -> None:
        fq = add_fake_quantize(graph, x, (low, high, low, high), 256, info, keep,
                               origin=q_origin + dq_origin, name=f"{q.name}/fake_quantize",
                               onnx=OnnxQuantize(params.dtype, params.quant()))
        fq.meta.update(meta)

    rebuild(graph, dqs + [q], build)


def _read_by_tables(graph: Graph, q: Node) -> bool:
    """Only tables (passes/table_lookup.py) read ``q``'s integers."""
    readers = graph.consumers(q.outputs[0])
    return (bool(readers) and q.outputs[0] not in graph.outputs
            and all(reader.op is Op.TABLE for reader, _ in readers))


def _quantize_only(graph: Graph, q: Node, params: DqParams) -> None:
    """``q`` as the quantize-only FakeQuantize decompose_fake_quantize writes for a pair: its
    integers, ONNX's ``saturate(rint(x/s) + zp)``, under the same name.

    table_lookup took the pair's DequantizeLinear into a table of the integers, so the
    QuantizeLinear stood alone, and a chain reaching it (quantize_static without
    quant_pre_process: MatMul → Q → DQ → Add bias → Q → GELU's table) stopped before it —
    QuantizeLinear has no post-op: the Add, a dequantize and this quantize ran as kernels of
    their own. A quantize-only FakeQuantize is the output quantize fuse_post_ops takes."""
    x, out, origin = q.inputs[0], q.outputs[0], list(q.origin)

    def build() -> None:
        fq = add_onnx_quantize(graph, x, params, out, origin=origin, name=f"{q.name}/quantize")
        fq.meta.update({"qdq": (params.dtype, params.quant()), "q_origin": origin,
                        "q_output": out})

    rebuild(graph, [q], build)


def add_onnx_quantize(graph: Graph, x: str, params: DqParams, out: str, *,
                      origin: list[str], name: str) -> Node:
    """A quantize-only FakeQuantize of ``x`` that is ONNX's QuantizeLinear with ``params``
    (``saturate(rint(x/s) + zp)``, ``attrs.onnx``): the pair's ranges in, the type's levels
    out, writing ``out``."""
    rank = graph.info(x).rank
    low, high = qdq_ranges(params, rank)
    levels = (along(np.full(params.scale.shape, bound, F32), rank, params.axis)
              for bound in params.dtype.range)
    info = TensorInfo(graph.info(x).shape, params.dtype, params.quant())
    return add_fake_quantize(graph, x, (low, high, *levels), 256, info, out, origin=origin,
                             name=name, onnx=OnnxQuantize(params.dtype, params.quant(),
                                                          dequantize=False))


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for q in graph.topo_order():
        if q.op is not Op.QUANTIZE_LINEAR or not graph.has_node(q.name):
            continue
        ctx.visit(q)
        if not graph.consumers(q.outputs[0]) and q.outputs[0] not in graph.outputs:
            continue
        params = dq_params(graph, q)
        if params is None:
            ctx.decline(q, "QuantizeLinear scale or zero point is not a constant")
            continue
        if not params.dtype.is_quantized:
            ctx.decline(q, f"QuantizeLinear to {params.dtype.name} (only u8/s8)")
            continue
        reason = _mismatch(graph, q, params)
        if reason is not None and _read_by_tables(graph, q):
            _quantize_only(graph, q, params)
            changed += 1
            continue
        if reason is not None:
            ctx.decline(q, reason)
            continue
        _rewrite(graph, q, params)
        changed += 1
    if changed:
        graph.remove_unused()
    return changed

