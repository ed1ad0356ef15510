"""Reference semantics of a node that carries ``Fused`` (ir/chain.py): int8 compute nodes
(Conv, ConvTranspose, MatMul) and int8 average pooling.

    acc = op(src - src_zero_point, wei - wei_zero_point)
    out = apply_chain(acc, chain, residuals, channel_axis, dst_dtype = the output's type)

- Conv / ConvTranspose / MatMul on integers (the src zero point a constant, or a run-time
  scalar input with dynamic quantization): the zero points are subtracted in int64 *before*
  the op, so a padding tap of a convolution contributes 0 (oneDNN: "padding taps contribute
  0"); the op then accumulates exactly (int64, returned as int32 — no overflow for int8
  operands up to 2^31 / 2^14 = 131072 products per output). On float operands the op runs in
  the float reference (zero points must then be 0).
- AveragePool / GlobalAveragePool: acc = avg(src - zp) in float64, rounded once to float32
  (the window sum of integers is exact; the division is not). Padding taps are 0 in the
  shifted domain, i.e. the real value 0; ``count_include_pad`` counts them, as the float op
  does, and ceil_mode's extra end taps are never counted (ops_nn.py).
- Softmax / LayerNormalization (passes/fuse_quantized_norm.py): ``acc = op(x, γ, β)`` with
  ``x = f32(src - src_zero_point)·src_scale`` (the DequantizeLinear it absorbed) when
  ``src_scale`` is set, else ``x = src``; the op is its plain reference (ONNX Runtime's float32
  kernels), and the chain (empty, or one Quantize) follows.
- An activation carrying a gate chain (passes/fuse_post_ops.py ``_fuse_gate``): acc = its
  float32 source, or ``f32(src - src_zero_point)·src_scale`` when ``src_scale`` is set (it
  reads the 8-bit tensor its DequantizeLinear read); the chain starts with the op itself.
- channel axis of the chain: 1, except MatMul: the last dim.
- ``residuals``: every chain ``Residual`` item reads the node's input ``port``.

The interpreter should call ``evaluate_fused(node, inputs, graph)`` for every node whose
``fused`` is set, in place of the op's plain implementation.
"""

from __future__ import annotations

import copy

import numpy as np

from qfuse.ir.chain import Residual, TensorOperand
from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.runtime.reference.chain import apply_chain, apply_composed
from qfuse.runtime.reference.registry import IMPLS

F32 = np.float32
COMPUTE = (Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL)
POOLING = (Op.AVG_POOL, Op.GLOBAL_AVG_POOL)
NORMS = (Op.SOFTMAX, Op.LAYER_NORM)


def channel_axis(node: Node, rank: int) -> int:
    """Where the chain's per-channel values apply: the last dim for MatMul, else dim 1."""
    return rank - 1 if node.op is Op.MATMUL else 1


def _shifted(x: np.ndarray, zero_point: int, what: str) -> np.ndarray:
    if x.dtype.kind in "iu":
        return x.astype(np.int64) - np.int64(zero_point)
    if zero_point:
        raise ValueError(f"{what} zero point {zero_point} on a float {what}")
    return x


def _dequantized(src: np.ndarray, zero_point: int, scale: float) -> np.ndarray:
    """``f32(src - zero_point)·scale``: the DequantizeLinear a fused node absorbed."""
    return (src.astype(np.int64) - np.int64(zero_point)).astype(F32) * F32(scale)


def src_zero_point(node: Node, inputs: list[np.ndarray | None]) -> int:
    """The src zero point: ``fused.src_zero_point``, or the run-time scalar at
    ``fused.src_zero_point_port`` (dynamic quantization)."""
    fused = node.fused
    assert fused is not None
    if fused.src_zero_point_port is None:
        return fused.src_zero_point
    zp = inputs[fused.src_zero_point_port]
    if zp is None or zp.size != 1:
        raise ValueError("the run-time src zero point is missing or not a scalar")
    return int(zp.reshape(-1)[0])


def accumulate(node: Node, inputs: list[np.ndarray | None]) -> np.ndarray:
    """``op(src - zp_src, wei - zp_wei)`` of a fused node, before its chain."""
    fused = node.fused
    assert fused is not None
    plain = copy.copy(node)
    plain.fused = None
    src = inputs[0]
    if src is None:
        raise ValueError("the source input is missing")
    if node.op in COMPUTE:
        wei = inputs[1]
        if wei is None:
            raise ValueError("the weights input is missing")
        x = _shifted(src, src_zero_point(node, inputs), "source")
        w = _shifted(wei, fused.wei_zero_point, "weights")
        if x.dtype.kind == "f" or w.dtype.kind == "f":
            x, w = x.astype(F32), w.astype(F32)
        # Inputs after the weights are the chain's residuals (the bias lives in the chain).
        return IMPLS[node.op](plain, [x, w])[0]
    if node.op in POOLING:
        shifted = _shifted(src, fused.src_zero_point, "source").astype(F32)
        return IMPLS[node.op](plain, [shifted])[0]
    if node.op in NORMS:
        x = src if fused.src_scale is None else _dequantized(src, fused.src_zero_point,
                                                              fused.src_scale)
        return IMPLS[node.op](plain, [x, *inputs[1:]])[0]
    if node.op is Op.RESIZE:  # nearest, with its dequantize (passes/fold_resize_dequantize)
        return IMPLS[node.op](plain, [_shifted(src, fused.src_zero_point, "source").astype(F32),
                                      *inputs[1:]])[0]
    if fused.src_scale is not None and src.dtype.kind in "iu":  # a gate chain's int8 source
        return _dequantized(src, fused.src_zero_point, fused.src_scale)
    if src.dtype.kind == "f":  # an activation carrying a gate chain: the chain starts at x
        return src.astype(F32)
    raise ValueError(f"no fused reference for {node.op.value}")


def evaluate_fused(
    node: Node, inputs: list[np.ndarray | None], graph: Graph, *, composed: bool = False
) -> list[np.ndarray]:
    """The output of fused ``node`` on its input arrays (in port order).

    ``composed``: evaluate the oneDNN attributes the composer chose (``node.meta["composed"]``,
    set by the compose_post_ops pass) the way oneDNN computes them, instead of the chain's
    meaning — what the lowering must match bit for bit.
    """
    fused = node.fused
    assert fused is not None, f"node {node} is not fused"
    acc = accumulate(node, inputs)
    residuals: dict[int, np.ndarray] = {}
    for item in fused.chain:
        if isinstance(item, Residual | TensorOperand):
            r = inputs[item.port] if item.port < len(inputs) else None
            if r is None:
                raise ValueError(f"residual input {item.port} is missing")
            residuals[item.port] = r
    axis = channel_axis(node, acc.ndim)
    if composed and "composed" in node.meta:
        return [apply_composed(acc, node.meta["composed"], residuals, channel_axis=axis)]
    dst = graph.info(node.outputs[0]).dtype
    return [apply_chain(acc, fused.chain, residuals, channel_axis=axis, dst_dtype=dst)]
