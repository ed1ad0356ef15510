"""Quantizer placement (compiler/quantize/placement.py) around an ``x + f(x)``: PP-OCRv4 det's
RSE layers, ``x + x·gate(mean(x))``. The compiler runs that sum in float32 as the post-ops of
the gate's multiply, reading x again; a quantizer on x would be a dequantize kernel of its own,
so x, the pool's mean and the gate's convolutions stay float32 (as NNCF leaves them), and the
sum's output is quantized for the next convolution."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.api import compile_model
from qfuse.compiler.quantize import quantize
from qfuse.compiler.quantize.placement import place

RNG = np.random.default_rng(0)


def _w(cout: int, cin: int, k: int = 1) -> np.ndarray:
    return (RNG.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)


def _squeeze_excitation(residual: bool) -> onnx.ModelProto:
    """Conv → x; x·hardsigmoid(W₂·relu(W₁·mean(x))) (+ x with ``residual``) → Conv."""
    nodes = [helper.make_node("Conv", ["in", "w0"], ["x"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "w1"], ["s1"]),
             helper.make_node("Relu", ["s1"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["s2"]),
             helper.make_node("HardSigmoid", ["s2"], ["g"]),
             helper.make_node("Mul", ["x", "g"], ["m"])]
    last = "m"
    if residual:
        nodes.append(helper.make_node("Add", ["x", "m"], ["a"]))
        last = "a"
    nodes.append(helper.make_node("Conv", [last, "w3"], ["y"]))
    inits = {"w0": _w(16, 3, 3), "w1": _w(4, 16), "w2": _w(16, 4), "w3": _w(8, 16)}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("in", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_the_x_of_x_plus_f_x_and_its_gate_stay_float() -> None:
    placed = place(_squeeze_excitation(residual=True)).activations
    assert "a" in placed and "in" in placed
    assert not {"x", "p", "r", "m"} & placed.keys()


def test_a_plain_squeeze_excitation_keeps_its_quantizers() -> None:
    placed = place(_squeeze_excitation(residual=False)).activations
    assert {"x", "p", "r", "m", "in"} <= placed.keys()


def test_the_quantized_model_compiles_without_a_dequantize_kernel() -> None:
    model = _squeeze_excitation(residual=True)
    calibration = [{"in": RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)}
                   for _ in range(4)]
    compiled = compile_model(quantize(model, calibration))
    ops = [k["op"] for k in compiled.inspect()["kernels"]]
    assert "DequantizeLinear" not in ops, ops
    assert all("no pass matched" not in n["reason"] for n in compiled.inspect()["not_fused"])
