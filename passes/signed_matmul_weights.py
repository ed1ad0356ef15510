"""u8 activations read as int8 MatMul weights become s8 at their producer (zero point − 128).

oneDNN's int8 matmul takes s8 weights only, so a runtime u8 weights tensor (attention's K and
V) would be shifted by a reorder kernel of its own before the matmul
(compiler/lower/lower_matmul.py). When the tensor comes from a fused compute node, that node can
write the shifted values itself.

Pattern: a fused MatMul M reads, as its weights (input 1), a non-constant u8 value w that a
fused Conv / ConvTranspose / MatMul, or a fused Add / Mul (attention's k·(1/√d) with its
quantize: DeiT, PiT, TinyViT, MobileViT QDQ), P produces through value-moving ops (Reshape, Flatten,
Squeeze, Unsqueeze, Transpose) and Splits (attention's q, k and v cut from one projection:
DeiT's v, EfficientViT-M0's k and v); every value those ops make from P's output is read only
by them or by a node that takes it as s8 with its zero point 128 lower — a fused MatMul's
weights or source, a fused Add / Mul chain's 8-bit source (``_takes_s8``) — and none is a
graph output; P's chain ends with a per-tensor ``Quantize`` of 256 levels onto exactly [0, 255]
(u8).

Rewrite: P's Quantize gets output range [-128, 127] and type s8; every value from P's output
through those ops becomes s8 with zero point zp - 128 (same scale), under a new name
(``<name>_s8``: the values differ, and ``qfuse compare`` matches tensors by name); each reader's
weight or source zero point drops by 128.

Exact: with ``oh - ol = levels - 1`` the Quantize is ``round((x - il)/(ih - il)·255) + ol``, so
every quantized value becomes the old one minus 128 (from [0, 255] onto [-128, 127]: nothing
saturates), the value-moving ops move the same elements, and ``(q - 128) - (zp - 128) = q - zp``
leaves every dequantized value and every reader's accumulator unchanged. A Quantize from a Q/DQ pair
(``onnx``, round(x/s) + zp) keeps its scale and takes zero point zp - 128: the same shift. P keeps its dst zero point (now
zp - 128), which oneDNN's convolutions and matmuls take.
"""

from __future__ import annotations

import dataclasses
import logging

from qfuse.ir import DType, Graph, Node, Op, QuantParams, TensorInfo
from qfuse.ir.chain import Quantize
from qfuse.ir.types import OnnxQuantize
from qfuse.passes.base import PassContext
from qfuse.passes.post_op_match import COMPUTE_OPS

log = logging.getLogger(__name__)

MOVES = frozenset({Op.RESHAPE, Op.FLATTEN, Op.SQUEEZE, Op.UNSQUEEZE, Op.TRANSPOSE})
# what the shift may pass through: the value-moving ops and a Split (attention's q, k, v parts
# of one projection: every part is shifted, so each must be read as s8 too, ``_takes_s8``)
THROUGH = MOVES | {Op.SPLIT}
# fused nodes whose lowering writes the chain's final quantize with its own zero point: the
# compute ops (a dst zero point) and Add / Mul gate chains (a binary primitive storing
# ``x·(1/s) + zp`` as post-ops, compiler/lower/lower_gate.py)
PRODUCERS = COMPUTE_OPS | {Op.ADD, Op.MUL}
SHIFT = 128


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for node in graph.topo_order():
        if node.op is not Op.MATMUL or node.fused is None or len(node.inputs) < 2:
            continue
        ctx.visit(node)
        found = _region(graph, node.inputs[1])
        if isinstance(found, str):
            ctx.decline(node, f"u8 weights stay u8 (shifted by a reorder): {found}")
        elif found is not None:
            _rewrite(graph, node, *found)
            changed += 1
    return changed


def _region(graph: Graph, w: str
            ) -> tuple[Node, list[Node], list[tuple[Node, int]]] | str | None:
    """(P, the value-moving nodes its output reaches, the other readers of their values as
    (node, port)) or why not; None when w is no u8 activation."""
    info = graph.values[w].info
    if graph.constant(w) is not None or info is None or info.dtype is not DType.U8:
        return None
    producer = graph.producer(w)
    while producer is not None and producer.op in THROUGH and producer.fused is None:
        producer = graph.producer(producer.inputs[0])
    if producer is None or producer.op not in PRODUCERS or producer.fused is None:
        return "not produced by a fused compute node or Add / Mul (through value-moving ops)"
    last = producer.fused.chain[-1] if producer.fused.chain else None
    if not (isinstance(last, Quantize) and last.levels == 256 and last.dtype is DType.U8
            and last.output_low == (0.0,) and last.output_high == (255.0,)):
        return f"{producer}'s chain does not end with a quantize onto [0, 255]"
    moving: list[Node] = []
    readers: list[tuple[Node, int]] = []
    pending = [producer.outputs[0]]
    while pending:
        value = pending.pop()
        quant = graph.info(value).quant
        if value in graph.outputs:
            return f"'{value}' has other readers (a graph output)"
        if graph.info(value).dtype is not DType.U8 or quant is None or not quant.per_tensor:
            return f"'{value}' is not u8 quantized per tensor"
        for reader, port in graph.consumers(value):
            if reader.op in THROUGH and reader.fused is None and port == 0:
                moving.append(reader)
                pending.extend(reader.outputs)
            elif _takes_s8(reader, port):
                readers.append((reader, port))
            else:
                return f"'{value}' has other readers ({reader})"
    return producer, moving, readers


def _takes_s8(reader: Node, port: int) -> bool:
    """Whether ``reader`` reads the 8-bit tensor at ``port`` with a zero point it can take
    128 lower: a fused MatMul's weights (input 1) or source (input 0, a constant zero point),
    or the 8-bit source of a fused Add / Mul chain (input 0, ``Fused.src_scale``)."""
    fused = reader.fused
    if fused is None or fused.src_zero_point_port is not None:
        return False
    if reader.op is Op.MATMUL:
        return port in (0, 1)
    return reader.op in (Op.ADD, Op.MUL) and port == 0 and fused.src_scale is not None


def _rewrite(graph: Graph, matmul: Node, producer: Node, moving: list[Node],
             readers: list[tuple[Node, int]]) -> None:
    assert producer.fused is not None
    last = producer.fused.chain[-1]
    assert isinstance(last, Quantize)
    onnx = last.onnx
    if onnx is not None:  # round(x/s) + zp - 128, saturated onto [-128, 127]: the same shift
        q = onnx.quant
        onnx = OnnxQuantize(DType.S8, QuantParams.make(q.scale[0], q.zero_point[0] - SHIFT),
                            dequantize=onnx.dequantize)
    producer.fused.chain[-1] = dataclasses.replace(
        last, output_low=(-128.0,), output_high=(127.0,), dtype=DType.S8, onnx=onnx)
    order = {n.name: i for i, n in enumerate(graph.topo_order())}
    # rebuilt in graph order: each rebuilt node goes to the end of it, and so keeps its place
    # among the others
    for node in [producer, *sorted(moving, key=lambda n: order[n.name])]:
        infos = []
        for value in node.outputs:
            info = graph.info(value)
            assert info.quant is not None
            infos.append(info.with_dtype(DType.S8, QuantParams.make(
                info.quant.scale[0], info.quant.zero_point[0] - SHIFT)))
        _retype(graph, node, [graph.unique_name(f"{v}_s8") for v in node.outputs], infos)
    for reader, port in readers:
        assert reader.fused is not None
        if reader.op is Op.MATMUL and port == 1:
            reader.fused.wei_zero_point -= SHIFT
        else:
            reader.fused.src_zero_point -= SHIFT
    log.debug("%s writes s8 for the weights of %s (through %s; read by %s)", producer, matmul,
              [n.name for n in moving], [r.name for r, _ in readers])


def _retype(graph: Graph, node: Node, outs: list[str], infos: list[TensorInfo]) -> None:
    """Rebuild ``node`` (same name, fused chain and meta) producing ``outs`` typed ``infos``;
    its readers follow. New names, since the values changed (quant_utils: ``qfuse compare``
    matches tensors by name)."""
    name, olds = node.name, list(node.outputs)
    moving = graph.add_node(node.op, node.inputs,
                            [graph.unique_name(f"{out}__moving") for out in outs], node.attrs,
                            name=f"{name}__moving", infos=infos)
    for old, temporary in zip(olds, moving.outputs):
        graph.replace_all_uses(old, temporary)
    graph.remove_node(node)
    new = graph.add_node(node.op, node.inputs, outs, node.attrs, name=name, infos=infos,
                         origin=node.origin)
    new.meta, new.fused = node.meta, node.fused
    for temporary, out in zip(moving.outputs, outs):
        graph.replace_all_uses(temporary, out)
    graph.remove_node(moving)
