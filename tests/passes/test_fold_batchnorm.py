"""fold_batchnorm: BN after a single-consumer float Conv / ConvTranspose folds into its
weights and bias; everything else is declined with its reason.

Tolerance (float32 reassociation, see the pass docstring). With M = conv(|x|, |w'|),
s = γ/√(var+ε) and z the exact result, the analysis gives

    |after - before| <= 2⁻²⁴·(2·M + |b'| + |s·b|) + ulp(z)

and over 200 random convs (Conv group 1 / 2 / depthwise, ConvTranspose group 1 / 2, with and
without bias) the measured worst case was 0.75 of that bound; in ulps of the largest output
magnitude, max |after - before| was exactly 1 ulp(max |y|) (individual elements near zero can
be thousands of ulps apart: their error comes from the large terms that cancelled). The test
asserts the analytic bound (ratio <= 1) and <= 2 ulp(max |y|).
"""

from __future__ import annotations

import numpy as np
import pytest
from cleanup_harness import apply, before_after, finish, op_sequence, random_feeds, reasons

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import BatchNormAttrs, ConvAttrs, ConvTransposeAttrs, DequantizeAttrs
from qfuse.passes import fold_batchnorm
from qfuse.runtime.reference import evaluate

EPS = 1e-5


def bn_params(g: Graph, rng: np.random.Generator, channels: int) -> list[str]:
    g.add_constant("gamma", rng.uniform(0.2, 3.0, channels).astype(np.float32))
    g.add_constant("beta", rng.standard_normal(channels).astype(np.float32))
    g.add_constant("mean", rng.standard_normal(channels).astype(np.float32))
    g.add_constant("var", rng.uniform(0.01, 4.0, channels).astype(np.float32))
    return ["gamma", "beta", "mean", "var"]


def conv_bn(op: Op = Op.CONV, cin: int = 8, cout: int = 16, group: int = 1, bias: bool = True,
            seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph("t")
    g.add_input("x", TensorInfo((2, cin, 9, 9), DType.F32))
    if op is Op.CONV:
        w = rng.standard_normal((cout, cin // group, 3, 3))
        attrs = ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), group)
    else:
        w = rng.standard_normal((cin, cout // group, 3, 3))
        attrs = ConvTransposeAttrs((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), group)
    g.add_constant("w", w.astype(np.float32))
    inputs = ["x", "w"]
    if bias:
        inputs.append(g.add_constant("b", rng.standard_normal(cout).astype(np.float32)).name)
    g.add_node(op, inputs, ["c"], attrs, name="conv")
    g.add_node(Op.BATCH_NORM, ["c", *bn_params(g, rng, cout)], ["y"], BatchNormAttrs(EPS),
               name="bn")
    return finish(g, ["y"])


def test_golden_structure() -> None:
    g = conv_bn()
    result = apply(fold_batchnorm, g)
    assert result.changed == 1 and not result.declined
    assert op_sequence(g) == ["Conv"]
    conv = g.producer("y")
    assert conv is not None and conv.name == "conv" and conv.origin == ["conv", "bn"]
    assert conv.inputs[0] == "x" and len(conv.inputs) == 3
    assert g.outputs == ["y"] and "c" not in g.values
    assert not {"w", "b", "gamma", "beta", "mean", "var"} & set(g.values)


def test_weights_and_bias_formula() -> None:
    g = conv_bn(bias=True)
    w, b = g.constant("w").astype(np.float64), g.constant("b").astype(np.float64)
    gamma, beta, mean, var = (g.constant(n).astype(np.float64)
                              for n in ("gamma", "beta", "mean", "var"))
    s = gamma / np.sqrt(var + EPS)
    apply(fold_batchnorm, g)
    conv = g.producer("y")
    np.testing.assert_array_equal(g.constant(conv.inputs[1]),
                                  (w * s[:, None, None, None]).astype(np.float32))
    np.testing.assert_array_equal(g.constant(conv.inputs[2]),
                                  ((b - mean) * s + beta).astype(np.float32))


def test_conv_transpose_groups_scale_axis_1_per_group() -> None:
    g = conv_bn(Op.CONV_TRANSPOSE, cin=8, cout=6, group=2, bias=False)
    w = g.constant("w").astype(np.float64)  # [Cin=8, Cout/g=3, 3, 3]
    s = g.constant("gamma").astype(np.float64) / np.sqrt(g.constant("var").astype(np.float64)
                                                         + EPS)
    apply(fold_batchnorm, g)
    new_w = g.constant(g.producer("y").inputs[1])
    expected = w.copy()
    for cin in range(8):
        block = cin // 4
        for j in range(3):
            expected[cin, j] *= s[block * 3 + j]
    np.testing.assert_array_equal(new_w, expected.astype(np.float32))


CASES = [(Op.CONV, 8, 16, 1), (Op.CONV, 8, 12, 2), (Op.CONV, 8, 8, 8),
         (Op.CONV_TRANSPOSE, 8, 6, 1), (Op.CONV_TRANSPOSE, 8, 6, 2)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("op", "cin", "cout", "group"), CASES)
def test_numeric_bound(op: Op, cin: int, cout: int, group: int, bias: bool) -> None:
    for seed in range(4):
        g = conv_bn(op, cin, cout, group, bias, seed)
        var = g.constant("var").astype(np.float64)
        s = g.constant("gamma").astype(np.float64) / np.sqrt(var + EPS)
        old_b = g.constant("b").astype(np.float64) if bias else np.zeros(cout)
        result, pairs = before_after(fold_batchnorm, g, seeds=2)
        assert result.changed == 1
        conv = g.producer("y")
        new_b = np.abs(g.constant(conv.inputs[2]).astype(np.float64))
        for seed_feed, (before, after) in enumerate(pairs):
            x = random_feeds(g, seed_feed)["x"]
            magnitude = _abs_conv(g, np.abs(x))
            bound = (2.0 ** -24 * (2 * magnitude + (new_b + np.abs(s * old_b))[:, None, None])
                     + np.spacing(np.abs(before["y"])))
            diff = np.abs(after["y"].astype(np.float64) - before["y"])
            assert np.all(diff <= bound)
            assert diff.max() <= 2 * np.spacing(np.abs(before["y"]).max())


def _abs_conv(g: Graph, x: np.ndarray) -> np.ndarray:
    """conv(|x|, |w'|) without bias: the magnitude of the products the folded conv sums."""
    conv = g.producer("y")
    h = Graph("abs")
    h.add_input("x", TensorInfo(x.shape, DType.F32))
    h.add_constant("w", np.abs(g.constant(conv.inputs[1])))
    h.add_node(conv.op, ["x", "w"], ["m"], conv.attrs, name="c")
    finish(h, ["m"])
    return evaluate(h, {"x": x})["m"].astype(np.float64)


def test_bn_not_after_conv_is_declined() -> None:
    rng = np.random.default_rng(0)
    g = Graph("t")
    g.add_input("x", TensorInfo((1, 4, 5, 5), DType.F32))
    g.add_node(Op.RELU, ["x"], ["r"], name="relu")
    g.add_node(Op.BATCH_NORM, ["r", *bn_params(g, rng, 4)], ["y"], BatchNormAttrs(EPS),
               name="bn")
    finish(g, ["y"])
    result, pairs = before_after(fold_batchnorm, g)
    assert result.changed == 0
    assert reasons(result) == ["input is not a single-consumer Conv"]
    assert op_sequence(g) == ["Relu", "BatchNormalization"]
    for before, after in pairs:
        np.testing.assert_array_equal(before["y"], after["y"])


def test_conv_with_two_readers_is_declined() -> None:
    g = conv_bn()
    g.add_node(Op.RELU, ["c"], ["r"], name="relu")
    finish(g, ["y", "r"])
    result = apply(fold_batchnorm, g)
    assert result.changed == 0
    assert reasons(result) == ["input is not a single-consumer Conv: its output 'c' has 2 readers"]


def test_dequantized_int8_weights_are_declined() -> None:
    rng = np.random.default_rng(0)
    g = Graph("t")
    g.add_input("x", TensorInfo((1, 4, 5, 5), DType.F32))
    scale = rng.uniform(0.01, 0.02, 6).astype(np.float32)
    q = rng.integers(-127, 128, (6, 4, 3, 3)).astype(np.int8)
    g.add_constant("wq", q, TensorInfo(q.shape, DType.S8, QuantParams.make(scale, 0, 0)))
    g.add_constant("ws", scale)
    g.add_node(Op.DEQUANTIZE_LINEAR, ["wq", "ws"], ["w"], DequantizeAttrs(0), name="dq")
    g.add_node(Op.CONV, ["x", "w"], ["c"], ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
               name="conv")
    g.add_node(Op.BATCH_NORM, ["c", *bn_params(g, rng, 6)], ["y"], BatchNormAttrs(EPS),
               name="bn")
    finish(g, ["y"])
    result = apply(fold_batchnorm, g)
    assert result.changed == 0
    assert reasons(result) == [("conv weights 'w' are a DequantizeLinear of an integer tensor; "
                                "quantized weights are not rescaled")]
    np.testing.assert_array_equal(g.constant("wq"), q)


def test_non_constant_statistics_are_declined() -> None:
    rng = np.random.default_rng(0)
    g = Graph("t")
    g.add_input("x", TensorInfo((1, 4, 5, 5), DType.F32))
    g.add_input("m", TensorInfo((4,), DType.F32))
    g.add_constant("w", rng.standard_normal((4, 4, 1, 1)).astype(np.float32))
    g.add_node(Op.CONV, ["x", "w"], ["c"], ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
               name="conv")
    params = bn_params(g, rng, 4)
    params[2] = "m"
    g.add_node(Op.BATCH_NORM, ["c", *params], ["y"], BatchNormAttrs(EPS), name="bn")
    finish(g, ["y"])
    result = apply(fold_batchnorm, g)
    assert result.changed == 0
    assert reasons(result) == ["BatchNorm mean 'm' is not a constant"]
