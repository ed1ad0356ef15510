"""u8 activations read as int8 MatMul weights become s8 at their producer (zero point − 128).

oneDNN's int8 matmul takes s8 weights only, so a runtime u8 weights tensor (attention's K and
V) would be shifted by a reorder kernel of its own before the matmul
(compiler/lower/lower_matmul.py). When the tensor comes from a fused compute node, that node can
write the shifted values itself.

Pattern: a fused MatMul M reads, as its weights (input 1), a non-constant u8 value w that a
fused Conv / ConvTranspose / MatMul, or a fused Add / Mul (attention's k·(1/√d) with its
quantize: DeiT, PiT, TinyViT, MobileViT QDQ), P produces through value-moving ops (Reshape, Flatten,
Squeeze, Unsqueeze, Transpose), every value from P to w read only by the next node of the path
and not a graph output; P's chain ends with a per-tensor ``Quantize`` of 256 levels onto
exactly [0, 255] (u8).

Rewrite: P's Quantize gets output range [-128, 127] and type s8; every value from P to w
becomes s8 with zero point zp - 128 (same scale), under a new name (``<name>_s8``: the values
differ, and ``qfuse compare`` matches tensors by name); M's weight zero point drops by 128.

Exact: with ``oh - ol = levels - 1`` the Quantize is ``round((x - il)/(ih - il)·255) + ol``, so
every quantized value becomes the old one minus 128 (from [0, 255] onto [-128, 127]: nothing
saturates), the value-moving ops move the same elements, and ``(q - 128) - (zp - 128) = q - zp``
leaves every dequantized value and M's accumulator unchanged. A Quantize from a Q/DQ pair
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
        found = _path(graph, node.inputs[1])
        if isinstance(found, str):
            ctx.decline(node, f"u8 weights stay u8 (shifted by a reorder): {found}")
        elif found is not None:
            _rewrite(graph, node, *found)
            changed += 1
    return changed


def _path(graph: Graph, w: str) -> tuple[Node, list[str]] | str | None:
    """(P, the values from P's output to ``w``) or why not; None when w is no u8 activation."""
    info = graph.values[w].info
    if graph.constant(w) is not None or info is None or info.dtype is not DType.U8:
        return None
    values = [w]
    producer = graph.producer(w)
    while producer is not None and producer.op in MOVES and producer.fused is None:
        values.append(producer.inputs[0])
        producer = graph.producer(producer.inputs[0])
    if producer is None or producer.op not in PRODUCERS or producer.fused is None:
        return "not produced by a fused compute node or Add / Mul (through value-moving ops)"
    for value in values:
        if value in graph.outputs or graph.uses(value) != 1:
            return f"'{value}' has other readers"
        quant = graph.info(value).quant
        if graph.info(value).dtype is not DType.U8 or quant is None or not quant.per_tensor:
            return f"'{value}' is not u8 quantized per tensor"
    chain = producer.fused.chain
    last = chain[-1] if chain else None
    if not (isinstance(last, Quantize) and last.levels == 256 and last.dtype is DType.U8
            and last.output_low == (0.0,) and last.output_high == (255.0,)):
        return f"{producer}'s chain does not end with a quantize onto [0, 255]"
    return producer, list(reversed(values))


def _rewrite(graph: Graph, matmul: Node, producer: Node, values: list[str]) -> None:
    assert producer.fused is not None and matmul.fused is not None
    last = producer.fused.chain[-1]
    assert isinstance(last, Quantize)
    onnx = last.onnx
    if onnx is not None:  # round(x/s) + zp - 128, saturated onto [-128, 127]: the same shift
        q = onnx.quant
        onnx = OnnxQuantize(DType.S8, QuantParams.make(q.scale[0], q.zero_point[0] - SHIFT),
                            dequantize=onnx.dequantize)
    producer.fused.chain[-1] = dataclasses.replace(
        last, output_low=(-128.0,), output_high=(127.0,), dtype=DType.S8, onnx=onnx)
    for value in values:
        info = graph.info(value)
        assert info.quant is not None
        quant = QuantParams.make(info.quant.scale[0], info.quant.zero_point[0] - SHIFT)
        node = graph.producer(value)
        assert node is not None
        _retype(graph, node, graph.unique_name(f"{value}_s8"), info.with_dtype(DType.S8, quant))
    matmul.fused.wei_zero_point -= SHIFT
    log.debug("%s writes s8 for the weights of %s (through %s)", producer, matmul, values)


def _retype(graph: Graph, node: Node, out: str, info: TensorInfo) -> None:
    """Rebuild single-output ``node`` (same name, fused chain and meta) producing ``out``
    typed ``info``; its readers follow. A new name, since the values changed (quant_utils:
    ``qfuse compare`` matches tensors by name)."""
    name, old = node.name, node.outputs[0]
    moving = graph.add_node(node.op, node.inputs, [graph.unique_name(f"{out}__moving")],
                            node.attrs, name=f"{name}__moving", infos=[info])
    graph.replace_all_uses(old, moving.outputs[0])
    graph.remove_node(node)
    new = graph.add_node(node.op, node.inputs, [out], node.attrs, name=name, infos=[info],
                         origin=node.origin)
    new.meta, new.fused = node.meta, node.fused
    graph.replace_all_uses(moving.outputs[0], out)
    graph.remove_node(moving)
