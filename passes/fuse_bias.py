"""FuseConvolutionMatMulDeconvAndBias (docs/design.md, pass 5; OpenVINO fake_quantize.md's extension to deconv).

Pattern: a Conv / ConvTranspose / MatMul whose output is read only by an ``Add`` with a
constant operand ``b`` that is per output channel (or one value), e.g. ``[1, C, 1, 1]`` for a
conv output ``[N, C, H, W]``, ``[C]`` or ``[1, C]`` for a matmul output ``[.., C]``. A constant
written as DequantizeLinear of constants counts (it is evaluated).

Rewrite, int8 compute node (``node.fused`` set): the chain ``[Scale(s_x·s_w), Shift?]`` gets
``Shift(b)`` appended:

    y = acc·(s_x·s_w) [+ bias] + b

which is what oneDNN 3.x computes with ``b`` added to its f32 bias *after* the weight scales
(the bias is in the dequantized domain, never scaled; the composer's add_to_bias folds the
two shifts). Bit-exact with the graph before: both add ``b`` in float32 to the same f32 value.

Rewrite, float Conv / ConvTranspose: ``b`` is added to the bias input (created if absent):
``conv(x, w) + bias + b = conv(x, w) + (bias + b)``. Not bit-exact: the reference adds the bias
to the float64 accumulator, so ``f32(acc + f32(bias + b))`` may differ from
``f32(f32(acc + bias) + b)`` by an ulp or so of the output.

Rewrite, float MatMul (ONNX MatMul has no bias input): the node gets
``Fused(chain=[Shift(b)])``, i.e. ``acc = matmul(src, wei)`` in float32 then ``+ b`` in float32,
bit-exact with the MatMul → Add it replaces.

In every case the node takes over the Add's output name, the Add (and a DequantizeLinear of
constants that only it read) is removed and its origin joins ``absorbed`` / ``origin``.

Declined (reason recorded on the Add): the output has other readers or is a graph output,
the operand is not a constant, or it broadcasts along a non-channel dim.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from qfuse.ir import DType, Graph, Node, Op
from qfuse.ir.chain import Fused, Shift
from qfuse.passes.base import PassContext
from qfuse.passes.post_op_match import (
    COMPUTE_OPS,
    channel_axis,
    channel_values,
    constant_operand,
    drop_if_unread,
    retarget,
)

log = logging.getLogger(__name__)


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for name in [n.name for n in graph.topo_order() if n.op in COMPUTE_OPS]:
        if graph.has_node(name) and _fuse(graph, ctx, ctx.visit(graph.node(name))):
            changed += 1
    return changed


def _fuse(graph: Graph, ctx: PassContext, node: Node) -> bool:
    out = node.outputs[0]
    readers = graph.consumers(out)
    adds = [r for r, _ in readers if r.op is Op.ADD]
    if not adds:
        return False  # not this pattern
    add = adds[0]
    if len(readers) > 1 or out in graph.outputs:
        where = "is a graph output" if out in graph.outputs else f"has {len(readers)} readers"
        ctx.decline(add, f"bias: the output of {node} {where}")
        return False
    other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
    if other == out:
        ctx.decline(add, f"bias: Add reads the output of {node} twice")
        return False
    data, dq = constant_operand(graph, other)
    if data is None:
        ctx.decline(add, f"bias: the other operand '{other}' is not a constant "
                         "(a residual add is fuse_post_ops' business)")
        return False
    out_info, add_info = graph.info(out), graph.info(add.outputs[0])
    if add_info.shape != out_info.shape:
        ctx.decline(add, f"bias: Add broadcasts the output {list(out_info.shape)} to "
                         f"{list(add_info.shape)}")
        return False
    if out_info.dtype is not DType.F32 or add_info.dtype is not DType.F32:
        ctx.decline(add, f"bias: {node} does not produce float32")
        return False
    axis = channel_axis(node, out_info.rank)
    values, why = channel_values(data, out_info.shape, axis)
    if values is None:
        ctx.decline(add, f"bias: operand '{other}' {why}")
        return False
    if node.fused is not None:
        fused = dataclasses.replace(node.fused, chain=[*node.fused.chain, Shift.of(values)],
                                    absorbed=[*node.fused.absorbed, *add.origin])
        retarget(graph, node, inputs=list(node.inputs), output=add.outputs[0], absorbed=[add],
                 fused=fused)
    elif node.op is Op.MATMUL:
        fused = Fused(chain=[Shift.of(values)], absorbed=list(add.origin),
                      notes=["float MatMul: bias as a post-op shift"])
        retarget(graph, node, inputs=list(node.inputs), output=add.outputs[0], absorbed=[add],
                 fused=fused)
    else:
        inputs = _with_bias(graph, ctx, node, add, values, out_info.shape[axis])
        if inputs is None:
            return False
        retarget(graph, node, inputs=inputs, output=add.outputs[0], absorbed=[add], fused=None)
    if dq is not None:
        drop_if_unread(graph, [dq])
    log.debug("bias of %s fused from %s", node.name, add.name)
    return True


def _with_bias(
    graph: Graph, ctx: PassContext, node: Node, add: Node, values: np.ndarray, channels: int
) -> list[str] | None:
    """The float conv's inputs with ``values`` added into its bias (a new constant)."""
    inputs = list(node.inputs) + [""] * (3 - len(node.inputs))
    old = np.zeros(channels, np.float32)
    if inputs[2]:
        data = graph.constant(inputs[2])
        if data is None:
            ctx.decline(add, f"bias: the bias input of {node} is not a constant")
            return None
        old = np.asarray(data, np.float32).reshape(channels)
    bias = (old + np.broadcast_to(values, (channels,))).astype(np.float32)
    inputs[2] = graph.add_constant(graph.unique_name(f"{node.name}_bias"), bias).name
    return inputs
