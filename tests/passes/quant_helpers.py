"""Tiny hand-built graphs and numeric comparisons for the quantization pass tests.

``reference`` runs the numpy reference interpreter's op table, with nodes that carry
``Fused`` evaluated by runtime/reference/fused.py (the interpreter loop does not dispatch
them yet). Distances: ``lsb`` counts quantization steps between two float tensors that are
dequantized values (``round(|a - b| / scale)``), ``ulps`` float32 steps.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from qfuse.ir import DType, Graph, Node, Op, QuantParams, TensorInfo
from qfuse.ir.ops import ATTRS, DequantizeAttrs, FakeQuantizeAttrs, QuantizeAttrs
from qfuse.ir.shapes import infer_node
from qfuse.passes.base import PassContext, PassResult, run_pass
from qfuse.runtime.reference import evaluate
from qfuse.runtime.reference.interpreter import run_node

F32 = np.float32


def new_graph(shape: tuple[int, ...], dtype: DType = DType.F32, quant: Any = None,
              name: str = "x") -> Graph:
    graph = Graph("t")
    graph.add_input(name, TensorInfo(shape, dtype, quant))
    return graph


def const(graph: Graph, name: str, data: object, dtype: object = F32) -> str:
    return graph.add_constant(graph.unique_name(name), np.asarray(data, dtype=dtype)).name


def add(graph: Graph, op: Op, inputs: list[str], out: str, attrs: Any = None,
        info: TensorInfo | None = None) -> Node:
    """A one-output node named ``out``, its output info inferred unless given."""
    node = graph.add_node(op, inputs, [out], attrs if attrs is not None else ATTRS[op](),
                          name=out)
    graph.set_info(out, info if info is not None else infer_node(graph, node)[0])
    return node


def quantize(graph: Graph, x: str, out: str, scale: object, zp: object,
             dtype: DType = DType.U8, axis: int = 1) -> Node:
    ins = [x, const(graph, f"{out}_scale", scale), const(graph, f"{out}_zp", zp, dtype.np)]
    return add(graph, Op.QUANTIZE_LINEAR, ins, out, QuantizeAttrs(dtype, axis))


def dequantize(graph: Graph, q: str, out: str, scale: object, zp: object,
               axis: int = 1) -> Node:
    dtype = graph.info(q).dtype.np
    ins = [q, const(graph, f"{out}_scale", scale), const(graph, f"{out}_zp", zp, dtype)]
    return add(graph, Op.DEQUANTIZE_LINEAR, ins, out, DequantizeAttrs(axis))


def qdq(graph: Graph, x: str, out: str, scale: float, zp: int,
        dtype: DType = DType.U8) -> str:
    """x → QuantizeLinear → DequantizeLinear, the DQ's output named ``out``."""
    quantize(graph, x, f"{out}_q", scale, zp, dtype)
    return dequantize(graph, f"{out}_q", out, scale, zp).outputs[0]


def fake_quantize(graph: Graph, x: str, out: str, il: object, ih: object, ol: object,
                  oh: object, levels: int = 256) -> Node:
    ins = [x] + [const(graph, f"{out}_{k}", v) for k, v in
                 (("il", il), ("ih", ih), ("ol", ol), ("oh", oh))]
    return add(graph, Op.FAKE_QUANTIZE, ins, out, FakeQuantizeAttrs(levels))


def weights(graph: Graph, name: str, q: np.ndarray, scale: object, axis: int = 0) -> str:
    """A constant s8 tensor with DequantizeLinear (ONNX Runtime's weights); the DQ output."""
    scale = np.asarray(scale, dtype=F32)
    quant = QuantParams.make(scale if scale.size > 1 else scale.reshape(()),
                             np.zeros(scale.shape, np.int64), axis if scale.size > 1 else None)
    w = graph.add_constant(graph.unique_name(f"{name}_q"), q.astype(np.int8),
                           TensorInfo(tuple(q.shape), DType.S8, quant)).name
    zp = np.zeros(scale.shape, np.int8)
    ins = [w, const(graph, f"{name}_scale", scale), const(graph, f"{name}_zp", zp, np.int8)]
    return add(graph, Op.DEQUANTIZE_LINEAR, ins, name, DequantizeAttrs(axis)).outputs[0]


def finish(graph: Graph, *outputs: str) -> Graph:
    graph.outputs = list(outputs)
    graph.verify()
    return graph


def apply(module: ModuleType, graph: Graph, ctx: PassContext | None = None) -> PassResult:
    """Run one pass as the pipeline does; the graph must verify afterwards."""
    name = module.__name__.rsplit(".", 1)[-1]
    result = run_pass(name, module.run, graph, ctx or PassContext())
    graph.verify()
    return result


def reasons(result: PassResult) -> list[str]:
    return [d.reason for d in result.declined]


def ops(graph: Graph) -> list[str]:
    return [n.op.value for n in graph.topo_order()]


def feeds(graph: Graph, seed: int = 0, spread: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        info = graph.info(name)
        if info.dtype.is_integer:
            lo, hi = info.dtype.range
            out[name] = rng.integers(lo, hi + 1, info.shape).astype(info.dtype.np)
        else:
            out[name] = (rng.standard_normal(info.shape) * spread).astype(F32)
    return out


def reference(graph: Graph, inputs: dict[str, np.ndarray],
              keep: bool = False) -> dict[str, np.ndarray]:
    """The graph's outputs (every value if ``keep``); fused nodes evaluate their chains."""
    return evaluate(graph, inputs, keep=keep)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Float32 steps between a and b (0 = same bits; +0 and -0 are 0 apart)."""
    def line(x: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(x, dtype=F32).view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return np.abs(line(a) - line(b))


def quantize_only(graph: Graph, x: str, out: str, scale: float, zp: int,
                  dtype: DType = DType.U8) -> Node:
    """The quantize-only FakeQuantize a QuantizeLinear(scale, zp) becomes (OpenVINO fake_quantize.md)."""
    lo, hi = dtype.range
    il, ih = F32(scale) * F32(lo - zp), F32(scale) * F32(hi - zp)
    ins = [x] + [const(graph, f"{out}_{k}", v) for k, v in
                 (("il", il), ("ih", ih), ("ol", lo), ("oh", hi))]
    info = TensorInfo(graph.info(x).shape, dtype, QuantParams.make(scale, zp))
    return add(graph, Op.FAKE_QUANTIZE, ins, out, FakeQuantizeAttrs(256), info)


def int_input(shape: tuple[int, ...], scale: object, zp: object, dtype: DType = DType.U8,
              axis: int | None = None) -> tuple[Graph, str]:
    """A graph whose input "x" is integer with QuantParams, and its DQ "xd"."""
    quant = QuantParams.make(scale, zp, axis)
    graph = new_graph(shape, dtype, quant)
    dequantize(graph, "x", "xd", scale, zp, axis if axis is not None else 1)
    return graph, "xd"


def forced(graph: Graph, inputs: dict[str, np.ndarray],
           truth: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of ``graph``, where each node reads the *integer* tensors of ``truth``
    (another graph's values, by name) instead of its own: a quantized tensor is then
    compared with one computed from identical integer inputs, so a level that differs does
    not cascade into the next layers (teacher forcing). Float tensors are never replaced."""
    env: dict[str, np.ndarray] = dict(inputs)

    def read(name: str) -> np.ndarray | None:
        if not name:
            return None
        data = graph.constant(name)
        if data is not None:
            return data
        other = truth.get(name)
        mine = env[name]
        if other is not None and mine.dtype.kind in "iu" and other.dtype == mine.dtype:
            return other
        return mine

    for node in graph.topo_order():
        args = [read(v) for v in node.inputs]
        for name, array in zip(node.outputs, run_node(node, args, graph), strict=True):
            env[name] = array.astype(graph.info(name).dtype.np)
    return env
