"""A squeeze-excitation gate's convolution writes the gate repeated, in the rows its multiply
reads.

A squeeze-excitation block ends ``y = x·g``: x is ``[1, C, H, W]`` (8-bit or float32,
channels-last in the lowering) and g the ``[1, C, 1, 1]`` gate, computed from x's mean by a
convolution (then HardSigmoid / Sigmoid and, in quantized models, a quantize). oneDNN 3.2's
jit binary walks g along x's rows of C channels at a cost a row (ir/rows.py). The lowering
views x as rows of k·C elements with g repeated k times along them (compiler/lower/lower_gate.py
``_tile_factor``), but repeats a run-time g with a kernel of its own (3.5-5 µs), so only for
chains large enough to pay for it (``ir.rows.repeat_kernel_pays``); smaller ones walk rows of
C.

For those, the convolution computing g computes it k times instead: its weights and bias
repeated k times along the output channels, every per-channel value of its chain and
composed attributes likewise (passes/repeat_channels.py), so it writes ``[1, k·C, 1, 1]`` —
channel ``r·C + c`` is g's channel c — and g is the first C of them (a Slice, a view in the
lowering). The multiply reads the k·C values as its operand in rows of k·C
(``node.meta["repeated_operands"]``, lower_gate), no kernel between; k makes rows of
``GATE_ROW`` elements. The wider convolution costs 1.2-1.7 µs more (PP-OCR cls's int8 gates),
about what rows longer than ``GATE_SHORT`` channels gain, so only gates of at most that many
channels.

Measured on PP-OCR cls (its gates on channels-last [1, C, H, W], C = 8 … 104, 2 threads, AMD
EPYC with AVX-512 VNNI): 0.96x the run NNCF, 0.96x QDQ (the plans with and without, in one
process, alternating); the MobileNetV3 and EfficientNet-B0 plans are unchanged (their gates
have more channels or pay for a repeat kernel).

Bit-exact: every repeated channel is the same integer sums and the same float32 chain as
the one it repeats, and the multiply reads the same values.

Applies when the multiply is a fused Mul whose chain reads the gate as a ``TensorOperand``
("mul"); x has batch 1 and rank 4; the gate has x's channels and 1s elsewhere, is float32 and
no graph output; C <= GATE_SHORT, no repeat kernel pays and k = ``ir.rows.repeats(H·W, C,
GATE_ROW)`` > 1; the gate's producer is a Conv with one group, constant weights (and bias), a
1x1 output and a chain that reads no tensor and quantizes per tensor, with at most
``MAX_WEIGHTS`` weights once repeated. Composer option ``widen_gate`` (on by default).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from qfuse.ir import DType, Graph, Node, Op, TensorInfo
from qfuse.ir.chain import TensorOperand
from qfuse.ir.ops import ConvAttrs, SliceAttrs
from qfuse.ir.rows import GATE_ROW, GATE_SHORT, repeat_kernel_pays, repeats
from qfuse.passes.base import PassContext
from qfuse.passes.repeat_channels import (
    repeatable,
    repeated_bias,
    repeated_state,
    tiled_quant,
)
from qfuse.passes.replace import replace_nodes

log = logging.getLogger(__name__)

MAX_WEIGHTS = 1 << 20  # weights of the repeated convolution (1 MiB at s8, 4 at f32)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("widen_gate"):
        return 0
    changed = 0
    for node in graph.topo_order():
        found = _gate(graph, node) if node.op is Op.MUL and node.fused is not None else None
        if found is None:
            continue
        port, conv, k = found
        ctx.visit(node)
        wide = _widen(graph, conv, k)
        node.meta["repeated_operands"] = {**node.meta.get("repeated_operands", {}),
                                          port: (wide, k)}
        changed += 1
    if changed:
        graph.remove_unused()  # the gate convolutions' own weights and bias
    return changed


def _gate(graph: Graph, node: Node) -> tuple[int, Node, int] | None:
    """(the gate's port, the Conv computing it, k) when the rewrite applies to ``node``."""
    assert node.fused is not None
    x = graph.info(node.inputs[0])
    if x.rank != 4 or x.shape[0] != 1:
        return None
    channels, h, w = x.shape[1:]
    # where a repeat kernel pays, the lowering makes one; a wider Conv costs about as much
    short = channels <= GATE_SHORT and not repeat_kernel_pays(h * w, channels)
    k = repeats(h * w, channels, GATE_ROW) if short else 1
    if k < 2:
        return None
    for item in node.fused.chain:
        if not (isinstance(item, TensorOperand) and item.alg == "mul"):
            continue
        gate = node.inputs[item.port]
        info = graph.info(gate)
        conv = graph.producer(gate)
        if (info.shape != (1, channels, 1, 1) or info.dtype is not DType.F32
                or gate in graph.outputs or conv is None or not _widens(graph, conv, k)):
            continue
        return item.port, conv, k
    return None


def _widens(graph: Graph, conv: Node, k: int) -> bool:
    """Can ``conv`` write its output k times (module docstring)?"""
    if conv.op is not Op.CONV or conv.attrs.group != 1 or len(conv.outputs) != 1:
        return False
    weights = graph.constant(conv.inputs[1])
    bias = conv.inputs[2] if len(conv.inputs) > 2 else ""
    out = graph.info(conv.outputs[0])
    return (weights is not None and weights.size * k <= MAX_WEIGHTS
            and (not bias or graph.constant(bias) is not None) and len(conv.inputs) <= 3
            and math.prod(out.shape[2:]) == 1
            and (conv.fused is None or repeatable(conv.fused.chain)))


def _widen(graph: Graph, conv: Node, k: int) -> str:
    """Rebuild ``conv`` writing its output k times under a new name, its old output a Slice
    of the first C channels; returns the new output's name."""
    x, w, y = conv.inputs[0], conv.inputs[1], conv.outputs[0]
    out = graph.info(y)
    channels = out.shape[1]
    weights = graph.constant(w)
    assert weights is not None
    winfo = graph.info(w)
    wide_w = np.tile(weights, (k,) + (1,) * (weights.ndim - 1))
    inputs = [x, graph.add_constant(graph.unique_name(f"{w}@x{k}"), wide_w, TensorInfo(
        wide_w.shape, winfo.dtype, tiled_quant(winfo.quant, k, 0))).name,
        *repeated_bias(graph, conv, k, f"@x{k}")]
    fused, meta = repeated_state(
        conv, k, f"writes its {channels} channels {k} times: the gate's multiply reads them in "
        f"rows of {k * channels} (passes/widen_gate.py)")
    attrs: ConvAttrs = conv.attrs
    name, origin = conv.name, list(conv.origin)
    wide = graph.unique_name(f"{y}@x{k}")

    def build() -> None:
        new = graph.add_node(Op.CONV, inputs, [wide], attrs, name=name, infos=[TensorInfo(
            (out.shape[0], k * channels, *out.shape[2:]), out.dtype, out.quant)], origin=origin)
        new.fused, new.meta = fused, meta
        first = graph.add_node(Op.SLICE, [wide], [y], SliceAttrs((0,), (channels,), (1,), (1,)),
                               name=graph.unique_name(f"{name}/first"), infos=[out],
                               origin=origin)
        first.meta["view_of"] = name  # part of the Conv's kernel (no kernel: fusion_report)

    replace_nodes(graph, [conv], build)
    log.debug("%s: writes its %d channels %d times", name, channels, k)
    return wide
