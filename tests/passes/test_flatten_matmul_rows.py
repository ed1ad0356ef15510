"""flatten_matmul_rows: a MatMul over the rows of a rank > 2 tensor with 2-D constant weights
runs as one 2-D matmul (ConvNeXt's Linear layers on [1, H, W, C]), bit-exact against the plan
without it in every mode, the graph's names and shapes unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qfuse.compiler.api import compile_model, import_graph
from qfuse.ir.postops import ComposerOptions
from qfuse.runtime.reference import evaluate

K, N = 48, 40
# the matmuls stay matmuls (on AVX2, vector_matmul_as_conv would make them 1x1 convolutions)
ON = ComposerOptions().without("vector_matmul_as_conv")
OFF = ON.without("flatten_matmul_rows")


def _model(shape: tuple[int, ...], *, residual: bool = True,
           runtime_weights: bool = False) -> onnx.ModelProto:
    """x → Q/DQ → MatMul(W) → + b → Q/DQ [→ + Q/DQ(r) → Q/DQ] (quantize_static's form)."""
    rng = np.random.default_rng(3)
    out_shape = (*shape[:-1], N)
    inits = [nh.from_array(rng.integers(-127, 128, (K, N)).astype(np.int8), "w"),
             nh.from_array(np.float32(0.004), "ws"), nh.from_array(np.int8(0), "wz"),
             nh.from_array(rng.standard_normal(N).astype(np.float32), "b")]
    for name, scale, zp in (("x", 0.02, 128), ("r", 0.03, 11), ("m", 0.04, 120),
                            ("o", 0.05, 100)):
        inits += [nh.from_array(np.float32(scale), f"{name}_s"),
                  nh.from_array(np.uint8(zp), f"{name}_z")]

    def qdq(name: str, src: str, dst: str) -> list[onnx.NodeProto]:
        return [h.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
                h.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [dst])]

    inputs = [h.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    weights = h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"])
    if runtime_weights:
        inputs.append(h.make_tensor_value_info("wf", TensorProto.FLOAT, [K, N]))
        weights = h.make_node("Identity", ["wf"], ["wd"])
    nodes = [*qdq("x", "x", "xd"), weights, h.make_node("MatMul", ["xd", "wd"], ["mm"]),
             h.make_node("Add", ["mm", "b"], ["mb"])]
    if residual:
        inputs.append(h.make_tensor_value_info("r", TensorProto.FLOAT, list(out_shape)))
        nodes += [*qdq("m", "mb", "md"), *qdq("r", "r", "rd"),
                  h.make_node("Add", ["md", "rd"], ["sum"]), *qdq("o", "sum", "out")]
    else:
        nodes += qdq("o", "mb", "out")
    graph = h.make_graph(nodes, "rows", inputs,
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, list(out_shape))],
                         inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {i.name: rng.uniform(-2, 2, [d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input}


@pytest.mark.parametrize("mode", ["fused", "unfused", "fp32"])
@pytest.mark.parametrize("residual", [True, False])
def test_rows_of_a_4d_tensor_run_as_one_matmul_bit_exact(mode: str, residual: bool) -> None:
    model = _model((1, 6, 7, K), residual=residual)
    on = compile_model(model, mode=mode, composer=ON)
    off = compile_model(model, mode=mode, composer=OFF)
    assert on.inspect()["passes"]["flatten_matmul_rows"] == 1
    matmuls = [k for k in on.inspect()["kernels"] if k["primitive"] == "matmul"]
    assert matmuls and all(k["src_layouts"][0].split(" (")[1].startswith(f"{6 * 7}, {K})")
                           for k in matmuls), [k["src_layouts"] for k in matmuls]
    before = [k for k in off.inspect()["kernels"] if k["primitive"] == "matmul"]
    assert all("(1, 6, 7," in k["src_layouts"][0] for k in before)
    feeds = _feeds(model)
    got, want = on.run(feeds), off.run(feeds)
    assert list(got) == ["out"] and got["out"].shape == (1, 6, 7, N)
    np.testing.assert_array_equal(got["out"], want["out"])
    if mode == "fused":  # and the plan still computes the model (≤ 1 step from the reference)
        ref = evaluate(import_graph(model), feeds)["out"]
        assert np.abs(got["out"] - ref).max() <= 0.05 + 1e-6


@pytest.mark.parametrize(("shape", "kwargs"), [
    ((1, 1, 42, K), {}),                      # leading dims all 1: already one GEMM
    ((2, 21, K), {"runtime_weights": True}),  # runtime weights
])
def test_not_applied(shape: tuple[int, ...], kwargs: dict[str, bool]) -> None:
    model = _model(shape, **kwargs)
    compiled = compile_model(model)
    assert compiled.inspect()["passes"]["flatten_matmul_rows"] == 0
    feeds = _feeds(model)
    ref = evaluate(import_graph(model), feeds)["out"]
    assert np.abs(compiled.run(feeds)["out"] - ref).max() <= 0.05 + 1e-6
