"""Shape rules of the arithmetic ops: elementwise math, activations, normalizations, Gemm,
MatMul, Softmax and Cast.

Element types: binary ops want equal types, except that an integer operand next to a float
one gives the float type (a dequantize written as Sub/Mul in the LPT style). Activations keep
x's type. Quantization parameters do not survive arithmetic, with one exception the brief
names: Relu keeps them (it is precision-preserving, as in LPT).

Compute ops (MatMul, Gemm; Conv in spatial.py) on integer inputs accumulate in int32 (ONNX's
MatMulInteger/ConvInteger). When their output already carries an integer type with
QuantParams (a pass fused a quantize into the op and typed its destination), that type is
kept.
"""

from __future__ import annotations

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import (
    AxisAttrs,
    CastAttrs,
    GemmAttrs,
    LayerNormAttrs,
    LrnAttrs,
    Op,
    ReduceAttrs,
)
from qfuse.ir.shapes._common import (
    Shape,
    broadcast,
    broadcast_to,
    fail,
    keep_quant,
    norm_axis,
    optional,
    required,
    result_dtype,
    same_info,
)
from qfuse.ir.types import DType, TensorInfo


def compute_output(graph: Graph, node: Node, x: TensorInfo, shape: Shape) -> TensorInfo:
    """Output info of a compute op (Conv, ConvTranspose, MatMul, Gemm) reading ``x``."""
    if not x.dtype.is_integer:
        return TensorInfo(tuple(shape), x.dtype)
    current = graph.values[node.outputs[0]].info
    if current is not None and current.dtype.is_integer:
        return TensorInfo(tuple(shape), current.dtype, current.quant)
    if current is not None and not current.dtype.is_integer:
        # A pass fused a dequantize (scales) into the op: it writes floats.
        return TensorInfo(tuple(shape), current.dtype)
    return TensorInfo(tuple(shape), DType.S32)


def elementwise_binary(graph: Graph, node: Node) -> list[TensorInfo]:
    infos = [required(graph, node, i) for i in range(len(node.inputs))]
    shape = broadcast(node, [i.shape for i in infos])
    return [TensorInfo(shape, result_dtype(node, [i.dtype for i in infos]))]


def unary(graph: Graph, node: Node) -> list[TensorInfo]:
    return [same_info(required(graph, node, 0))]


def preserving(graph: Graph, node: Node) -> list[TensorInfo]:
    """Identity, Dropout, Relu: x's shape, type and quantization."""
    return [required(graph, node, 0)]


def prelu(graph: Graph, node: Node) -> list[TensorInfo]:
    x = required(graph, node, 0)
    broadcast_to(node, required(graph, node, 1).shape, x.shape, "slope")
    return [same_info(x)]


def softmax(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: AxisAttrs = node.attrs
    x = required(graph, node, 0)
    norm_axis(node, attrs.axis, x.rank)
    return [same_info(x)]


def layer_norm(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: LayerNormAttrs = node.attrs
    x = required(graph, node, 0)
    axis = norm_axis(node, attrs.axis, x.rank)
    normalized = x.shape[axis:]
    broadcast_to(node, required(graph, node, 1).shape, normalized, "scale")
    bias = optional(graph, node, 2)
    if bias is not None:
        broadcast_to(node, bias.shape, normalized, "bias")
    return [same_info(x)]


def reduce(graph: Graph, node: Node) -> list[TensorInfo]:
    """Reduce*: the reduced axes become 1 (keepdims) or disappear; x's element type.
    ReduceMax / ReduceMin of quantized values pick one of them: a per-tensor quantization is
    kept (a per-axis one is dropped, which declines passes/propagate_dequantize)."""
    attrs: ReduceAttrs = node.attrs
    x = required(graph, node, 0)
    axes = set(attrs.axes)
    if not axes or any(not 0 <= a < x.rank for a in axes) or len(axes) != len(attrs.axes):
        raise fail(node, f"axes {attrs.axes} are not distinct axes of rank {x.rank}")
    if attrs.keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if node.op in (Op.REDUCE_MAX, Op.REDUCE_MIN) and x.dtype.is_integer:
        return [keep_quant(x, shape, None)]
    return [same_info(x, shape)]


def lrn(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: LrnAttrs = node.attrs
    x = required(graph, node, 0)
    if x.rank < 3 or attrs.size < 1:
        raise fail(node, f"LRN wants x of rank >= 3 and size >= 1, got shape {x.shape} and "
                         f"size {attrs.size}")
    return [same_info(x)]


def batch_norm(graph: Graph, node: Node) -> list[TensorInfo]:
    x = required(graph, node, 0)
    if x.rank < 2:
        raise fail(node, f"input of rank {x.rank} has no channel axis")
    channels = x.shape[1]
    for port, what in enumerate(("scale", "bias", "mean", "var"), 1):
        shape = required(graph, node, port).shape
        if shape != (channels,):
            raise fail(node, f"{what} has shape {shape}, want ({channels},)")
    return [same_info(x)]


def gemm(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: GemmAttrs = node.attrs
    a, b = required(graph, node, 0), required(graph, node, 1)
    if a.rank != 2 or b.rank != 2:
        raise fail(node, f"Gemm wants 2-D A and B, got shapes {a.shape} and {b.shape}")
    m, k = reversed(a.shape) if attrs.trans_a else a.shape
    k2, n = reversed(b.shape) if attrs.trans_b else b.shape
    if k != k2:
        raise fail(node, f"inner dims differ: A{a.shape} (trans_a={attrs.trans_a}) and "
                         f"B{b.shape} (trans_b={attrs.trans_b})")
    c = optional(graph, node, 2)
    if c is not None:
        broadcast_to(node, c.shape, (m, n), "C")
    return [compute_output(graph, node, a, (m, n))]


def matmul(graph: Graph, node: Node) -> list[TensorInfo]:
    """numpy.matmul shapes: 1-D operands get a dim prepended/appended then removed."""
    a, b = required(graph, node, 0), required(graph, node, 1)
    if a.rank == 0 or b.rank == 0:
        raise fail(node, "MatMul operands must have rank >= 1")
    sa = (1, *a.shape) if a.rank == 1 else a.shape
    sb = (*b.shape, 1) if b.rank == 1 else b.shape
    if sa[-1] != sb[-2]:
        raise fail(node, f"inner dims differ: {a.shape} @ {b.shape}")
    batch = broadcast(node, [sa[:-2], sb[:-2]])
    shape = (*batch, sa[-2], sb[-1])
    if a.rank == 1:
        shape = shape[:-2] + shape[-1:]
    if b.rank == 1:
        shape = shape[:-1]
    if a.dtype.is_integer != b.dtype.is_integer:
        raise fail(node, f"operands mix {a.dtype.name.lower()} and {b.dtype.name.lower()}")
    return [compute_output(graph, node, a, shape)]


def where(graph: Graph, node: Node) -> list[TensorInfo]:
    """Where(condition, x, y): the three shapes broadcast, x's element type (y's the same)."""
    cond, x, y = (required(graph, node, i) for i in range(3))
    if cond.dtype is not DType.BOOL:
        raise fail(node, f"the condition is {cond.dtype.name.lower()}, not bool")
    if x.dtype is not y.dtype:
        raise fail(node, f"x is {x.dtype.name.lower()} and y {y.dtype.name.lower()}")
    return [TensorInfo(broadcast(node, [cond.shape, x.shape, y.shape]), x.dtype)]


def gather(graph: Graph, node: Node) -> list[TensorInfo]:
    """Gather(data, indices) along ``axis``: data's dims with the axis replaced by the indices'
    (ONNX's rule), data's element type; the indices are integers."""
    attrs: AxisAttrs = node.attrs
    data, indices = required(graph, node, 0), required(graph, node, 1)
    axis = norm_axis(node, attrs.axis, data.rank)
    if indices.dtype not in (DType.S32, DType.S64):
        raise fail(node, f"indices are {indices.dtype.name.lower()}, not int32 / int64")
    return [TensorInfo((*data.shape[:axis], *indices.shape, *data.shape[axis + 1:]),
                       data.dtype)]


def logic(graph: Graph, node: Node) -> list[TensorInfo]:
    """A comparison or logical op: the operands' broadcast shape, bool."""
    infos = [required(graph, node, i) for i in range(len(node.inputs))]
    return [TensorInfo(broadcast(node, [i.shape for i in infos]), DType.BOOL)]


def cast(graph: Graph, node: Node) -> list[TensorInfo]:
    attrs: CastAttrs = node.attrs
    return [TensorInfo(required(graph, node, 0).shape, attrs.to)]
