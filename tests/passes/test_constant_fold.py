"""constant_fold: all-constant nodes become constants (bit-exact, they are evaluated by the
reference's own op table); quantization ops and type-changing producers of their constant
inputs are never folded, and nothing is recorded for them."""

from __future__ import annotations

import numpy as np
from cleanup_harness import apply, assert_bit_exact, before_after, finish, op_sequence

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import (
    CastAttrs,
    DequantizeAttrs,
    FakeQuantizeAttrs,
    QuantizeAttrs,
    TransposeAttrs,
)
from qfuse.passes import constant_fold

RNG = np.random.default_rng(0)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_transposed_weight_folds() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    g.add_constant("w", randn(4, 3))
    g.add_node(Op.TRANSPOSE, ["w"], ["wt"], TransposeAttrs((1, 0)), name="tr")
    g.add_node(Op.MATMUL, ["x", "wt"], ["y"], name="mm")
    finish(g, ["y"])
    w = g.constant("w").copy()
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 1 and not result.declined
    assert op_sequence(g) == ["MatMul"]
    assert g.node("mm").inputs == ["x", "wt"]
    np.testing.assert_array_equal(g.constant("wt"), w.T)
    assert "w" not in g.values  # the unread source constant is dropped
    assert_bit_exact(pairs)


def test_chain_of_constant_nodes_folds_in_one_run() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((5,), DType.F32))
    for name in ("a", "b", "c"):
        g.add_constant(name, randn(5))
    g.add_node(Op.ADD, ["a", "b"], ["ab"], name="add")
    g.add_node(Op.MUL, ["ab", "c"], ["abc"], name="mul")
    g.add_node(Op.SUB, ["x", "abc"], ["y"], name="sub")
    finish(g, ["y"])
    expected = (g.constant("a") + g.constant("b")) * g.constant("c")
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 2
    assert op_sequence(g) == ["Sub"]
    np.testing.assert_array_equal(g.constant("abc"), expected)
    assert g.info("abc") == TensorInfo((5,), DType.F32)
    assert_bit_exact(pairs)


def test_folded_graph_output_keeps_its_name() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((3,), DType.F32))
    g.add_constant("c", randn(3))
    g.add_node(Op.RELU, ["c"], ["rc"], name="relu_c")
    g.add_node(Op.TANH, ["x"], ["t"], name="tanh")
    finish(g, ["t", "rc"])
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 1
    assert g.outputs == ["t", "rc"] and g.constant("rc") is not None
    assert_bit_exact(pairs)


def quantized_weight_graph() -> Graph:
    """x -> Q -> DQ -> Conv-like MatMul with a DQ(s8) weight, FQ on constants, Q of constant."""
    g = Graph("t")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    scale = g.add_constant("s", np.array([0.1, 0.2, 0.3], np.float32)).name
    zp = g.add_constant("zp", np.zeros(3, np.int8)).name
    q = RNG.integers(-127, 128, (3, 3)).astype(np.int8)
    g.add_constant("wq", q, TensorInfo((3, 3), DType.S8, QuantParams.make([0.1, 0.2, 0.3],
                                                                          [0, 0, 0], 1)))
    g.add_node(Op.DEQUANTIZE_LINEAR, ["wq", scale, zp], ["w"], DequantizeAttrs(1), name="dq")
    g.add_constant("cf", randn(3, 3))
    g.add_constant("xs", np.array(0.05, np.float32))
    g.add_node(Op.QUANTIZE_LINEAR, ["cf", "xs"], ["cq"], QuantizeAttrs(DType.U8, 1), name="q")
    g.add_node(Op.DEQUANTIZE_LINEAR, ["cq", "xs"], ["cdq"], DequantizeAttrs(1), name="dq2")
    lo, hi = g.add_constant("lo", np.float32(-1)).name, g.add_constant("hi", np.float32(1)).name
    g.add_node(Op.FAKE_QUANTIZE, ["cf", lo, hi, lo, hi], ["cfq"], FakeQuantizeAttrs(256),
               name="fq")
    g.add_constant("wf", randn(3, 3))
    g.add_node(Op.CAST, ["wf"], ["w8"], CastAttrs(DType.S8), name="cast")
    g.add_node(Op.DEQUANTIZE_LINEAR, ["w8", "xs"], ["w8dq"], DequantizeAttrs(1), name="dq3")
    value = "x"
    for i, other in enumerate(("w", "cdq", "cfq", "w8dq")):
        value = g.add_node(Op.MATMUL, [value, other], [f"m{i}"], name=f"mm{i}").outputs[0]
    return finish(g, [value])


def test_quantization_ops_and_cast_into_them_are_not_folded() -> None:
    g = quantized_weight_graph()
    ops = op_sequence(g)
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 0 and not result.declined
    assert op_sequence(g) == ops
    assert g.info("wq").quant is not None and g.constant("wq").dtype == np.int8
    assert_bit_exact(pairs)


def test_cast_not_feeding_quantization_folds() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((3,), DType.S32))
    g.add_constant("c", np.array([1.7, -2.2, 3.0], np.float32))
    g.add_node(Op.CAST, ["c"], ["ci"], CastAttrs(DType.S32), name="cast")
    g.add_node(Op.ADD, ["x", "ci"], ["y"], name="add")
    finish(g, ["y"])
    result, pairs = before_after(constant_fold, g)
    assert result.changed == 1
    assert op_sequence(g) == ["Add"]
    np.testing.assert_array_equal(g.constant("ci"), np.array([1, -2, 3], np.int32))
    assert_bit_exact(pairs)


def test_nothing_constant_nothing_folded() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((3,), DType.F32))
    g.add_constant("c", randn(3))
    g.add_node(Op.ADD, ["x", "c"], ["y"], name="add")
    finish(g, ["y"])
    result = apply(constant_fold, g)
    assert result.changed == 0 and not result.declined
    assert op_sequence(g) == ["Add"]
