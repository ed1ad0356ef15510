"""Recognising the quantized patterns of an imported QDQ graph, rooted at a QuantizeLinear.

A pattern is what one int8 kernel of another framework computes in a single step (ONNX
Runtime's QDQ fusions, TFLite's quantized ops); the emulator replaces the float
``DequantizeLinear -> op -> QuantizeLinear`` path by that kernel's integer arithmetic:

    compute  Q( [Relu|Clip]( Conv|ConvTranspose|MatMul|Gemm( DQ(x_q), DQ(w_q) [, DQ(b_i32)] )))
    add      Q( [Relu|Clip]( Add( DQ(a_q), DQ(b_q) )))
    avgpool  Q( AveragePool( DQ(x_q) ))           global_avgpool  Q( GlobalAveragePool( DQ(x_q) ))
    leaky    Q( LeakyRelu( DQ(x_q) ))             prelu           Q( PRelu( DQ(x_q), DQ(alpha_q) ))

``match(graph, q)`` returns a ``Match`` or a ``Decline`` that says why the Q is not the root of
one (as a pass records why it does not fuse). ``quantize_match(graph, q)`` is the fallback: the
Q alone, quantizing the float path's value, for frameworks whose quantizer differs from ONNX's. The checks here are structural: every operand is
the output of a DequantizeLinear of an integer tensor with constant scale and zero point, and
the output quantization is per tensor. Whether a framework has an integer form for the match,
and under which preconditions (per-tensor inputs, bias scale = s_x·s_w, ...), is the business
of its kernel (runtime/emulate/table.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.ir.types import DType

__all__ = ["Decline", "Match", "Operand", "OutQuant", "Pattern", "match", "quantize_match"]


class Pattern(enum.Enum):
    COMPUTE = "compute"
    ADD = "add"
    AVGPOOL = "avgpool"
    GLOBAL_AVGPOOL = "global_avgpool"
    LEAKY_RELU = "leaky_relu"
    PRELU = "prelu"
    QUANTIZE = "quantize"  # a Q of a float value no other pattern produces (see quantize_match)


_PATTERN_OF: dict[Op, Pattern] = {
    Op.CONV: Pattern.COMPUTE,
    Op.CONV_TRANSPOSE: Pattern.COMPUTE,
    Op.MATMUL: Pattern.COMPUTE,
    Op.GEMM: Pattern.COMPUTE,
    Op.ADD: Pattern.ADD,
    Op.AVG_POOL: Pattern.AVGPOOL,
    Op.GLOBAL_AVG_POOL: Pattern.GLOBAL_AVGPOOL,
    Op.LEAKY_RELU: Pattern.LEAKY_RELU,
    Op.PRELU: Pattern.PRELU,
}
# Patterns that may have a Relu / Clip between the op and the Q (applied as an integer clamp).
_WITH_ACTIVATION = frozenset({Pattern.COMPUTE, Pattern.ADD})


@dataclass(frozen=True)
class Decline:
    """Why a QuantizeLinear is not the root of a pattern."""

    reason: str


@dataclass(frozen=True, eq=False)
class Operand:
    """A dequantized operand ``(value - zero_point) * scale``: ``value`` names the integer tensor.

    ``scale`` is float32 and ``zero_point`` int64, both 0-D (per tensor) or 1-D along ``axis``.
    ``data`` is the integer constant when the operand is an initializer (weights, biases).
    """

    value: str
    dequantize: Node
    dtype: DType
    shape: tuple[int, ...]
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None
    data: np.ndarray | None

    @property
    def per_tensor(self) -> bool:
        return self.axis is None

    @property
    def s(self) -> np.float32:
        """The per-tensor scale (only for per-tensor operands)."""
        return np.float32(self.scale.reshape(-1)[0])

    @property
    def zp(self) -> int:
        """The per-tensor zero point (only for per-tensor operands)."""
        return int(self.zero_point.reshape(-1)[0])


@dataclass(frozen=True)
class OutQuant:
    """The root QuantizeLinear's output: per-tensor scale, zero point and integer type."""

    scale: np.float32
    zero_point: int
    dtype: DType

    @property
    def range(self) -> tuple[int, int]:
        return self.dtype.range


@dataclass(frozen=True, eq=False)
class Match:
    pattern: Pattern
    root: Node
    op: Node
    activation: Node | None
    operands: tuple[Operand, ...]
    bias: Operand | None
    out: OutQuant

    @property
    def tensor(self) -> str:
        """The quantized tensor the match computes (the Q's output, an ONNX name)."""
        return self.root.outputs[0]

    @property
    def absorbed(self) -> tuple[Node, ...]:
        """The nodes the integer kernel stands for, besides the root Q."""
        if self.pattern is Pattern.QUANTIZE:
            return ()
        nodes = [self.op] + ([self.activation] if self.activation is not None else [])
        nodes += [o.dequantize for o in self.operands]
        if self.bias is not None:
            nodes.append(self.bias.dequantize)
        return tuple(nodes)


def operand(graph: Graph, value: str) -> Operand | Decline:
    """The DequantizeLinear producing ``value``, read as an Operand."""
    node = graph.producer(value)
    if node is None or node.op is not Op.DEQUANTIZE_LINEAR:
        what = "a graph input or constant" if node is None else f"produced by {node}"
        return Decline(f"'{value}' is {what}, not a DequantizeLinear output")
    q_value = node.inputs[0]
    dtype = graph.info(q_value).dtype
    if not dtype.is_integer:
        return Decline(f"DequantizeLinear {node} reads {dtype.name}, not an integer tensor")
    scale = graph.constant(node.inputs[1])
    zp_name = node.inputs[2] if len(node.inputs) > 2 else ""
    zp = graph.constant(zp_name) if zp_name else np.zeros((), np.int64)
    if scale is None or zp is None:
        return Decline(f"DequantizeLinear {node} has a non-constant scale or zero point")
    axis = None
    if scale.size > 1:
        axis = node.attrs.axis % max(graph.info(q_value).rank, 1)
    shape = (-1,) if axis is not None else ()
    return Operand(
        value=q_value,
        dequantize=node,
        dtype=dtype,
        shape=graph.info(q_value).shape,
        scale=np.asarray(scale, np.float32).reshape(shape),
        zero_point=np.broadcast_to(np.asarray(zp, np.int64).reshape(-1), (scale.size,))
        .reshape(shape)
        .copy(),
        axis=axis,
        data=graph.constant(q_value),
    )


def _out_quant(graph: Graph, q: Node) -> OutQuant | Decline:
    if q.op is not Op.QUANTIZE_LINEAR:
        return Decline(f"{q} is not a QuantizeLinear")
    scale = graph.constant(q.inputs[1])
    zp_name = q.inputs[2] if len(q.inputs) > 2 else ""
    zp = graph.constant(zp_name) if zp_name else np.zeros((), np.int64)
    if scale is None or zp is None:
        return Decline(f"{q} has a non-constant scale or zero point")
    if scale.size != 1:
        return Decline(f"{q} quantizes per axis; the int8 kernels write per-tensor outputs")
    return OutQuant(np.float32(scale.reshape(())), int(np.asarray(zp).reshape(-1)[0]),
                    q.attrs.dtype)


def quantize_match(graph: Graph, q: Node) -> Match | Decline:
    """``q`` alone, quantizing the float value the float path computes (a graph input, or the
    output of an op without an integer pattern): a framework's own quantizer may round it
    differently from ONNX (oneDNN multiplies by ``1/s``, TFLite rounds half away)."""
    out = _out_quant(graph, q)
    if isinstance(out, Decline):
        return out
    return Match(Pattern.QUANTIZE, q, q, None, (), None, out)


def match(graph: Graph, q: Node) -> Match | Decline:
    """The pattern rooted at QuantizeLinear ``q``, or why there is none."""
    out = _out_quant(graph, q)
    if isinstance(out, Decline):
        return out

    op = graph.producer(q.inputs[0])
    if op is None:
        return Decline(f"{q} quantizes a graph input or a constant")
    activation = None
    if op.op in (Op.RELU, Op.CLIP):
        activation, op = op, graph.producer(op.inputs[0])
        if op is None:
            return Decline(f"{activation} reads a graph input or a constant")
    pattern = _PATTERN_OF.get(op.op)
    if pattern is None:
        return Decline(f"{op} has no integer pattern")
    if activation is not None and pattern not in _WITH_ACTIVATION:
        return Decline(f"{activation} follows {op}, which takes no fused activation")

    ports = {Pattern.COMPUTE: 2, Pattern.ADD: 2, Pattern.PRELU: 2}.get(pattern, 1)
    operands = []
    for value in op.inputs[:ports]:
        got = operand(graph, value)
        if isinstance(got, Decline):
            return Decline(f"input of {op}: {got.reason}")
        operands.append(got)
    bias = None
    if pattern is Pattern.COMPUTE and len(op.inputs) > 2 and op.inputs[2]:
        got = operand(graph, op.inputs[2])
        if isinstance(got, Decline):
            return Decline(f"bias of {op}: {got.reason}")
        bias = got
    return Match(pattern, q, op, activation, tuple(operands), bias, out)
