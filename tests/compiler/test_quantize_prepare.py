"""`qfuse quantize` preparation rules (compiler/quantize/prepare.py, writer.quantize_weight) on
small models built here: each rewrite keeps the float model's outputs, and the quantized model
compiles with no "no pass matched" node (what the rule is for)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.quantize import quantize
from qfuse.compiler.quantize.evaluate import measure
from qfuse.compiler.quantize.prepare import (
    drop_identity_arithmetic,
    fold_batchnorm,
    fold_bias_add,
    scale_after_matmul,
)
from qfuse.compiler.quantize.writer import quantize_weight

RNG = np.random.default_rng(0)


def _model(nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray], x_shape: list[int],
           y_shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def _feeds(shape: list[int], n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _conv(name: str, cin: int, cout: int, k: int = 3) -> np.ndarray:
    return (RNG.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)


def _check_quantized(model: onnx.ModelProto, shape: list[int], min_cos: float) -> dict:
    calib = _feeds(shape, 8, seed=1)
    m = measure(quantize(model, calib, method="minmax"), model, _feeds(shape, 4, seed=2))
    assert m["unmatched"] == [], m["unmatched"]
    assert m["min_cos"] > min_cos, m["min_cos"]
    return m


# ------------------------------------------------------------------ weights: subnormal scales
def test_a_channel_pruned_to_subnormal_values_is_written_as_zeros_with_scale_one() -> None:
    w = _conv("w", 4, 3)
    w[1] = 1e-40 * np.sign(w[1])  # max|w|/127 is below float32's smallest normal
    w[2] = 0.0
    q, scale = quantize_weight(w, 0)
    assert scale[1] == scale[2] == 1.0 and not q[1].any() and not q[2].any()
    assert scale[0] == np.float32(np.abs(w[0]).max() / np.float32(127))
    tiny = np.finfo(np.float32).tiny
    w[1] = 127 * tiny * 2 * np.sign(w[1])  # just above: kept, with a normal scale
    q, scale = quantize_weight(w, 0)
    assert scale[1] >= tiny and np.abs(q[1]).max() == 127


def test_subnormal_weight_channels_compile_as_int8_weights() -> None:
    """Before the rule, such a conv's weights stayed a float constant the compiler could not
    fold ("weights are not a dequantized int8 constant") and its chain went unmatched."""
    w1, w2 = _conv("w1", 3, 8), _conv("w2", 8, 4)
    w2[2] = 1e-41
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c2", "s"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    model = _model(nodes, {"w1": w1, "b1": np.zeros(8), "w2": w2, "b2": np.full(4, 0.1),
                           "s": [2.0]}, [1, 3, 8, 8], [1, 4, 8, 8])
    from qfuse import compile_model

    compiled = compile_model(quantize(model, _feeds([1, 3, 8, 8], 4, seed=1), method="minmax"))
    reasons = {d["reason"] for d in compiled.inspect()["not_fused"]}
    assert "weights are not a dequantized int8 constant" not in reasons
    assert not any(k.get("src_dtype") == "f32" and "Conv" in k["name"]
                   for k in compiled.inspect()["kernels"])
    _check_quantized(model, [1, 3, 8, 8], 0.99)


# ------------------------------------------------------------------ identity arithmetic
def _silu_times_one() -> onnx.ModelProto:
    """Conv → x·sigmoid(x·1) (paddle2onnx's SiLU), x + 0, x / 1 → a float normalisation (as
    SVTR's LayerNorm: the SiLU output is not quantized) → Conv."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "one"], ["c1s"]),
             helper.make_node("Sigmoid", ["c1s"], ["g"]),
             helper.make_node("Mul", ["c1", "g"], ["silu"]),
             helper.make_node("Add", ["zero", "silu"], ["silu0"]),
             helper.make_node("Div", ["silu0", "one"], ["silu1"]),
             helper.make_node("ReduceMean", ["silu1"], ["mean"], axes=[1]),
             helper.make_node("Sub", ["silu1", "mean"], ["centred"]),
             helper.make_node("Conv", ["centred", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c2", "one"], ["y"])]  # a graph output: kept
    return _model(nodes, {"w1": _conv("w1", 3, 8), "b1": np.zeros(8), "one": [1.0],
                          "zero": 0.0, "w2": _conv("w2", 8, 4), "b2": np.zeros(4)},
                  [1, 3, 8, 8], [1, 4, 8, 8])


def test_identity_arithmetic_is_dropped_exactly() -> None:
    model = _silu_times_one()
    out = drop_identity_arithmetic(model)
    assert _ops(out) == ["Conv", "Sigmoid", "Mul", "ReduceMean", "Sub", "Conv", "Mul"]
    onnx.checker.check_model(out)
    x = _feeds([1, 3, 8, 8], 1, seed=3)[0]
    np.testing.assert_array_equal(_run(out, x), _run(model, x))


def test_identity_arithmetic_keeps_other_constants() -> None:
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]),
             helper.make_node("Sub", ["zero", "a"], ["b"]),  # 0 - x is not x
             helper.make_node("Div", ["one", "b"], ["c"]),  # 1 / x is not x
             helper.make_node("Add", ["c", "zeros"], ["y"])]  # broadcasts: shape may change
    model = _model(nodes, {"two": [2.0], "zero": [0.0], "one": [1.0],
                           "zeros": np.zeros((2, 1, 4))}, [1, 4], [2, 1, 4])
    assert _ops(drop_identity_arithmetic(model)) == _ops(model)


def test_silu_written_with_a_unit_factor_fuses() -> None:
    _check_quantized(_silu_times_one(), [1, 3, 8, 8], 0.99)


# ------------------------------------------------------------------ scale after matmul
def _attention() -> onnx.ModelProto:
    """softmax((q·c)·kᵀ)·v with q, k, v sliced from one projection (SVTR's qkv) and c = d^-½:
    the scaled q is a float op between the int8 projection and the quantizer MatMul reads."""
    d = 16
    nodes = [helper.make_node("MatMul", ["x", "wqkv"], ["qkv"]),
             helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=2),
             helper.make_node("Mul", ["q", "c"], ["qs"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["qs", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    w = (RNG.standard_normal((d, 3 * d)) / 4).astype(np.float32)
    return _model(nodes, {"wqkv": w, "c": [d ** -0.5]}, [1, 10, d], [1, 10, d])


def test_scalar_factor_moves_after_the_matmul() -> None:
    model = _attention()
    out = scale_after_matmul(model)
    onnx.checker.check_model(out)
    assert _ops(out) == ["MatMul", "Split", "Transpose", "MatMul", "Mul", "Softmax", "MatMul"]
    mm = next(n for n in out.graph.node if n.op_type == "MatMul" and "kt" in n.input)
    assert list(mm.input) == ["q", "kt"]
    x = _feeds([1, 10, 16], 1, seed=3)[0]
    a, b = _run(out, x), _run(model, x)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()  # one float rounding apart


def test_scalar_factor_with_another_reader_stays() -> None:
    model = _attention()
    model.graph.node.append(helper.make_node("Add", ["qs", "qs"], ["extra"]))
    model.graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, [1, 10, 16]))
    assert _ops(scale_after_matmul(model)) == _ops(model)


def test_attention_with_a_scaled_query_quantizes_without_unmatched_nodes() -> None:
    _check_quantized(_attention(), [1, 10, 16], 0.99)


# ------------------------------------------------------------------ bias Add folding
def _deconv_bias_add_bn() -> onnx.ModelProto:
    """ConvTranspose without bias → Add([1, C, 1, 1]) → BatchNorm → Relu → Conv (PP-OCR DB
    head, as paddle2onnx writes it)."""
    c = 6
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("ConvTranspose", ["r0", "wt"], ["t"], strides=[2, 2]),
             helper.make_node("Add", ["t", "bt"], ["tb"]),
             helper.make_node("BatchNormalization", ["tb", "g", "be", "mu", "var"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r1"]),
             helper.make_node("Conv", ["r1", "w1", "b1"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"w0": _conv("w0", 3, c), "b0": np.zeros(c),
             "wt": (RNG.standard_normal((c, c, 2, 2)) / 3).astype(np.float32),
             "bt": RNG.standard_normal((1, c, 1, 1)), "g": RNG.uniform(0.5, 1.5, c),
             "be": RNG.standard_normal(c) * 0.1, "mu": RNG.standard_normal(c) * 0.1,
             "var": RNG.uniform(0.5, 1.5, c), "w1": _conv("w1", c, 2), "b1": np.zeros(2)}
    return _model(nodes, inits, [1, 3, 8, 8], [1, 2, 16, 16])


@pytest.mark.parametrize("shape", [(1, 6, 1, 1), (6, 1, 1), (1,)])
def test_per_channel_add_after_a_conv_becomes_its_bias(shape: tuple[int, ...]) -> None:
    model = _deconv_bias_add_bn()
    bt = next(t for t in model.graph.initializer if t.name == "bt")
    bt.CopyFrom(numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), "bt"))
    out = fold_batchnorm(fold_bias_add(model))
    onnx.checker.check_model(out)
    assert _ops(out) == ["Conv", "Relu", "ConvTranspose", "Relu", "Conv"]
    x = _feeds([1, 3, 8, 8], 1, seed=3)[0]
    a, b = _run(out, x), _run(model, x)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()


def test_add_of_a_non_channel_constant_stays() -> None:
    model = _deconv_bias_add_bn()
    bt = next(t for t in model.graph.initializer if t.name == "bt")
    bt.CopyFrom(numpy_helper.from_array(
        RNG.standard_normal((1, 6, 16, 16)).astype(np.float32), "bt"))
    assert "Add" in _ops(fold_bias_add(model))


def test_deconv_bias_add_batchnorm_quantizes_without_unmatched_nodes() -> None:
    _check_quantized(_deconv_bias_add_bn(), [1, 3, 8, 8], 0.99)
