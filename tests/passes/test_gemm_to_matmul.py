"""gemm_to_matmul: Gemm → [Transpose] MatMul [Mul] [Add], alpha/beta folded, QDQ weights
transposed as integers with their DQ axis moved.

Numerics against the reference (which evaluates Gemm in float64 and rounds once):
- alpha = beta = 1, no C: bit-exact.
- with C: MatMul rounds A@B to float32, then Add rounds again. Bound, with p = alpha·A@B:
  |after - before| <= ½ ulp(p) + ulp(y); measured on 300 random Gemms: 0.99 of the bound
  (up to 615 ulps of y where y ≈ 0 after cancellation).
- alpha / beta folded into float constants: one more float32 rounding of α·B and β·C, bound
  adds 2⁻²⁴·(|α|·|A|@|B| + |β·C|); measured 0.74 of the bound. The assertion is ratio <= 1.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from cleanup_harness import (
    apply,
    assert_bit_exact,
    before_after,
    finish,
    op_sequence,
    random_feeds,
    reasons,
)

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import DequantizeAttrs, GemmAttrs
from qfuse.passes import gemm_to_matmul
from qfuse.runtime.reference import evaluate


def gemm_graph(alpha: float = 1.0, beta: float = 1.0, trans_a: bool = False,
               trans_b: bool = True, with_c: bool = True, seed: int = 0,
               m: int = 5, k: int = 7, n: int = 4) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph("t")
    g.add_input("a", TensorInfo((k, m) if trans_a else (m, k), DType.F32))
    g.add_constant("b", rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32))
    inputs = ["a", "b"]
    if with_c:
        inputs.append(g.add_constant("c", (3 * rng.standard_normal(n)).astype(np.float32)).name)
    g.add_node(Op.GEMM, inputs, ["y"], GemmAttrs(alpha, beta, trans_a, trans_b), name="gemm")
    return finish(g, ["y"])


def test_golden_constant_weights() -> None:
    g = gemm_graph()
    b = g.constant("b").copy()
    result = apply(gemm_to_matmul, g)
    assert result.changed == 1 and not result.declined
    assert op_sequence(g) == ["MatMul", "Add"]
    mm = g.node("gemm")
    assert mm.op is Op.MATMUL and mm.inputs[0] == "a"
    np.testing.assert_array_equal(g.constant(mm.inputs[1]), b.T)
    add = g.producer("y")
    assert add is not None and add.op is Op.ADD and add.inputs == [mm.outputs[0], "c"]
    assert g.outputs == ["y"] and add.origin == ["gemm"]


def test_trans_a_on_an_activation_inserts_transpose() -> None:
    g = gemm_graph(trans_a=True, with_c=False)
    result, pairs = before_after(gemm_to_matmul, g)
    assert result.changed == 1
    assert op_sequence(g) == ["Transpose", "MatMul"]
    assert_bit_exact(pairs)


def test_trans_b_on_an_activation_inserts_transpose() -> None:
    g = Graph("t")
    g.add_input("a", TensorInfo((3, 5), DType.F32))
    g.add_input("b", TensorInfo((4, 5), DType.F32))
    g.add_node(Op.GEMM, ["a", "b"], ["y"], GemmAttrs(trans_b=True), name="gemm")
    finish(g, ["y"])
    result, pairs = before_after(gemm_to_matmul, g)
    assert result.changed == 1 and op_sequence(g) == ["Transpose", "MatMul"]
    assert_bit_exact(pairs)


@pytest.mark.parametrize("trans_b", [True, False])
def test_alpha_beta_one_without_c_is_bit_exact(trans_b: bool) -> None:
    for seed in range(5):
        g = gemm_graph(trans_b=trans_b, with_c=False, seed=seed, m=9, k=33, n=11)
        result, pairs = before_after(gemm_to_matmul, g)
        assert result.changed == 1 and op_sequence(g) == ["MatMul"]
        assert_bit_exact(pairs)


@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 1.0), (0.37, 1.0), (1.0, -2.3), (0.37, -2.3)])
def test_numeric_bound_with_c(alpha: float, beta: float) -> None:
    for seed in range(10):
        g = gemm_graph(alpha, beta, seed=seed, m=9, k=33, n=11)
        b, c = g.constant("b").astype(np.float64), g.constant("c").astype(np.float64)
        result, pairs = before_after(gemm_to_matmul, g)
        assert result.changed == 1
        assert op_sequence(g) == ["MatMul", "Add"]  # alpha and beta went into the constants
        for seed_feed, (before, after) in enumerate(pairs):
            a = random_feeds(g, seed_feed)["a"].astype(np.float64)
            p = alpha * (a @ b.T)
            folded = 2.0 ** -24 * (abs(alpha) * (np.abs(a) @ np.abs(b.T)) + np.abs(beta * c))
            folded = folded if (alpha, beta) != (1.0, 1.0) else 0.0
            top = np.maximum(np.abs(before["y"]), np.abs(after["y"]))
            bound = 0.5 * np.spacing(np.abs(p).astype(np.float32)) + folded + np.spacing(top)
            assert np.all(np.abs(after["y"].astype(np.float64) - before["y"]) <= bound)


def qdq_gemm(alpha: float = 1.0, shared: bool = False, beta: float = 1.0) -> Graph:
    """ONNX Runtime's QDQ Gemm: DQ(s8 [N, K], axis 0) weights, DQ(s32) bias, transB=1."""
    rng = np.random.default_rng(1)
    n, k = 4, 6
    g = Graph("t")
    g.add_input("a", TensorInfo((3, k), DType.F32))
    w_scale = rng.uniform(0.01, 0.03, n).astype(np.float32)
    q = rng.integers(-127, 128, (n, k)).astype(np.int8)
    g.add_constant("wq", q, TensorInfo(q.shape, DType.S8, QuantParams.make(w_scale, 0, 0)))
    g.add_constant("ws", w_scale)
    g.add_constant("wz", np.zeros(n, np.int8))
    g.add_node(Op.DEQUANTIZE_LINEAR, ["wq", "ws", "wz"], ["w"], DequantizeAttrs(0), name="dq_w")
    b_scale = (w_scale * np.float32(0.02)).astype(np.float32)
    bq = rng.integers(-1000, 1000, n).astype(np.int32)
    g.add_constant("bq", bq, TensorInfo((n,), DType.S32, QuantParams.make(b_scale, 0, 0)))
    g.add_constant("bs", b_scale)
    g.add_node(Op.DEQUANTIZE_LINEAR, ["bq", "bs"], ["bias"], DequantizeAttrs(0), name="dq_b")
    g.add_node(Op.GEMM, ["a", "w", "bias"], ["y"], GemmAttrs(alpha, beta, False, True),
               name="gemm")
    outputs = ["y"]
    if shared:
        g.add_node(Op.GEMM, ["a", "w"], ["y2"], GemmAttrs(1.0, 1.0, False, True), name="gemm2")
        outputs.append("y2")
    return finish(g, outputs)


def test_qdq_weights_transpose_the_integers_and_move_the_axis() -> None:
    g = qdq_gemm()
    q = g.constant("wq").copy()
    result = apply(gemm_to_matmul, g)
    assert result.changed == 1
    assert op_sequence(g) == ["DequantizeLinear", "DequantizeLinear", "MatMul", "Add"]
    dq = g.node("dq_w")
    assert dq.attrs == DequantizeAttrs(1) and dq.inputs[1:] == ["ws", "wz"]
    qt = g.constant(dq.inputs[0])
    assert qt.dtype == np.int8
    np.testing.assert_array_equal(qt, q.T)
    assert g.info(dq.inputs[0]).quant.axis == 1
    assert g.node("gemm").inputs == ["a", "w"] and g.info("w").shape == (6, 4)
    assert g.producer("y").inputs == ["y_matmul", "bias"]
    assert g.producer("bias").name == "dq_b"  # the int32 bias is kept as it is


def double_rounding_check(g: Graph) -> Callable[[Graph], None]:
    """Evaluate the QDQ Gemm now; the returned check bounds the rewritten graph's output by
    ½ ulp(A@W) + ulp(y) (MatMul, then Add, each rounding to float32)."""
    feeds = random_feeds(g)
    before = evaluate(g, feeds)["y"].astype(np.float64)
    w = g.constant("wq").astype(np.float64) * g.constant("ws")[:, None]
    p = feeds["a"].astype(np.float64) @ w.T

    def check(rewritten: Graph) -> None:
        after = evaluate(rewritten, feeds)["y"]
        top = np.maximum(np.abs(before), np.abs(after)).astype(np.float32)
        bound = 0.5 * np.spacing(np.abs(p).astype(np.float32)) + np.spacing(top)
        assert np.all(np.abs(after - before) <= bound)

    return check


def test_qdq_numerics() -> None:
    g = qdq_gemm()
    check = double_rounding_check(g)
    apply(gemm_to_matmul, g)
    check(g)


def test_alpha_on_dequantized_weights_becomes_a_mul() -> None:
    g = qdq_gemm(alpha=0.5)
    q = g.constant("wq").copy()
    result = apply(gemm_to_matmul, g)
    assert result.changed == 1
    assert op_sequence(g) == ["DequantizeLinear", "DequantizeLinear", "MatMul", "Mul", "Add"]
    np.testing.assert_array_equal(g.constant(g.node("dq_w").inputs[0]), q.T)
    mul = next(n for n in g.topo_order() if n.op is Op.MUL)
    assert float(g.constant(mul.inputs[1])) == 0.5


def test_beta_on_a_dequantized_bias_becomes_a_mul_on_it() -> None:
    g = qdq_gemm(beta=2.0)
    bias = g.constant("bq").copy()
    check = double_rounding_check(g)
    result = apply(gemm_to_matmul, g)
    assert result.changed == 1
    add = g.producer("y")
    mul = g.producer(add.inputs[1])
    assert mul is not None and mul.op is Op.MUL and mul.inputs[0] == "bias"
    assert float(g.constant(mul.inputs[1])) == 2.0
    np.testing.assert_array_equal(g.constant("bq"), bias)
    check(g)  # beta = 2 is exact: only the Add's double rounding remains


def test_trans_a_on_a_constant_transposes_it() -> None:
    rng = np.random.default_rng(3)
    g = Graph("t")
    g.add_constant("a", rng.standard_normal((6, 3)).astype(np.float32))
    g.add_input("b", TensorInfo((6, 4), DType.F32))
    g.add_node(Op.GEMM, ["a", "b"], ["y"], GemmAttrs(trans_a=True), name="gemm")
    finish(g, ["y"])
    a = g.constant("a").copy()
    result, pairs = before_after(gemm_to_matmul, g)
    assert result.changed == 1 and op_sequence(g) == ["MatMul"]
    np.testing.assert_array_equal(g.constant(g.node("gemm").inputs[0]), a.T)
    assert_bit_exact(pairs)


def test_shared_dequantized_weight_is_copied_not_changed() -> None:
    g = qdq_gemm(shared=True)
    q = g.constant("wq").copy()
    result, pairs = before_after(gemm_to_matmul, g)
    assert result.changed == 2
    # The first Gemm shares the DQ with gemm2: it gets a copy; gemm2, then its only reader,
    # changes the original in place.
    dqs = {n.name: n for n in g.topo_order() if n.op is Op.DEQUANTIZE_LINEAR}
    assert sorted(dqs) == ["dq_b", "dq_w", "dq_w_t"]
    for name in ("dq_w", "dq_w_t"):
        assert dqs[name].attrs == DequantizeAttrs(1)
        np.testing.assert_array_equal(g.constant(dqs[name].inputs[0]), q.T)
    assert g.node("gemm2").inputs[1] == "w" and g.node("gemm").inputs[1] != "w"
    for before, after in pairs:
        np.testing.assert_array_equal(before["y2"], after["y2"])


def test_integer_gemm_is_declined() -> None:
    g = Graph("t")
    g.add_input("a", TensorInfo((2, 3), DType.S8))
    g.add_constant("b", np.ones((3, 4), np.int8))
    g.add_node(Op.GEMM, ["a", "b"], ["y"], GemmAttrs(), name="gemm")
    finish(g, ["y"])
    result = apply(gemm_to_matmul, g)
    assert result.changed == 0
    assert reasons(result) == ["A 'a' is S8, not F32 (Gemm on integers)"]
    assert op_sequence(g) == ["Gemm"]
