"""canonicalize_arith: Sum → Add chain, Sub(x, c) → Add(x, -c), Div(x, c) → Mul(x, 1/c).

Numerics against the reference interpreter:
- Sum → Adds (any number of inputs) and Sub → Add: bit-exact (np.array_equal).
- Div → Mul is NOT bit-exact in float32: x/c is correctly rounded, x·float32(1/c) rounds
  twice. Bound: at most 1 ulp of float32. Measured: on 10⁶ random (x, c) pairs (x ~ N(0, 1)·
  10^U(-3, 3), c ~ ±10^U(-3, 3)) the max ulp difference is 1, on 26% of the elements
  (test_div_to_mul_ulp_measurement); hypothesis searches the whole normal float32 range.
"""

from __future__ import annotations

import numpy as np
from cleanup_harness import (
    apply,
    assert_bit_exact,
    before_after,
    finish,
    op_sequence,
    reasons,
    ulps,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import DequantizeAttrs
from qfuse.passes import canonicalize_arith
from qfuse.runtime.reference import evaluate

F32 = np.float32


def binary(op: Op, c: np.ndarray | None, shape: tuple[int, ...] = (4, 5)) -> Graph:
    """x -> op(x, c) -> y; c None: the second input is another graph input."""
    g = Graph("t")
    g.add_input("x", TensorInfo(shape, DType.F32))
    if c is None:
        g.add_input("c", TensorInfo(shape, DType.F32))
    else:
        g.add_constant("c", c)
    g.add_node(op, ["x", "c"], ["y"], name="node")
    return finish(g, ["y"])


def sum_graph(n: int) -> Graph:
    g = Graph("t")
    names = [g.add_input(f"x{i}", TensorInfo((3, 4) if i % 2 else (4,), DType.F32)).name
             for i in range(n)]
    g.add_node(Op.SUM, names, ["s"], name="sum")
    g.add_node(Op.RELU, ["s"], ["y"], name="relu")
    return finish(g, ["y", "s"])


def test_sum_of_three_becomes_an_add_chain_bit_exact() -> None:
    g = sum_graph(3)
    result, pairs = before_after(canonicalize_arith, g)
    assert result.changed == 1 and not result.declined
    assert op_sequence(g) == ["Add", "Add", "Relu"]
    last = g.producer("s")
    assert last is not None and last.name == "sum" and last.inputs[1] == "x2"
    first = g.producer(last.inputs[0])
    assert first is not None and first.inputs == ["x0", "x1"]
    assert_bit_exact(pairs)


def test_sum_of_two_bit_exact() -> None:
    g = sum_graph(2)
    result, pairs = before_after(canonicalize_arith, g, seeds=5)
    assert result.changed == 1 and op_sequence(g) == ["Add", "Relu"]
    assert_bit_exact(pairs)


def test_sum_of_one_is_bypassed() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((3,), DType.F32))
    g.add_node(Op.TANH, ["x"], ["t"], name="tanh")
    g.add_node(Op.SUM, ["t"], ["s"], name="sum")
    finish(g, ["s"])
    result, pairs = before_after(canonicalize_arith, g)
    assert result.changed == 1 and op_sequence(g) == ["Tanh"]
    assert g.producer("s").name == "tanh"
    assert_bit_exact(pairs)


def test_sub_constant_becomes_add_of_negation_bit_exact() -> None:
    rng = np.random.default_rng(0)
    c = rng.standard_normal((4, 5)).astype(F32)
    c[0, :3] = [0.0, -0.0, np.inf]
    g = binary(Op.SUB, c)
    result, pairs = before_after(canonicalize_arith, g, seeds=5)
    assert result.changed == 1
    assert op_sequence(g) == ["Add"]
    add = g.producer("y")
    assert add.name == "node" and add.inputs[0] == "x"
    np.testing.assert_array_equal(g.constant(add.inputs[1]), -c)
    assert_bit_exact(pairs)


def test_div_constant_becomes_mul_within_one_ulp() -> None:
    rng = np.random.default_rng(1)
    c = (rng.choice([-1, 1], (5,)) * 10 ** rng.uniform(-3, 3, (5,))).astype(F32)
    g = binary(Op.DIV, c)
    result, pairs = before_after(canonicalize_arith, g, seeds=5)
    assert result.changed == 1
    mul = g.producer("y")
    assert mul.op is Op.MUL and op_sequence(g) == ["Mul"]
    np.testing.assert_array_equal(g.constant(mul.inputs[1]),
                                  (1.0 / c.astype(np.float64)).astype(F32))
    for before, after in pairs:
        assert ulps(after["y"], before["y"]).max() <= 1


def test_div_to_mul_ulp_measurement() -> None:
    """10⁶ random pairs through the pass: max 1 ulp, and some elements do differ."""
    rng = np.random.default_rng(2)
    n = 1000
    c = (rng.choice([-1, 1], (n,)) * 10 ** rng.uniform(-3, 3, (n,))).astype(F32)
    g = binary(Op.DIV, c, (n, n))
    x = (rng.standard_normal((n, n)) * 10 ** rng.uniform(-3, 3, (n, n))).astype(F32)
    before = evaluate(g, {"x": x})["y"]
    apply(canonicalize_arith, g)
    after = evaluate(g, {"x": x})["y"]
    distance = ulps(after, before)
    assert distance.max() == 1
    assert 0.05 < np.mean(distance == 1) < 0.5  # measured 0.26: the rewrite is not exact


FINITE = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@settings(max_examples=500, deadline=None)
@given(x=FINITE, c=FINITE.filter(lambda v: v != 0 and np.isfinite(np.float32(1.0 / v))
                                 and abs(1.0 / v) >= np.finfo(F32).tiny))
def test_div_to_mul_within_one_ulp_everywhere(x: float, c: float) -> None:
    with np.errstate(over="ignore", under="ignore"):  # ±inf vs ±max is 1 ulp apart
        quotient = np.divide(F32(x), F32(c))
        product = F32(x) * (1.0 / np.float64(F32(c))).astype(F32)
    assert ulps(np.array(product), np.array(quotient)).max() <= 1


def test_dequantized_constant_counts_as_constant() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    g.add_constant("cq", np.array([10, 200, 255], np.uint8),
                   TensorInfo((3,), DType.U8, QuantParams.make(0.01, 0)))
    g.add_constant("cs", np.array(0.01, F32))
    g.add_node(Op.DEQUANTIZE_LINEAR, ["cq", "cs"], ["c"], DequantizeAttrs(1), name="dq")
    g.add_node(Op.SUB, ["x", "c"], ["y"], name="sub")
    finish(g, ["y"])
    result, pairs = before_after(canonicalize_arith, g)
    assert result.changed == 1
    assert op_sequence(g) == ["Add"]  # the DQ had no other reader: dropped
    np.testing.assert_array_equal(g.constant(g.producer("y").inputs[1]),
                                  -(np.array([10, 200, 255], F32) * F32(0.01)))
    assert_bit_exact(pairs)


def test_non_constant_second_input_is_declined() -> None:
    for op in (Op.SUB, Op.DIV):
        g = binary(op, None)
        result = apply(canonicalize_arith, g)
        assert result.changed == 0
        assert reasons(result) == ["second input 'c' is not a constant"]
        assert op_sequence(g) == [op.value]


def test_division_by_zero_or_huge_is_declined() -> None:
    for bad in (0.0, 3e38, np.inf):  # 1/3e38 is subnormal
        g = binary(Op.DIV, np.array([1.0, bad], F32), (3, 2))
        result = apply(canonicalize_arith, g)
        assert result.changed == 0
        assert reasons(result) == [
            "divisor 'c' has a zero, non-finite or huge element: 1/c is not a normal float32"
        ]


def test_integer_sub_is_declined() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((3,), DType.S32))
    g.add_constant("c", np.array([1, 2, 3], np.int32))
    g.add_node(Op.SUB, ["x", "c"], ["y"], name="sub")
    finish(g, ["y"])
    result = apply(canonicalize_arith, g)
    assert result.changed == 0
    assert reasons(result) == ["S32 Sub by int32 is kept (only float32 is rewritten)"]
