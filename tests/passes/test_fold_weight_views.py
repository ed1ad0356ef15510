"""fold_weight_views: a Transpose / Reshape of a dequantized integer constant becomes the
dequantize of the viewed integers, its per-channel axis moved with the view. Exact: the
reference's outputs are bit-identical, and the compiled model's MatMul reads s8 weights."""

from __future__ import annotations

import numpy as np
from cleanup_harness import assert_bit_exact, before_after, finish, op_sequence, reasons
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.ops import DequantizeAttrs, ReshapeAttrs, TransposeAttrs
from qfuse.passes import fold_weight_views
from tests.compiler.onnx_builders import init, model, run_ort

F = np.float32


def linear_graph(view: Op = Op.TRANSPOSE, shared: bool = False) -> Graph:
    """``MatMul(a, view(DQ(w_q)))``, w_q s8 ``[N, K]`` per channel along axis 0 — how
    torch.onnx exports a PyTorch-quantized Linear (Transpose), or the same weights reshaped
    ``[N, K] -> [N·K / 2, 2]`` (the channel dim merged: not foldable), read as it is."""
    rng = np.random.default_rng(2)
    n, k = 6, 4
    g = Graph("t")
    g.add_input("a", TensorInfo((3, k), DType.F32))
    scale = rng.uniform(0.01, 0.03, n).astype(F)
    q = rng.integers(-127, 128, (n, k)).astype(np.int8)
    g.add_constant("wq", q, TensorInfo(q.shape, DType.S8, QuantParams.make(scale, 0, 0)))
    g.add_constant("ws", scale)
    g.add_constant("wz", np.zeros(n, np.int8))
    g.add_node(Op.DEQUANTIZE_LINEAR, ["wq", "ws", "wz"], ["w"], DequantizeAttrs(0), name="dq")
    if view is Op.TRANSPOSE:
        g.add_node(Op.TRANSPOSE, ["w"], ["wt"], TransposeAttrs((1, 0)), name="view")
        g.add_node(Op.MATMUL, ["a", "wt"], ["y"], name="mm")
    else:
        g.add_node(Op.RESHAPE, ["w"], ["wt"], ReshapeAttrs((n * k // 2, 2)), name="view")
        g.add_node(Op.IDENTITY, ["wt"], ["y"], name="read")
    outputs = ["y"]
    if shared:
        g.add_node(Op.IDENTITY, ["w"], ["w_copy"], name="other")
        outputs.append("w_copy")
    return finish(g, outputs)


def test_a_transposed_dequantized_weight_is_a_dequantize_of_transposed_integers() -> None:
    g = linear_graph()
    q = g.constant("wq").copy()
    result, pairs = before_after(fold_weight_views, g)
    assert result.changed == 1 and not result.declined
    assert_bit_exact(pairs)
    assert op_sequence(g) == ["DequantizeLinear", "MatMul"]
    dq = g.producer("wt")
    assert dq.op is Op.DEQUANTIZE_LINEAR and dq.attrs == DequantizeAttrs(1)
    qt = dq.inputs[0]
    np.testing.assert_array_equal(g.constant(qt), q.T)
    assert g.info(qt).dtype is DType.S8 and g.info(qt).quant.axis == 1
    np.testing.assert_array_equal(g.info(qt).quant.scale_array(), g.constant("ws"))


def test_the_old_dequantize_stays_for_its_other_readers() -> None:
    g = linear_graph(shared=True)
    result, pairs = before_after(fold_weight_views, g)
    assert result.changed == 1
    assert_bit_exact(pairs)
    assert g.has_node("dq") and g.node("other").inputs == ["w"]


def test_a_reshape_merging_the_channel_dim_is_declined() -> None:
    g = linear_graph(Op.RESHAPE)
    result, pairs = before_after(fold_weight_views, g)
    assert result.changed == 0
    assert_bit_exact(pairs)
    assert "does not survive Reshape" in " ".join(reasons(result))
    assert g.node("view").op is Op.RESHAPE


def _torch_linear() -> object:
    """A PyTorch-quantized Linear as torch.onnx exports it: QuantizeLinear / DequantizeLinear
    of the input, ``MatMul(x, Transpose(DQ(w_q)))`` with s8 per-channel weights, a float bias
    Add, QuantizeLinear / DequantizeLinear of the output."""
    rng = np.random.default_rng(5)
    scale = rng.uniform(0.004, 0.01, 16).astype(F)
    inits = [init("s", np.array(0.05, F)), init("z", np.array(128, np.uint8)),
             init("w", rng.integers(-127, 128, (16, 32)).astype(np.int8)), init("ws", scale),
             init("wz", np.zeros(16, np.int8)), init("b", rng.standard_normal(16).astype(F)),
             init("os", np.array(0.08, F)), init("oz", np.array(120, np.uint8))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["xd", "wt"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "os", "oz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "os", "oz"], ["y"])]
    return model(nodes, {"x": ([1, 50, 32], TensorProto.FLOAT)}, ["y"], inits)


def test_a_torch_quantized_linear_runs_on_int8_weights() -> None:
    compiled = compile_model(_torch_linear())
    kernels = compiled.inspect()["kernels"]  # without VNNI: a 1x1 convolution, maybe split
    compute = [k for k in kernels if k["primitive"] in ("matmul", "convolution")]
    assert compute and all(k["src_dtype"] == "u8" for k in compute), compute
    assert all("s8" in k["weights_layout"] for k in compute), compute
    x = np.random.default_rng(6).standard_normal((1, 50, 32)).astype(F)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"],
                                  run_ort(_torch_linear(), {"x": x}, optimized=False)[0])
