"""A GroupNorm of one group normalizes each sample over all its elements: it runs on the
sample itself, not on a Reshape of it to one row.

torch exports ``GroupNorm(1, C)`` (PoolFormer's and MobileViTv2's norms) as ``Reshape(x, [N, 1,
-1])``, ``InstanceNormalization`` with scale 1 and bias 0, a ``Reshape`` back to x's shape and
its own per-channel affine ``Mul`` / ``Add``; a quantizer puts a QuantizeLinear /
DequantizeLinear (NNCF: a FakeQuantize) between the norm and the Reshape back. qfuse imports
the InstanceNormalization as a LayerNormalization over axis 2 of ``[N, 1, M]``
(compiler/onnx_import/convert_math.py): one mean and variance per sample over its ``M =
C·H·W`` values. That is LayerNormalization over axis 1 of x itself, ``LN_1(x)``: the same
values normalized by the same two moments (ONNX LayerNormalization normalizes over the dims
from ``axis`` on, https://onnx.ai/onnx/operators/onnx__LayerNormalization.html). The pass
rewrites

    x → Reshape [N, 1, M] → LN_2 → (per-tensor quantize / dequantize)* → Reshape x.shape

into ``x → LN_1 → (the same quantize / dequantize)*`` on x's shape, and the readers of the
second Reshape read the last of them. Why: a Reshape to one row is a view of a row-major
tensor only; the convolution before writes channels-last, so the row was a reorder and the
norm's output another one back for the convolution after (four reorders a transformer block
in MobileViTv2-0.5, 5-30 us each). With scale 1 and a uniform bias, normalizing every element
of a sample by the sample's moments does not depend on the order the elements lie in:
compiler/lower/lower_norm.py runs ``LN_1`` over x's own bytes in x's layout when they are
dense with the batch outermost, and writes the output in that layout.

Values: each element is ``(x − μ)/sqrt(σ² + ε)`` as before; μ and σ² are sums over the same
elements, added in the order they lie in memory — the last bits of float32 can differ from a
row-major sum (lower_norm already splits such wide rows into parts whose moments it pools).

Composer option ``whole_sample_norm`` (on by default).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.passes.base import PassContext

log = logging.getLogger(__name__)

#: per-tensor ops the pass carries over to x's shape: each element maps alone
_ELEMENTWISE = (Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR, Op.FAKE_QUANTIZE)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("whole_sample_norm"):
        return 0
    changed = 0
    for norm in [n for n in graph.topo_order() if n.op is Op.LAYER_NORM]:
        found = _match(graph, norm)
        if found is None:
            continue
        first, before, after, last = found
        ctx.visit(norm)
        x = first.inputs[0]
        shape = graph.info(x).shape
        head = before[0] if before else norm
        graph.set_inputs(head, [x, *head.inputs[1:]])
        norm.attrs = dataclasses.replace(norm.attrs, axis=1)
        for node in (*before, norm, *after):
            value = node.outputs[0]
            graph.set_info(value, graph.info(value).with_shape(shape))
        graph.replace_all_uses(last.outputs[0], last.inputs[0])
        graph.remove_node(last)
        norm.origin.extend(last.origin)
        if not graph.uses(first.outputs[0]):
            graph.remove_node(first)
            norm.origin.extend(first.origin)
        log.info("node %s: normalizes %s over its %d values per sample (GroupNorm(1))",
                 norm, x, math.prod(shape[1:]))
        changed += 1
    return changed


def _match(graph: Graph, norm: Node) -> tuple[Node, list[Node], list[Node], Node] | None:
    """(the Reshape to ``[N, 1, M]``, the per-tensor ops between it and the norm, those after
    the norm, the Reshape back) when ``norm`` is a GroupNorm(1) the pass rewrites, else
    None. quantize_static quantizes the Reshape's output too: a QuantizeLinear /
    DequantizeLinear pair on each side of the norm."""
    if norm.attrs.axis not in (2, -1) or not _uniform(graph, norm):
        return None
    if any(graph.uses(v) for v in norm.outputs[1:]):  # the mean / inv-std outputs
        return None
    before: list[Node] = []
    first = graph.producer(norm.inputs[0])
    while first is not None and _elementwise(graph, first):
        if graph.uses(first.outputs[0]) != 1 or first.outputs[0] in graph.outputs:
            return None
        before.insert(0, first)
        first = graph.producer(first.inputs[0])
    if (first is None or first.op is not Op.RESHAPE or graph.uses(first.outputs[0]) != 1
            or first.outputs[0] in graph.outputs):
        return None
    shape = graph.info(first.inputs[0]).shape
    if len(shape) < 3 or graph.info(norm.inputs[0]).shape != (shape[0], 1, math.prod(shape[1:])):
        return None
    after: list[Node] = []
    value = norm.outputs[0]
    while True:
        readers = graph.consumers(value)
        if len(readers) != 1 or value in graph.outputs:
            return None
        reader, port = readers[0]
        if reader.op is Op.RESHAPE and port == 0:
            break
        if port != 0 or not _elementwise(graph, reader):
            return None
        after.append(reader)
        value = reader.outputs[0]
    if graph.info(reader.outputs[0]).shape != shape or reader.outputs[0] in graph.outputs:
        return None  # (a graph output keeps its name: its Reshape stays)
    return first, before, after, reader


def _elementwise(graph: Graph, node: Node) -> bool:
    """A per-tensor quantize / dequantize: it maps each element alone, the same way."""
    return node.op in _ELEMENTWISE and all(
        (c := graph.constant(v)) is not None and c.size == 1 for v in node.inputs[1:] if v)


def _uniform(graph: Graph, norm: Node) -> bool:
    """The norm's scale is all ones and its bias one value (or none): every element of a
    sample goes through the same affine map, in any order."""
    scale = graph.constant(norm.inputs[1]) if len(norm.inputs) > 1 and norm.inputs[1] else None
    if scale is None or np.any(np.asarray(scale) != 1):
        return False
    if len(norm.inputs) > 2 and norm.inputs[2]:
        bias = graph.constant(norm.inputs[2])
        return bias is not None and np.unique(np.asarray(bias)).size <= 1
    return True

