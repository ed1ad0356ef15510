"""A compute node's output channels repeated: its per-channel values, each repeated alike.

Two rewrites make a convolution write more output channels than the node it replaces, each
new channel the same sums and the same chain as one of the node's own: a ConvTranspose as a
1x1 Conv of b²·O channels (passes/deconv_as_depth_to_space.py) and a squeeze-excitation
gate's Conv writing its C values k times (passes/widen_gate.py). Channel ``r·C + c`` repeats
channel c, so every per-channel value — of the fused chain (``Scale`` / ``Shift`` / ``PRelu``),
of the composed attributes (weight scales, bias, binary and PReLU operands, in both the
dividing and the multiplying form) and of the basic operations the unfused mode runs — is
the node's own tiled ``reps`` times; a single value stays one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from qfuse.ir import Graph, Node, TensorInfo
from qfuse.ir.chain import (
    ChainOp,
    Fused,
    PRelu,
    Quantize,
    Residual,
    Scale,
    Shift,
    TensorOperand,
)
from qfuse.ir.postops import Add, Binary, Clip, Composed, Div, Mul, Prelu
from qfuse.ir.types import QuantParams


def repeatable(chain: list[ChainOp]) -> bool:
    """Can the chain's values be repeated per channel: it reads no tensor (a residual sum or
    a binary operand of the output's shape would need laying out anew) and quantizes per
    tensor."""
    return not any(isinstance(op, (Residual, TensorOperand)) or (isinstance(op, Quantize) and (
        len(op.input_low) > 1 or len(op.output_low) > 1
        or (op.onnx is not None and not op.onnx.quant.per_tensor))) for op in chain)


def tiled(values: tuple, reps: int) -> tuple:
    """Per-channel values (more than one) repeated ``reps`` times; one value kept."""
    return values * reps if len(values) > 1 else values


def tiled_array(values: np.ndarray, reps: int) -> np.ndarray:
    """The composer's per-channel values (1-D, ``(C,)``) repeated; one value kept."""
    return np.tile(values, reps) if values.size > 1 else values


def tiled_quant(quant: QuantParams | None, reps: int, axis: int) -> QuantParams | None:
    """A weight quantization per output channel (along ``axis``) repeated; others kept."""
    if quant is None or quant.per_tensor:
        return quant
    return QuantParams(tiled(quant.scale, reps), tiled(quant.zero_point, reps), axis)


def tiled_chain_op(op: ChainOp, reps: int) -> ChainOp:
    if isinstance(op, (Scale, Shift)):
        return dataclasses.replace(op, values=tiled(op.values, reps))
    if isinstance(op, PRelu):
        return dataclasses.replace(op, slopes=tiled(op.slopes, reps))
    return op  # activations, per-tensor quantizes


def tiled_post_op(op: Any, reps: int) -> Any:
    """A composed post-op or a basic operation (what the unfused mode runs), repeated."""
    if isinstance(op, (Binary, Mul, Div, Add)):
        return dataclasses.replace(op, values=tiled_array(op.values, reps))
    if isinstance(op, Prelu):
        return dataclasses.replace(op, slopes=tiled_array(op.slopes, reps))
    if isinstance(op, Clip):
        return dataclasses.replace(op, lo=tiled_array(op.lo, reps), hi=tiled_array(op.hi, reps))
    return op  # eltwise, round


def tiled_composed(composed: Composed, reps: int) -> Composed:
    return dataclasses.replace(
        composed, channels=reps * composed.channels,
        wei_scales=tiled_array(composed.wei_scales, reps),
        bias=None if composed.bias is None else np.tile(composed.bias, reps),
        post_ops=[tiled_post_op(op, reps) for op in composed.post_ops])


def tiled_meta(meta: dict[str, Any], reps: int) -> dict[str, Any]:
    """The node's composed attributes (compose_post_ops) for its channels repeated."""
    meta = dict(meta)
    for key in ("composed", "composed_multiply"):
        if isinstance(meta.get(key), Composed):
            meta[key] = tiled_composed(meta[key], reps)
    if "basic" in meta:
        meta["basic"] = [tiled_post_op(op, reps) for op in meta["basic"]]
    return meta


def repeated_state(node: Node, reps: int, note: str) -> tuple[Fused | None, dict[str, Any]]:
    """``node``'s fused chain (``note`` added to its notes) and composed attributes for its
    output channels repeated ``reps`` times."""
    fused = node.fused
    if fused is not None:
        fused = dataclasses.replace(fused, chain=[tiled_chain_op(op, reps) for op in fused.chain],
                                    notes=[*fused.notes, note])
    return fused, tiled_meta(node.meta, reps)


def repeated_bias(graph: Graph, node: Node, reps: int, suffix: str) -> list[str]:
    """``[a new constant: node's bias (input 2) repeated reps times]``, or [] without one."""
    if len(node.inputs) < 3 or not node.inputs[2]:
        return []
    name = node.inputs[2]
    bias = graph.constant(name)
    assert bias is not None
    return [graph.add_constant(graph.unique_name(f"{name}{suffix}"), np.tile(bias, reps),
                               TensorInfo((reps * bias.size,), graph.info(name).dtype)).name]
