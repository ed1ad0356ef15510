"""What fuse_bias and fuse_post_ops share: reading constants, per-channel checks, rewiring.

Channel axis: 1 for Conv / ConvTranspose and the pools, the last dim for MatMul (oneDNN's
per-OC scale mask and binary per-channel broadcast use the same axis).

A constant operand of an elementwise op is a post-op value only when it broadcasts along
the channel axis alone: with numpy broadcasting the operand's shape is right-aligned with the
output's, so ``[1, C, 1, 1]`` and ``[C, 1, 1]`` are per channel for a conv output
``[N, C, H, W]`` while ``[C]`` is not (it runs along W). A constant may be written as
``DequantizeLinear`` of constants (ONNX Runtime's quantized biases and scalar factors); it is
evaluated here with the reference semantics, so the folded values are bit-identical.

Rewiring (``retarget``): the graph has no rename, and a fused chain must keep the name of the
last value it absorbs (graph outputs and later readers refer to it). The compute node is
rebuilt once under a temporary output name, readers of the absorbed value are moved to it,
the absorbed nodes and the old compute node are removed, and the node is built again under
its own name producing the absorbed value's name. Graph output positions never change
(``replace_all_uses`` keeps them in place).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable

import numpy as np

from qfuse.ir import DType, Graph, Node, Op, TensorInfo
from qfuse.ir.chain import Act, Activation, Fused
from qfuse.ir.ops import (
    AlphaAttrs,
    ClipAttrs,
    GeluApprox,
    GeluAttrs,
    HardSigmoidAttrs,
    HardSwishAttrs,
)
from qfuse.passes.quant_utils import is_constant_operand
from qfuse.runtime.reference import IMPLS  # constants evaluate with the reference semantics

log = logging.getLogger(__name__)

COMPUTE_OPS = frozenset({Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL})
POOL_OPS = frozenset({Op.AVG_POOL, Op.GLOBAL_AVG_POOL})
_SIMPLE_ACT = {Op.RELU: Act.RELU, Op.SIGMOID: Act.SIGMOID, Op.TANH: Act.TANH}


def activation(node: Node) -> Activation | None:
    """``node`` as the chain's activation item (an elementwise op a chain takes as an eltwise
    post-op, with its constant attributes), or None."""
    op, attrs = node.op, node.attrs
    if op in _SIMPLE_ACT:
        return Activation(_SIMPLE_ACT[op])
    if op is Op.LEAKY_RELU and isinstance(attrs, AlphaAttrs):
        return Activation(Act.RELU, float(attrs.alpha))
    if op is Op.CLIP and isinstance(attrs, ClipAttrs):
        if attrs.min == 0.0 and attrs.max == math.inf:
            return Activation(Act.RELU)
        return Activation(Act.CLIP, float(attrs.min), float(attrs.max))
    if op is Op.HARD_SIGMOID and isinstance(attrs, HardSigmoidAttrs):
        return Activation(Act.HARD_SIGMOID, float(attrs.alpha), float(attrs.beta))
    if op is Op.HARD_SWISH and isinstance(attrs, HardSwishAttrs):
        return Activation(Act.HARD_SWISH, float(attrs.alpha), float(attrs.beta))
    if op is Op.SWISH:
        return Activation(Act.SWISH, 1.0)
    if op is Op.GELU and isinstance(attrs, GeluAttrs):
        tanh = attrs.approximate is GeluApprox.TANH
        return Activation(Act.GELU_TANH if tanh else Act.GELU_ERF)
    return None


def float_compute(graph: Graph, node: Node) -> bool:
    """A Conv / ConvTranspose / MatMul on a float32 source: a float kernel (the fp32 mode's,
    or one a quantized model leaves in float32), not an int8 one."""
    if node.op not in COMPUTE_OPS:
        return False
    info = graph.values[node.inputs[0]].info
    return info is not None and info.dtype is DType.F32


def channel_axis(node: Node, rank: int) -> int:
    """The output channel axis of a compute or pooling node with a rank-``rank`` output."""
    return rank - 1 if node.op is Op.MATMUL else 1


def out_channels(graph: Graph, node: Node) -> int:
    shape = graph.info(node.outputs[0]).shape
    return int(shape[channel_axis(node, len(shape))])


def constant_operand(graph: Graph, value: str) -> tuple[np.ndarray | None, Node | None]:
    """The data of ``value`` when it is a constant or a DequantizeLinear of constants.

    Returns (data, the DequantizeLinear node or None); (None, None) when not constant.
    """
    data = graph.constant(value)
    if data is not None:
        return data, None
    if not is_constant_operand(graph, value):
        return None, None
    producer = graph.producer(value)
    assert producer is not None
    args = [graph.constant(name) if name else None for name in producer.inputs]
    return IMPLS[Op.DEQUANTIZE_LINEAR](producer, args)[0], producer


def channel_values(
    data: np.ndarray, out_shape: tuple[int, ...], axis: int
) -> tuple[np.ndarray | None, str]:
    """``data`` as 1 (per-tensor) or C (per-channel) float32 values, or (None, why not)."""
    array = np.asarray(data)
    if array.size == 1:
        return array.astype(np.float32).reshape(1), ""
    if array.ndim > len(out_shape):
        return None, f"has rank {array.ndim}, more than the output's {len(out_shape)}"
    padded = (1,) * (len(out_shape) - array.ndim) + tuple(array.shape)
    for dim, (have, out) in enumerate(zip(padded, out_shape)):
        if have == 1 or (dim == axis and have == out):
            continue
        return None, (f"of shape {list(array.shape)} broadcasts along dim {dim} of the "
                      f"output {list(out_shape)} (only the channel dim {axis} is a post-op "
                      "operand)")
    return array.astype(np.float32).reshape(-1), ""


def sole_reader(graph: Graph, value: str) -> tuple[Node | None, str]:
    """The one node reading ``value`` (once), or (None, why the chain cannot continue)."""
    if value in graph.outputs:
        return None, f"'{value}' is a graph output"
    readers = graph.consumers(value)
    if not readers:
        return None, f"'{value}' has no readers"
    if len(readers) > 1:
        return None, f"'{value}' has {len(readers)} readers"
    return readers[0][0], ""


def depends_on(graph: Graph, value: str, node: Node) -> bool:
    """True when computing ``value`` needs ``node`` (walks producers backwards)."""
    seen: set[str] = set()
    stack = [value]
    while stack:
        producer = graph.producer(stack.pop())
        if producer is None or producer.name in seen:
            continue
        if producer.name == node.name:
            return True
        seen.add(producer.name)
        stack.extend(v for v in producer.inputs if v)
    return False


def retarget(
    graph: Graph,
    node: Node,
    *,
    inputs: list[str],
    output: str,
    absorbed: Iterable[Node],
    fused: Fused | None,
    info: TensorInfo | None = None,
) -> Node:
    """Rebuild ``node`` reading ``inputs`` and producing ``output`` (a value of the last node
    in ``absorbed``); the absorbed nodes are removed. Returns the new node (same name)."""
    absorbed = list(absorbed)
    info = info if info is not None else graph.info(output)
    meta, origin = dict(node.meta), list(node.origin)
    for other in absorbed:
        origin.extend(o for o in other.origin if o not in origin)
    temp = graph.add_node(node.op, inputs, [graph.unique_name(f"{output}__fusing")], node.attrs,
                          name=f"{node.name}__fusing", infos=[info], origin=origin)
    graph.replace_all_uses(output, temp.outputs[0])
    for other in reversed(absorbed):
        graph.remove_node(other)
    graph.remove_node(node)
    new = graph.add_node(node.op, inputs, [output], node.attrs, name=node.name, infos=[info],
                         origin=origin)
    if new.name != node.name:
        log.warning("node '%s' was rebuilt as '%s' (name taken by a value)", node.name, new.name)
    new.meta = meta
    new.fused = dataclasses.replace(fused) if fused is not None else None
    graph.replace_all_uses(temp.outputs[0], output)
    graph.remove_node(temp)
    return new


def drop_if_unread(graph: Graph, nodes: Iterable[Node]) -> list[Node]:
    """Remove the nodes (DequantizeLinear of constants or of a residual) nobody reads now."""
    dropped = []
    for other in nodes:
        if graph.has_node(other.name) and not any(graph.uses(o) for o in other.outputs):
            graph.remove_node(other)
            dropped.append(other)
    return dropped
