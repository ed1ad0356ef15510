"""Helpers the shape rules share: errors that name the node, broadcasting, axis handling and
the bookkeeping of quantization parameters through precision-preserving ops.

Broadcasting is numpy's (ONNX "multidirectional"): shapes are right-aligned and each pair of
dims must be equal or contain a 1. "Unidirectional" broadcasting (PRelu slope, Gemm's C, the
FakeQuantize ranges) additionally requires the result to be the target shape itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from qfuse.ir.graph import Graph, GraphError, Node
from qfuse.ir.types import DType, QuantParams, TensorInfo

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]


def fail(node: Node, message: str) -> GraphError:
    """A GraphError whose message starts with the node's name and op."""
    return GraphError(f"node {node}: {message}")


def optional(graph: Graph, node: Node, port: int) -> TensorInfo | None:
    """Info of input ``port``, or None when the input is absent (missing or "")."""
    if port >= len(node.inputs) or not node.inputs[port]:
        return None
    name = node.inputs[port]
    if name not in graph.values:
        raise fail(node, f"input {port} '{name}' is not a value")
    info = graph.values[name].info
    if info is None:
        raise fail(node, f"input {port} '{name}' has no shape yet")
    return info


def required(graph: Graph, node: Node, port: int) -> TensorInfo:
    info = optional(graph, node, port)
    if info is None:
        raise fail(node, f"required input {port} is missing")
    return info


def norm_axis(node: Node, axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in [-rank, rank) made non-negative."""
    if not -rank <= axis < rank:
        raise fail(node, f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def broadcast(node: Node, shapes: Sequence[Shape]) -> Shape:
    """Numpy (multidirectional) broadcast of ``shapes``."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            text = " and ".join(str(tuple(s)) for s in shapes)
            raise fail(node, f"shapes {text} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_to(node: Node, shape: Shape, target: Shape, what: str) -> None:
    """Check that ``shape`` broadcasts unidirectionally to ``target``."""
    if len(shape) > len(target) or any(
        d not in (1, t) for d, t in zip(reversed(shape), reversed(target))
    ):
        raise fail(node, f"{what} of shape {tuple(shape)} does not broadcast to {tuple(target)}")


def result_dtype(node: Node, dtypes: Sequence[DType]) -> DType:
    """Element type of an arithmetic op: all equal, or the float type when ints mix with it."""
    unique = list(dict.fromkeys(dtypes))
    if len(unique) == 1:
        return unique[0]
    floats = [d for d in unique if not d.is_integer and d is not DType.BOOL]
    if len(floats) == 1:
        return floats[0]
    names = ", ".join(d.name.lower() for d in unique)
    raise fail(node, f"inputs mix element types {names}")


def same_info(x: TensorInfo, shape: Shape | None = None) -> TensorInfo:
    """x's element type on ``shape`` (default x's), without quantization parameters."""
    return TensorInfo(tuple(x.shape if shape is None else shape), x.dtype, None)


# ---------------------------------------------------------------- quantization tracking


def single_channel(quant: QuantParams) -> QuantParams:
    """A per-axis quantization with one channel is a per-tensor one."""
    return QuantParams(quant.scale, quant.zero_point, None)


def move_axis(quant: QuantParams | None, axis: int | None) -> QuantParams | None:
    """``quant`` with its channel axis moved to ``axis`` (None: it could not be tracked)."""
    if quant is None or quant.axis is None:
        return quant
    if axis is None:
        return None
    return QuantParams(quant.scale, quant.zero_point, axis)


def take_channels(quant: QuantParams, indices: Sequence[int]) -> QuantParams:
    """Per-axis ``quant`` restricted to the channels ``indices`` (Slice, Split)."""
    scale = tuple(quant.scale[i] for i in indices)
    zero_point = tuple(quant.zero_point[i] for i in indices)
    if len(scale) == 1:
        return QuantParams(scale, zero_point, None)
    return QuantParams(scale, zero_point, quant.axis)


def reshape_axis(src: Shape, dst: Shape, axis: int) -> int | None:
    """Where dim ``axis`` of ``src`` lands in ``dst`` after a row-major reshape, if it stays a
    whole dim: the unique j with prod(dst[:j]) == prod(src[:axis]) and dst[j] == src[axis]."""
    before = 1
    for d in src[:axis]:
        before *= d
    acc = 1
    for j, d in enumerate(dst):
        if acc == before and d == src[axis]:
            return j
        acc *= d
        if acc > before:
            return None
    return None


def keep_quant(x: TensorInfo, shape: Shape, axis: int | None = -1) -> TensorInfo:
    """x's type and quantization on a new shape; per-axis quantization moves to ``axis``
    (-1: it stays where it is, None: it is dropped)."""
    quant = x.quant
    if quant is not None and quant.axis is not None and axis != -1:
        quant = move_axis(quant, axis)
    return TensorInfo(tuple(shape), x.dtype, quant)
