"""A constant Pad in front of a convolution becomes the convolution's own padding.

``Conv(Pad(x, pads, value 0))`` with the Pad adding only spatial borders (no batch or channel
pads, none negative) equals ``Conv(x)`` with those borders added to the convolution's pads:
ONNX's Conv pads with zeros (https://onnx.ai/onnx/operators/onnx__Conv.html), so the same
products and sums, element for element. Exporters write such Pads for TensorFlow's "SAME"
padding, which may be asymmetric (``nn.ZeroPad2d`` in EfficientNet-PyTorch's
Conv2dStaticSamePadding, timm's ``pad_same``, tf2onnx), and onnxruntime's optimizer folds them
the same way (its PadFusion), so quantize_static's models no longer have them while NNCF's do.

Quantized: after propagate_dequantize the Pad reads the integers, ``Pad(q, zp) → DQ → Conv``;
a padded integer equal to the zero point dequantizes to exactly 0, so the Pad folds when its
value is the dequantize's zero point (one zero point: per tensor, or per channel with equal
zero points). quantize_static quantizes the Pad's output again with its input's parameters
(a causal ``F.pad`` before a dilated Conv1d: TCNs), so at this point the chain reads
``Pad(q, zp) → DQ → Q → DQ → Conv`` with a requantize that is the identity on every integer
(passes/eliminate_requantize.py ``check``, which removes it only later): the Pad folds through
it the same way (a TCN's QDQ and QOperator forms: 35 → 15 kernels). The dequantize is rebuilt on q, and move_dequantize then takes the int8
convolution as usual (oneDNN's padding is the zero point's 0, as in any padded QDQ conv).

Not folded: other Pad modes (reflect, edge), a value that is not 0 in the conv's input
domain, pads on the batch or channel axes or negative ones (a crop), a Pad or dequantize
with other readers. Each declines with its reason in ``inspect``.
"""

from __future__ import annotations

import dataclasses
import logging

from qfuse.ir import Graph, Node, Op
from qfuse.ir.ops import ConvAttrs, PadAttrs, PadMode
from qfuse.passes import eliminate_requantize
from qfuse.passes.base import PassContext
from qfuse.passes.quant_utils import dq_params, infer_into, is_op

log = logging.getLogger(__name__)


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for conv in [n for n in graph.topo_order() if n.op is Op.CONV]:
        source = graph.producer(conv.inputs[0])
        dq = source if is_op(source, Op.DEQUANTIZE_LINEAR) else None
        pad = graph.producer(dq.inputs[0]) if dq is not None else source
        through: list[Node] = []
        if dq is not None and pad is not None and pad.op is Op.FAKE_QUANTIZE:
            through = _identity_requantize(graph, pad)
            pad = graph.producer(through[0].inputs[0]) if through else None
        if not is_op(pad, Op.PAD):
            continue
        assert pad is not None
        ctx.visit(pad)
        reason = _why_not(graph, pad, dq, conv, through)
        if reason is not None:
            ctx.decline(pad, reason)
            continue
        _fold(graph, pad, dq, conv)
        changed += 1
    if changed:
        graph.remove_unused()
    return changed


def _identity_requantize(graph: Graph, fq: Node) -> list[Node]:
    """[DQ, FQ] when ``fq`` quantizes a dequantize back to the same integers, else []."""
    dq = graph.producer(fq.inputs[0])
    if is_op(dq, Op.DEQUANTIZE_LINEAR) and eliminate_requantize.check(graph, dq, fq) is None:
        assert dq is not None
        return [dq, fq]
    return []


def _why_not(graph: Graph, pad: Node, dq: Node | None, conv: Node,
             through: list[Node]) -> str | None:
    attrs: PadAttrs = pad.attrs
    if attrs.mode is not PadMode.CONSTANT:
        return f"Pad mode '{attrs.mode.value}' is not the convolution's zero padding"
    rank = graph.info(pad.inputs[0]).rank
    begins, ends = attrs.pads[:rank], attrs.pads[rank:]
    if begins[0] or ends[0] or begins[1] or ends[1]:
        return "the Pad pads the batch or channel axis"
    if any(p < 0 for p in attrs.pads):
        return "the Pad crops (negative pads)"
    chain = [pad, *through, dq, conv] if dq is not None else [pad, conv]
    for producer, reader in zip(chain, chain[1:]):  # each value read by the next node only
        value = producer.outputs[0]
        readers = [c.name for c, _ in graph.consumers(value)]
        if readers != [reader.name] or value in graph.outputs:
            return f"'{value}' is read by more than the convolution"
    if dq is None:
        if attrs.value != 0.0:
            return f"pad value {attrs.value} is not the convolution's 0"
        return None
    params = dq_params(graph, dq)
    if params is None:
        return "the dequantize's scale or zero point is not a constant"
    zero_point = params.common_zero_point
    if zero_point is None or attrs.value != float(zero_point):
        return (f"pad value {attrs.value} is not the dequantize's zero point "
                f"({params.describe()}): its padding is not 0")
    return None


def _fold(graph: Graph, pad: Node, dq: Node | None, conv: Node) -> None:
    attrs: PadAttrs = pad.attrs
    rank = graph.info(pad.inputs[0]).rank
    spatial = rank - 2
    old: ConvAttrs = conv.attrs
    pads = tuple(old.pads[i] + attrs.pads[2 + i] for i in range(spatial)) + tuple(
        old.pads[spatial + i] + attrs.pads[rank + 2 + i] for i in range(spatial))
    source = pad.inputs[0]
    if dq is not None:  # the dequantize, rebuilt on the unpadded integers
        new_dq = graph.add_node(Op.DEQUANTIZE_LINEAR, [source, *dq.inputs[1:]], 1, dq.attrs,
                                name=graph.unique_name(dq.name), origin=dq.origin)
        infer_into(graph, new_dq)
        source = new_dq.outputs[0]
    graph.set_input(conv, 0, source)
    conv.attrs = dataclasses.replace(old, pads=pads)
    conv.origin = [*conv.origin, *(n for n in pad.origin if n not in conv.origin)]
    log.debug("%s takes the pads of %s: %s", conv, pad, pads)
