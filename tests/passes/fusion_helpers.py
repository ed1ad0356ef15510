"""Tiny hand-built graphs for the fusion pass tests: int8 compute nodes carrying ``Fused``
(as move_dequantize leaves them), quantize-only FakeQuantize, DequantizeLinear, and a
reference run that evaluates fused nodes with runtime/reference/fused.py.

LSB comparison: integer outputs are compared as integers (``lsb_stats``: share of identical
elements and the largest difference in quantization steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ir import DType, Graph, Node, Op, QuantParams, TensorInfo
from ir.chain import Fused, Scale, Shift
from ir.ops import ATTRS, ConvAttrs, FakeQuantizeAttrs
from ir.shapes import infer_node
from passes.base import PassContext, PassResult, run_pass
from runtime.reference import evaluate

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


def add(graph: Graph, op: Op, inputs: list[str], out: str, attrs: Any = None,
        info: TensorInfo | None = None) -> Node:
    """A node with one output, its info inferred unless given."""
    node = graph.add_node(op, inputs, [out], attrs if attrs is not None else ATTRS[op](),
                          name=out)
    graph.set_info(out, info if info is not None else infer_node(graph, node)[0])
    return node


def const(graph: Graph, name: str, data: object, dtype: object = F32) -> str:
    return graph.add_constant(name, np.asarray(data, dtype=dtype)).name


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


def fq(graph: Graph, src: str, out: str, scale: float, zp: int,
       dtype: DType = DType.U8) -> Node:
    """The quantize-only FakeQuantize a QuantizeLinear(scale, zp) becomes."""
    lo, hi = dtype.range
    il, ih = F32(scale) * F32(lo - zp), F32(scale) * F32(hi - zp)
    ins = [src] + [const(graph, f"{out}_{k}", v) for k, v in
                   (("il", il), ("ih", ih), ("ol", lo), ("oh", hi))]
    info = TensorInfo(graph.info(src).shape, dtype, QuantParams.make(scale, zp))
    return add(graph, Op.FAKE_QUANTIZE, ins, out, FakeQuantizeAttrs(256), info)


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


def feeds_for(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        info = graph.info(name)
        if info.dtype.is_integer:
            lo, hi = info.dtype.range
            out[name] = rng.integers(lo, hi + 1, info.shape).astype(info.dtype.np)
        else:
            out[name] = rng.standard_normal(info.shape).astype(info.dtype.np)
    return out


def reference(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs (fused nodes evaluate their chains)."""
    return evaluate(graph, feeds)


def run(module: Any, graph: Graph, ctx: PassContext | None = None) -> PassResult:
    """One pass on ``graph``; the graph is verified after it."""
    ctx = ctx or PassContext()
    result = run_pass(module.__name__, module.run, graph, ctx)
    graph.verify()
    return result


def lsb_stats(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """(share of identical elements, largest |a - b|) of two integer tensors."""
    assert a.shape == b.shape and a.dtype == b.dtype
    diff = np.abs(a.astype(np.int64) - b.astype(np.int64))
    return float(np.mean(diff == 0)), int(diff.max(initial=0))


def reference_composed(graph: Graph, feeds: dict[str, np.ndarray], *,
                       keep: bool = False) -> dict[str, np.ndarray]:
    """Like ``reference``, but fused nodes evaluate ``node.meta["composed"]`` (what oneDNN is
    asked to compute, runtime/reference/chain.py ``apply_composed``) instead of their chain."""
    return evaluate(graph, feeds, keep=keep, composed=True)
