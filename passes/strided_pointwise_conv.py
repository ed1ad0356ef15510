"""A 1x1 convolution with strides reads a strided Slice of its input with unit strides.

``Conv(x, W)`` with a 1x1 kernel, strides (s_1, ..., s_k) and no padding reads only the input
pixels at multiples of the strides: it equals ``Conv(Slice(x, steps=s), W)`` with unit
strides, element for element (the same products and sums). The Slice is a strided view in the
lowering, and the convolution's source reorder copies the pixels it reads into a dense buffer.
The pass runs last (after post-op fusion, which visits nodes in topological order: a Slice
inserted before would move the convolution after its sibling and change which of the two
takes a residual Add).

Why: oneDNN 3.2 runs an int8 1x1 convolution with strides on ``jit_uni_int8_1x1:avx2`` through
its "reduce to unit stride" copy, and that kernel returns wrong values at random, run to run:
measured on the fuzz campaign's minimised seed 41245 (u8 [2, 8, 8, 2] → 1x1 conv, stride 2x1,
7 output channels → GlobalAveragePool), 57 of 300 runs wrong at two threads and 1 of 300 at
one, always the first output pixel of the second image; batch 4 on 6x6 maps as well, never
at unit strides. With the copy done here the same model is right on every run. It applies to
every such convolution whatever the implementation (the copy costs what oneDNN's own
reduce-to-unit-stride copy costs: a ResNet-50 downsampling shortcut reads a quarter of its
input either way).
"""

from __future__ import annotations

import logging

from qfuse.ir import Graph, Op
from qfuse.ir.ops import ConvAttrs, SliceAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.quant_utils import infer_into

log = logging.getLogger(__name__)


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for node in graph.topo_order():
        if node.op is not Op.CONV:
            continue
        attrs: ConvAttrs = node.attrs
        if (not attrs.kernel_shape or any(k != 1 for k in attrs.kernel_shape)
                or all(s == 1 for s in attrs.strides) or any(attrs.pads)):
            continue
        ctx.visit(node)
        x = node.inputs[0]
        info = graph.info(x)
        axes = tuple(range(2, info.rank))
        slice_attrs = SliceAttrs(starts=(0,) * len(axes),
                                 ends=tuple(info.shape[a] for a in axes), axes=axes,
                                 steps=tuple(attrs.strides))
        sub = graph.add_node(Op.SLICE, [x], 1, slice_attrs,
                             name=graph.unique_name(f"{node.name}/unit_stride"),
                             origin=node.origin)
        infer_into(graph, sub)
        if x in graph.channel_orders:  # the Slice keeps its input's channels, in its order
            graph.channel_orders[sub.outputs[0]] = graph.channel_orders[x]
        graph.set_input(node, 0, sub.outputs[0])
        node.attrs = ConvAttrs(attrs.kernel_shape, (1,) * len(attrs.strides), attrs.pads,
                               attrs.dilations, attrs.group)
        log.debug("%s reads every %s-th pixel through a Slice", node, attrs.strides)
        changed += 1
    return changed
