"""A MatMul over rows of a rank > 2 tensor with 2-D constant weights runs as one 2-D matmul.

``MatMul(x[B1, .., Bk, M, K], W[K, N])`` (ConvNeXt's and Swin's Linear layers on
``[1, H, W, C]``, a transformer's on ``[B, T, C]`` with B > 1) multiplies every row of x by
W: with x read row-major, ``out[r, :] = x[r, :] @ W`` for each of the ``B1·..·Bk·M`` rows. The
lowering gives oneDNN's matmul the shapes as they are, and oneDNN 3.2's GEMM-based int8
matmul then runs one GEMM of M rows per batch index (measured on AVX2, 2 threads, u8·s8:
``[1, 14, 14, 384] x [384, 1536]`` 1.88 ms against 1.15 ms for ``[196, 384] x [384, 1536]``).

Rewrite: x is reshaped to ``[R, K]`` (R = the product of its leading dims), the MatMul writes
``[R, N]`` under a new name, and a Reshape restores the output's shape and name. Each tensor
the node's post-op chain reads (ports 2.., residual sums and binary operands) is reshaped
alike when it has the output's shape, or to ``[1, N]`` / ``[1, 1]`` when it broadcasts per
last-dim channel or per tensor. The chain's items are per tensor or per last-dim channel, so
they apply to the same elements. Reshapes of row-major tensors are views in the lowering (no
copy). Exact: the same sums and roundings on the same elements.

Not applied: runtime weights (attention's Q·Kᵀ batches over heads), weights of rank > 2,
outputs whose leading dims are all 1 (already one GEMM), an operand that broadcasts otherwise,
a per-axis quantization on an axis other than the last.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from qfuse.ir import Graph, Node, Op, TensorInfo
from qfuse.ir.ops import ReshapeAttrs
from qfuse.passes.base import PassContext

log = logging.getLogger(__name__)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("flatten_matmul_rows"):
        return 0
    changed = 0
    for node in graph.topo_order():
        if node.op is not Op.MATMUL:
            continue
        why = _why_not(graph, node)
        if why is None:
            _rewrite(graph, node)
            changed += 1
        elif why:
            ctx.visit(node)
            log.debug("%s: rows not flattened: %s", node, why)
    return changed


def _rows(info: TensorInfo) -> tuple[int, int]:
    return math.prod(info.shape[:-1]), info.shape[-1]


def _flat_info(info: TensorInfo, shape: tuple[int, ...]) -> TensorInfo | None:
    """``info`` as ``shape`` (2-D), a per-axis quantization moved from the last axis to 1."""
    quant = info.quant
    if quant is not None and quant.axis is not None:
        if quant.axis % len(info.shape) != len(info.shape) - 1:
            return None
        quant = dataclasses.replace(quant, axis=1)
    return TensorInfo(shape, info.dtype, quant)


def _why_not(graph: Graph, node: Node) -> str | None:
    """None when the rewrite applies; "" when the node is out of scope; else why not."""
    out = graph.info(node.outputs[0])
    if len(out.shape) <= 2 or math.prod(out.shape[:-2]) == 1:
        return ""
    weights = graph.constant(node.inputs[1])
    if weights is None or weights.ndim != 2:
        return "the weights are not a 2-D constant"
    if graph.info(node.inputs[0]).shape[:-1] != out.shape[:-1]:
        return "the source broadcasts"
    if _flat_info(out, _rows(out)) is None or _flat_info(graph.info(node.inputs[0]), (1, 1)) \
            is None:
        return "quantized per channel on an axis other than the last"
    for value in (node.inputs[port] for port in _operand_ports(node)):
        shape = graph.info(value).shape
        if shape != out.shape and (len(shape) > len(out.shape)
                                   or any(d != 1 for d in shape[:-1])):
            return f"the chain's operand '{value}' of shape {shape} broadcasts across rows"
        if _flat_info(graph.info(value), (1, 1)) is None:
            return f"the chain's operand '{value}' is quantized per channel"
    return None


def _operand_ports(node: Node) -> list[int]:
    """The ports of the chain's operands (a run-time src zero point is a scalar, not one)."""
    zp_port = node.fused.src_zero_point_port if node.fused is not None else None
    return [p for p in range(2, len(node.inputs)) if p != zp_port]


def _reshaped(graph: Graph, node: Node, value: str, shape: tuple[int, ...]) -> str:
    info = graph.info(value)
    flat = _flat_info(info, shape)
    assert flat is not None
    reshape = graph.add_node(Op.RESHAPE, [value], [graph.unique_name(f"{value}@rows")],
                             ReshapeAttrs(shape), name=graph.unique_name(f"{node.name}/rows"),
                             infos=[flat], origin=node.origin)
    return reshape.outputs[0]


def _rewrite(graph: Graph, node: Node) -> None:
    y = node.outputs[0]
    out = graph.info(y)
    rows, n = _rows(out)
    k = graph.info(node.inputs[0]).shape[-1]
    graph.set_input(node, 0, _reshaped(graph, node, node.inputs[0], (rows, k)))
    for port in _operand_ports(node):
        value = node.inputs[port]
        shape = graph.info(value).shape
        if len(shape) < 2 and graph.constant(value) is None:
            continue  # a run-time operand of lower rank: the lowering views it (LowerContext.ranked)
        target = (rows, n) if shape == out.shape else (1, shape[-1] if shape else 1)
        graph.set_input(node, port, _reshaped(graph, node, value, target))
    flat = _flat_info(out, (rows, n))
    assert flat is not None
    graph.insert_after(node, 0, Op.RESHAPE, ReshapeAttrs(out.shape), flat,
                       name=f"{node.name}/unflatten")
    if node.fused is not None:
        node.fused.notes.append(f"rows flattened: {out.shape} computed as one [{rows}, {n}] "
                                "matmul")
