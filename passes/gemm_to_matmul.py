"""Gemm → MatMul (+ Mul by alpha) (+ Add of the bias).

Identity: ``Gemm(A, B, C) = alpha·(A' @ B') + beta·C`` with ``A' = Aᵀ if transA``,
``B' = Bᵀ if transB``, becomes

    Add(Mul(MatMul(A', B'), alpha), beta·C)          (Mul only when alpha is not folded)

- A': transA on a float constant transposes the constant, otherwise a Transpose node.
- B': transB on a float constant transposes the constant; on ``DequantizeLinear(q, axis)`` of
  an integer constant q (ONNX Runtime's QDQ weights: s8 [N, K], axis 0 = output channel) the
  *integer* constant is transposed and the axis becomes ``1 - axis``, so the per-output-channel
  scale stays on the output channel (``DQ(q)ᵀ = DQ(qᵀ)`` with the axis permuted; exact). The
  DQ node is kept — changed in place when the Gemm was its only reader, copied otherwise.
  Anything else gets a Transpose node.
- alpha ≠ 1: folded into B' when B is a float constant (``α·(A@B) = A@(α·B)``, computed in
  float64, stored as float32), else a Mul after the MatMul — integer weights are never touched.
- C (absent or beta = 0: no Add; ``0·C`` is dropped even if C holds inf/NaN): a float constant
  is scaled by beta (float64 → float32) when beta ≠ 1; anything else, e.g. ONNX Runtime's
  ``DequantizeLinear(int32 bias)``, is kept as it is (the bias fusion pass folds it) and beta ≠ 1
  becomes a Mul on it. ``Add(MatMul, C)`` broadcasts C like Gemm's unidirectional broadcast.

Numerics: with alpha = beta = 1 and no C the rewrite is bit-exact against the reference
(both compute A@B in float64 and round once). With C it is not: the reference Gemm rounds
``A@B + C`` once, MatMul then Add round twice, at most ½ ulp of |A@B| plus ½ ulp of the
result apart (test_gemm_to_matmul.py measures it). Folding alpha or beta into a constant adds
one float32 rounding of the product.

The last new node writes the Gemm's output value (names survive); the MatMul takes the Gemm's
node name. Declined (reason recorded): A or B not float32 (a Gemm on integers), or a fused node.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from qfuse.ir import DType, Graph, Node, Op, TensorInfo
from qfuse.ir.ops import DequantizeAttrs, GemmAttrs, TransposeAttrs
from qfuse.passes.base import PassContext, rewrite_each
from qfuse.passes.replace import add_inferred, replace_nodes

log = logging.getLogger(__name__)

F32 = np.float32


def run(graph: Graph, ctx: PassContext) -> int:
    return rewrite_each(graph, ctx, Op.GEMM, _check, _rewrite)


def _check(graph: Graph, gemm: Node) -> str | None:
    if gemm.fused is not None:
        return "the Gemm carries a fused post-op chain"
    for port, what in ((0, "A"), (1, "B")):
        dtype = graph.info(gemm.inputs[port]).dtype
        if dtype is not DType.F32:
            return f"{what} '{gemm.inputs[port]}' is {dtype.name}, not F32 (Gemm on integers)"
    c = _c(gemm)
    if c and graph.info(c).dtype is not DType.F32:
        return f"C '{c}' is {graph.info(c).dtype.name}, not F32"
    return None


def _c(gemm: Node) -> str:
    return gemm.inputs[2] if len(gemm.inputs) > 2 else ""


def _float_constant(graph: Graph, name: str) -> np.ndarray | None:
    data = graph.constant(name)
    return data if data is not None and data.dtype == F32 else None


def _dequantized_constant(graph: Graph, name: str) -> Node | None:
    """The DequantizeLinear producing ``name`` from constant integers and parameters."""
    dq = graph.producer(name)
    if dq is None or dq.op is not Op.DEQUANTIZE_LINEAR:
        return None
    if any(graph.constant(v) is None for v in dq.inputs if v):
        return None
    return dq


def _rewrite(graph: Graph, gemm: Node) -> None:
    attrs: GemmAttrs = gemm.attrs
    a, b, c, y = gemm.inputs[0], gemm.inputs[1], _c(gemm), gemm.outputs[0]
    info, origin, base = graph.info(y), gemm.origin, gemm.name
    alpha_done = attrs.alpha == 1.0

    def const(name: str, data: np.ndarray, suffix: str, info: TensorInfo | None = None) -> str:
        return graph.add_constant(graph.unique_name(f"{name}_{suffix}"), data, info).name

    def transpose(name: str) -> str:
        return add_inferred(graph, Op.TRANSPOSE, [name], [graph.unique_name(f"{name}_t")],
                            TransposeAttrs((1, 0)), name=f"{base}_transpose",
                            origin=origin).outputs[0]

    a_data = _float_constant(graph, a)
    if attrs.trans_a:
        a = const(a, a_data.T, "t") if a_data is not None else transpose(a)

    b_data, dq = _float_constant(graph, b), _dequantized_constant(graph, b)
    if b_data is not None and (attrs.trans_b or not alpha_done):
        data = b_data.T if attrs.trans_b else b_data
        if not alpha_done:
            data = (data.astype(np.float64) * attrs.alpha).astype(F32)
            alpha_done = True
        b = const(b, data, "t" if attrs.trans_b else "alpha")
    elif attrs.trans_b and dq is not None:
        b = transpose_dequantized(graph, dq, b)
    elif attrs.trans_b:
        b = transpose(b)

    c_data = _float_constant(graph, c) if c and attrs.beta != 0.0 else None
    if c_data is not None and attrs.beta != 1.0:
        c = const(c, (c_data.astype(np.float64) * attrs.beta).astype(F32), "beta")
    elif c and attrs.beta not in (0.0, 1.0):
        scale = const(c, np.array(attrs.beta, F32), "beta")
        c = add_inferred(graph, Op.MUL, [c, scale], [graph.unique_name(f"{c}_beta")],
                         name=f"{base}_beta", origin=origin).outputs[0]
    has_c = bool(c) and attrs.beta != 0.0
    alpha = None if alpha_done else const(base, np.array(attrs.alpha, F32), "alpha")

    def build() -> None:
        steps: list[tuple[Op, list[str], str]] = [(Op.MATMUL, [a, b], base)]
        if alpha is not None:
            steps.append((Op.MUL, [alpha], f"{base}_alpha"))
        if has_c:
            steps.append((Op.ADD, [c], f"{base}_bias"))
        value = ""
        for i, (op, extra, name) in enumerate(steps):
            last = i == len(steps) - 1
            out = y if last else graph.unique_name(f"{y}_{op.value.lower()}")
            inputs = extra if op is Op.MATMUL else [value, *extra]
            node = add_inferred(graph, op, inputs, [out], name=name, origin=origin)
            value = node.outputs[0]
        if graph.info(y) != info:
            raise AssertionError(f"rewritten Gemm gives {graph.info(y)}, the Gemm gave {info}")

    replace_nodes(graph, [gemm], build)
    log.debug("rewrote %s", gemm)


def transpose_dequantized(graph: Graph, dq: Node, value: str) -> str:
    """``DQ(q, axis)ᵀ`` as ``DQ(qᵀ, 1 - axis)``: the integer constant is transposed."""
    q_name = dq.inputs[0]
    q, q_info = graph.constant(q_name), graph.info(q_name)
    axis = 1 - dq.attrs.axis % 2
    quant = q_info.quant
    if quant is not None and quant.axis is not None:
        quant = dataclasses.replace(quant, axis=1 - quant.axis % 2)
    q_t = graph.add_constant(graph.unique_name(f"{q_name}_t"), q.T,
                             TensorInfo(tuple(q.T.shape), q_info.dtype, quant)).name
    if graph.uses(value) == 1:
        graph.set_input(dq, 0, q_t)
        dq.attrs = DequantizeAttrs(axis)
        graph.set_info(value, TensorInfo(tuple(q.T.shape), graph.info(value).dtype))
        return value
    return add_inferred(graph, Op.DEQUANTIZE_LINEAR, [q_t, *dq.inputs[1:]],
                        [graph.unique_name(f"{value}_t")], DequantizeAttrs(axis),
                        name=f"{dq.name}_t", origin=dq.origin).outputs[0]
