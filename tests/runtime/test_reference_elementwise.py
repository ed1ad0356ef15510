"""Elementwise ops vs ONNX Runtime (tolerance: reference_harness.FLOAT_TOL, 1e-5 relative).

The float32 arithmetic ops are also checked bit for bit: they are single correctly rounded
float32 operations in both implementations.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference_harness import Case, compare, randn, run_ort, run_ours

from qfuse.ir.ops import (
    AlphaAttrs,
    ClipAttrs,
    GeluApprox,
    GeluAttrs,
    HardSigmoidAttrs,
    HardSwishAttrs,
    NoAttrs,
    Op,
)

BROADCASTS = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)),
              ((2, 3, 4, 5), (1, 3, 1, 1)), ((), (2, 2))]


@pytest.mark.parametrize("op", [Op.ADD, Op.SUB, Op.MUL, Op.DIV])
@pytest.mark.parametrize("a, b", BROADCASTS)
def test_binary_float_bit_exact(op: Op, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(a) + 7 * len(b))
    case = Case(op.value, {}, op, NoAttrs(), {"a": randn(rng, *a), "b": randn(rng, *b)})
    (ours,), (ref,) = run_ours(case), run_ort(case)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("op", [Op.ADD, Op.SUB, Op.MUL, Op.DIV])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_binary_integer(op: Op, dtype: type) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(-50, 50, (3, 4)).astype(dtype)
    b = rng.integers(1, 9, (4,)).astype(dtype) * np.array([1, -1, 1, -1], dtype)
    compare(Case(op.value, {}, op, NoAttrs(), {"a": a, "b": b}))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_sum(n: int) -> None:
    rng = np.random.default_rng(n)
    shapes = [(2, 3, 4), (3, 1), (4,), (1, 1, 1)][:n]
    compare(Case("Sum", {}, Op.SUM, NoAttrs(), {f"x{i}": randn(rng, *s)
                                                for i, s in enumerate(shapes)}))


def _x(seed: int = 0) -> np.ndarray:
    x = randn(np.random.default_rng(seed), 4, 5, 6, scale=4.0)
    x.flat[:6] = [0.0, -0.0, 3.0, -3.0, 1e-8, -20.0]
    return x


@pytest.mark.parametrize("op, onnx_attrs, attrs", [
    (Op.RELU, {}, NoAttrs()),
    (Op.LEAKY_RELU, {"alpha": 0.1}, AlphaAttrs(0.1)),
    (Op.LEAKY_RELU, {}, AlphaAttrs()),
    (Op.HARD_SIGMOID, {}, HardSigmoidAttrs()),
    (Op.HARD_SIGMOID, {"alpha": 0.3, "beta": 0.4}, HardSigmoidAttrs(0.3, 0.4)),
    (Op.HARD_SWISH, {}, HardSwishAttrs()),
])
def test_float32_activations_bit_exact(op: Op, onnx_attrs: dict[str, float], attrs: object) -> None:
    case = Case(op.value, onnx_attrs, op, attrs, {"x": _x()})
    (ours,), (ref,) = run_ours(case), run_ort(case)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("op, onnx_attrs, attrs", [
    (Op.SIGMOID, {}, NoAttrs()),
    (Op.TANH, {}, NoAttrs()),
    (Op.GELU, {}, GeluAttrs()),
    (Op.GELU, {"approximate": "tanh"}, GeluAttrs(GeluApprox.TANH)),
])
def test_transcendental_activations(op: Op, onnx_attrs: dict[str, str], attrs: object) -> None:
    compare(Case(op.value, onnx_attrs, op, attrs, {"x": _x(1)}))


@pytest.mark.parametrize("lo, hi", [(0.0, 6.0), (-1.0, 1.0), (None, 0.5), (-0.5, None)])
def test_clip(lo: float | None, hi: float | None) -> None:
    constants = {}
    names = ["x", "", ""]
    if lo is not None:
        constants["lo"] = np.float32(lo)
        names[1] = "lo"
    if hi is not None:
        constants["hi"] = np.float32(hi)
        names[2] = "hi"
    attrs = ClipAttrs(-np.inf if lo is None else lo, np.inf if hi is None else hi)
    case = Case("Clip", {}, Op.CLIP, attrs, {"x": _x()}, constants, order=["x"],
                onnx_order=names)
    (ours,), (ref,) = run_ours(case), run_ort(case)
    np.testing.assert_array_equal(ours, ref)


def test_clip_integer() -> None:
    x = np.arange(-10, 10, dtype=np.int32)
    case = Case("Clip", {}, Op.CLIP, ClipAttrs(-3.0, 4.0), {"x": x},
                {"lo": np.int32(-3), "hi": np.int32(4)}, order=["x"],
                onnx_order=["x", "lo", "hi"])
    (ours,), (ref,) = run_ours(case), run_ort(case)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("slope_shape", [(1,), (5, 1), (6,), (4, 5, 6)])
def test_prelu(slope_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(slope_shape))
    case = Case("PRelu", {}, Op.PRELU, NoAttrs(), {"x": _x()},
                {"slope": randn(rng, *slope_shape)})
    (ours,), (ref,) = run_ours(case), run_ort(case)
    np.testing.assert_array_equal(ours, ref)
