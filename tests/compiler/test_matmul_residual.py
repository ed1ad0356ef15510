"""An int8 MatMul whose chain keeps an inner quantize before a residual Add (a transformer
block as quantize_static writes it: MatMul → Add bias → Q/DQ → Add residual → Q/DQ). The sum
post-op is then not the first one, which oneDNN's GEMM-based matmul only takes on ``ref:any``
(20-40x slower, measured on AVX2); the lowering adds the residual as a binary instead
(compiler/lower/attrs.py ``sum_as_binary``): no reference kernel, within 1 LSB of the
reference interpreter."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qfuse.compiler.api import compile_model
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.reference import evaluate
from qfuse.compiler.api import import_graph

M, K, N = 40, 120, 120
S_OUT = 0.05


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits = [nh.from_array(rng.integers(-127, 128, (K, N)).astype(np.int8), "w"),
             nh.from_array(np.float32(0.004), "ws"), nh.from_array(np.int8(0), "wz"),
             nh.from_array(rng.standard_normal(N).astype(np.float32), "b")]
    for name, scale, zp in (("x", 0.02, 128), ("r", 0.03, 11), ("m", 0.04, 120),
                            ("o", S_OUT, 100)):
        inits += [nh.from_array(np.float32(scale), f"{name}_s"),
                  nh.from_array(np.uint8(zp), f"{name}_z")]

    def qdq(name: str, src: str, dst: str) -> list[onnx.NodeProto]:
        return [h.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
                h.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [dst])]

    nodes = [*qdq("x", "x", "xd"), *qdq("r", "r", "rd"),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             h.make_node("MatMul", ["xd", "wd"], ["mm"]), h.make_node("Add", ["mm", "b"], ["mb"]),
             *qdq("m", "mb", "md"), h.make_node("Add", ["md", "rd"], ["sum"]),
             *qdq("o", "sum", "out")]
    return _graph(nodes, inits, "mm_residual")


def _graph(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], name: str
           ) -> onnx.ModelProto:
    """The model reading x [1, M, K] and r [1, M, N], writing out [1, M, N]."""
    graph = h.make_graph(nodes, name,
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, M, K]),
                          h.make_tensor_value_info("r", TensorProto.FLOAT, [1, M, N])],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, [1, M, N])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.uniform(-2, 2, (1, M, K)).astype(np.float32),
            "r": rng.uniform(-3, 3, (1, M, N)).astype(np.float32)}


def test_matmul_with_an_inner_quantize_before_the_residual_is_not_a_reference_kernel() -> None:
    model = _model()
    feeds = _feeds(1)
    compiled = compile_model(model)
    impls = [k["impl"] for k in compiled.inspect()["kernels"]]
    assert not any(i.startswith("ref") for i in impls), impls
    got = compiled.run(feeds)["out"]
    want = evaluate(import_graph(model), feeds)["out"]
    steps, identical = step_diff(np.rint(got / S_OUT), np.rint(want / S_OUT))
    assert steps <= 1 and identical >= 0.99, (steps, identical)


def _float_residual_model() -> onnx.ModelProto:
    """x → Q/DQ → MatMul(W, |w| up to 127) → + b → + r (a float tensor) → out (float): the
    recognizer's SVTR blocks as `qfuse quantize` writes them."""
    rng = np.random.default_rng(9)
    inits = [nh.from_array(rng.integers(-127, 128, (K, N)).astype(np.int8), "w"),
             nh.from_array(np.float32(0.004), "ws"), nh.from_array(np.int8(0), "wz"),
             nh.from_array(rng.standard_normal(N).astype(np.float32), "b"),
             nh.from_array(np.float32(0.02), "x_s"), nh.from_array(np.uint8(128), "x_z")]
    nodes = [h.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             h.make_node("MatMul", ["xd", "wd"], ["mm"]), h.make_node("Add", ["mm", "b"], ["mb"]),
             h.make_node("Add", ["mb", "r"], ["out"])]
    return _graph(nodes, inits, "mm_float_residual")


def test_split_weights_put_the_residual_sum_second_and_it_becomes_a_binary_add() -> None:
    """On CPUs without VNNI the weights are split and the low half's binary add goes first,
    so the sum would be the second post-op (ref:any, measured: the recognizer's four SVTR
    MatMuls); the residual is then added as a binary. Equal to the reference interpreter."""
    model = _float_residual_model()
    feeds = _feeds(2)
    compiled = compile_model(model)
    impls = [k["impl"] for k in compiled.inspect()["kernels"]]
    assert not any(i.startswith("ref") for i in impls), impls
    got = compiled.run(feeds)["out"]
    want = evaluate(import_graph(model), feeds)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
