"""A compute node followed by more quantized elementwise ops than one oneDNN primitive's 32
post-ops hold (passes/fuse_post_ops.py, CHAIN_POST_OPS): the chain is cut at a quantize, the
rest runs as kernels of their own. A valid model, which lowering used to reject ("a post-op
chain holds at most 32 entries": fuzz seed 576185, a float32 MatMul; here an int8 Conv)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import qfuse
from qfuse.runtime.onednn.attr import MAX_POST_OPS
from tests.compiler.lower_helpers import onnx_qdq


def _init(name: str, value: object, dtype: type) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _conv_then_activations(ops: list[str]) -> onnx.ModelProto:
    """x → Q/DQ → Conv 3x3 (s8 weights per channel) → Q/DQ, then each op of ``ops`` with a
    Q/DQ pair after it."""
    rng = np.random.default_rng(3)
    nodes, inits = [], [_init("w_q", rng.integers(-90, 90, (8, 4, 3, 3)), np.int8),
                        _init("w_s", rng.uniform(0.002, 0.01, 8), np.float32),
                        _init("w_z", np.zeros(8), np.int8)]

    def qdq(src: str, dst: str, scale: float, zp: int) -> None:
        onnx_qdq(nodes, inits, src, dst, scale, zp)

    qdq("x", "xd", 0.04, 128)
    nodes.append(helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=0))
    nodes.append(helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1]))
    prev = "c"
    for i, op in enumerate(ops):
        qdq(prev, f"d{i}", 0.03 if i == 0 else 1 / 255, 128 if i == 0 else 0)
        nodes.append(helper.make_node(op, [f"d{i}"], [f"a{i}"]))
        prev = f"a{i}"
    qdq(prev, "y", 1 / 255, 0)
    graph = helper.make_graph(
        nodes, "long_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            [1, 4, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 10, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_conv_chain_past_32_post_ops_compiles_in_kernels_that_fit() -> None:
    model = _conv_then_activations(["Sigmoid", "Relu", "Sigmoid", "Tanh", "Sigmoid",
                                    "Relu", "Sigmoid", "Sigmoid"])
    compiled = qfuse.compile_model(model)
    kernels = compiled.inspect()["kernels"]
    conv = [k for k in kernels if k["op"] == "Conv"]  # without VNNI: halves (no_vnni.py)
    assert all(k["src_dtype"] == "u8" for k in conv if k["primitive"] == "convolution"), conv
    assert all(len(k["post_ops"]) <= MAX_POST_OPS for k in kernels)
    assert max(len(k["post_ops"]) for k in conv) > 10  # the conv keeps the part that fits
    x = np.random.default_rng(0).standard_normal((1, 4, 10, 10)).astype(np.float32) * 2
    got = compiled.run({"x": x})["y"]
    unfused = qfuse.compile_model(model, mode="unfused").run({"x": x})["y"]
    np.testing.assert_array_equal(got, unfused)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= 1 / 255 + 1e-7  # within 1 LSB (sigmoid's ulps)
