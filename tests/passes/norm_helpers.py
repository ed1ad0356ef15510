"""Tiny graphs of Softmax / LayerNormalization between a DequantizeLinear and a quantize-only
FakeQuantize, as the passes leave them before fuse_quantized_norm (shared by the pass and the
lowering tests)."""

from __future__ import annotations

import numpy as np

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import AxisAttrs, LayerNormAttrs
from tests.passes.fusion_helpers import add, const, dq, fq

F32 = np.float32


def norm_graph(op: Op, *, shape: tuple[int, ...] = (2, 8, 64), src: DType = DType.U8,
               src_scale: float = 0.05, src_zp: int = 130, dst: DType = DType.U8,
               dst_scale: float = 0.03, dst_zp: int = 128, axis: int = -1,
               seed: int = 0, bias: bool = True, epsilon: float = 1e-5) -> Graph:
    """x → [DequantizeLinear] → op → [quantize-only FakeQuantize] → "y".

    ``src``/``dst`` F32 leave out the DequantizeLinear / the FakeQuantize."""
    rng = np.random.default_rng(seed)
    graph = Graph("norm")
    quant = QuantParams.make(src_scale, src_zp) if src.is_quantized else None
    graph.add_input("x", TensorInfo(shape, src, quant))
    x = dq(graph, "x", "x_dq", src_scale, src_zp).outputs[0] if src.is_quantized else "x"
    axis = axis % len(shape)
    out = "n" if dst.is_quantized else "y"
    if op is Op.SOFTMAX:
        add(graph, op, [x], out, AxisAttrs(axis))
    else:
        inner = shape[axis:]
        gamma = const(graph, "gamma", rng.uniform(0.5, 1.5, inner))
        beta = [const(graph, "beta", rng.uniform(-0.5, 0.5, inner))] if bias else []
        add(graph, op, [x, gamma, *beta], out, LayerNormAttrs(axis, epsilon))
    if dst.is_quantized:
        fq(graph, out, "y", dst_scale, dst_zp, dst)
    graph.outputs.append("y")
    return graph


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Integer inputs over their whole range; float inputs standard normal × 3."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        info = graph.info(name)
        if info.dtype.is_integer:
            lo, hi = info.dtype.range
            feeds[name] = rng.integers(lo, hi + 1, info.shape).astype(info.dtype.np)
        else:
            feeds[name] = (rng.standard_normal(info.shape) * 3).astype(F32)
    return feeds
