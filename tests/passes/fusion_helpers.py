"""Tiny hand-built graphs for the fusion pass tests: int8 compute nodes carrying ``Fused``
(as move_dequantize leaves them), quantize-only FakeQuantize, DequantizeLinear, and a
reference run that evaluates fused nodes with runtime/reference/fused.py.

LSB comparison: integer outputs are compared as integers (``step_diff``: share of identical
elements and the largest difference in quantization steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qfuse.ir import DType, Graph, Node, Op, QuantParams, TensorInfo
from qfuse.ir.chain import Fused, Scale, Shift
from qfuse.ir.ops import ConvAttrs
from qfuse.runtime.reference import evaluate
from tests.passes.quant_helpers import add, const
from tests.passes.quant_helpers import apply as run
from tests.passes.quant_helpers import feeds as feeds_for
from tests.passes.quant_helpers import quantize_only as fq

__all__ = ["add", "const", "feeds_for", "fq", "run"]

F32 = np.float32
RNG = np.random.default_rng(7)
C_IN, C = 4, 6
SHAPE = (1, C, 5, 5)  # the output of int8_conv on new_graph()
HW = 5
S_X, ZP_X = 0.05, 3


def new_graph(x_dtype: DType = DType.U8, shape: tuple[int, ...] = (1, C_IN, HW, HW)) -> Graph:
    graph = Graph("t")
    quant = QuantParams.make(S_X, ZP_X) if x_dtype.is_quantized else None
    graph.add_input("x", TensorInfo(shape, x_dtype, quant))
    return graph


def int8_conv(graph: Graph, src: str = "x", out: str = "conv", bias: bool = True,
              channels: int = C) -> Node:
    """A 3x3 int8 conv (pad 1) reading ``src`` (u8, zero point ZP_X) as move_dequantize
    leaves it: s8 weights, chain [Scale(s_x·s_w), Shift(bias)]."""
    c_in = graph.info(src).shape[1]
    w = RNG.integers(-60, 60, (channels, c_in, 3, 3)).astype(np.int8)
    s_w = np.linspace(0.004, 0.009, channels).astype(F32)
    attrs = ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    shape = (graph.info(src).shape[0], channels, *graph.info(src).shape[2:])
    node = add(graph, Op.CONV, [src, const(graph, f"{out}_w", w, np.int8)], out, attrs,
               TensorInfo(shape, DType.F32))
    chain: list[Any] = [Scale.of(F32(S_X) * s_w)]
    if bias:
        chain.append(Shift.of(np.linspace(-0.5, 0.5, channels)))
    node.fused = Fused(chain=chain, src_zero_point=ZP_X, absorbed=[out])
    return node


def int8_matmul(graph: Graph, src: str = "x", out: str = "mm", n: int = C) -> Node:
    k = graph.info(src).shape[-1]
    w = RNG.integers(-60, 60, (k, n)).astype(np.int8)
    s_w = np.linspace(0.004, 0.009, n).astype(F32)
    shape = (*graph.info(src).shape[:-1], n)
    node = add(graph, Op.MATMUL, [src, const(graph, f"{out}_w", w, np.int8)], out,
               info=TensorInfo(shape, DType.F32))
    node.fused = Fused(chain=[Scale.of(F32(S_X) * s_w)], src_zero_point=ZP_X, absorbed=[out])
    return node


def dq(graph: Graph, src: str, out: str, scale: float | None = None,
       zp: int | None = None) -> Node:
    q = graph.info(src).quant
    scale = q.scale[0] if scale is None and q is not None else scale
    zp = q.zero_point[0] if zp is None and q is not None else zp
    dtype = graph.info(src).dtype.np
    ins = [src, const(graph, f"{out}_s", scale), const(graph, f"{out}_zp", zp, dtype)]
    return add(graph, Op.DEQUANTIZE_LINEAR, ins, out)


def residual_input(graph: Graph, name: str = "r", scale: float = 0.03, zp: int = 7,
                   dtype: DType = DType.U8) -> str:
    graph.add_input(name, TensorInfo(SHAPE, dtype, QuantParams.make(scale, zp)))
    return dq(graph, name, f"{name}_dq").outputs[0]


def residual_block(relu: bool = False, via_qdq: bool = True) -> Graph:
    graph = new_graph()
    r = residual_input(graph)
    int8_conv(graph)
    x = "conv"
    if via_qdq:
        fq(graph, x, "q1", 0.04, 100)
        x = dq(graph, "q1", "d1").outputs[0]
    if relu:
        x = add(graph, Op.RELU, [x], "relu").outputs[0]
    add(graph, Op.ADD, [x, r], "sum")
    fq(graph, "sum", "y", 0.05, 0)
    graph.outputs.append("y")
    return graph


def reference(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs (fused nodes evaluate their chains)."""
    return evaluate(graph, feeds)


def reference_composed(graph: Graph, feeds: dict[str, np.ndarray], *,
                       keep: bool = False) -> dict[str, np.ndarray]:
    """Like ``reference``, but fused nodes evaluate ``node.meta["composed"]`` (what oneDNN is
    asked to compute, runtime/reference/chain.py ``apply_composed``) instead of their chain."""
    return evaluate(graph, feeds, keep=keep, composed=True)
