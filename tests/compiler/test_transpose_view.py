"""A Transpose whose input bytes already are its output's row-major layout (an int8 conv's
channels-last NCHW output permuted to NHWC, as ConvNeXt and tf2onnx models do) is a view: no
kernel copies it, and the values are the reference's."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from onnx_builders import init, model, qdq_pair, run_ort

from qfuse.compiler.api import compile_model

F = np.float32


def _conv_then_transpose(perm: list[int]):
    rng = np.random.default_rng(0)
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             *qdq_pair("c", "c", "cd"),
             helper.make_node("Transpose", ["cd"], ["t"], name="transpose", perm=perm),
             helper.make_node("Relu", ["t"], ["y"])]
    inits = [init("xs", np.array(0.02, F)), init("xz", np.array(128, np.uint8)),
             init("w", rng.integers(-60, 61, (16, 8, 3, 3)).astype(np.int8)),
             init("ws", np.array(0.01, F)), init("wz", np.array(0, np.int8)),
             init("cs", np.array(0.05, F)), init("cz", np.array(120, np.uint8))]
    return model(nodes, {"x": ((1, 8, 6, 7), TensorProto.FLOAT)}, ["y"], inits, opset=13)


def test_a_channels_last_tensor_permuted_to_nhwc_is_not_copied() -> None:
    m = _conv_then_transpose([0, 2, 3, 1])
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    assert not [k for k in kernels if k["node"] == "transpose"], kernels
    x = {"x": np.random.default_rng(1).uniform(-2, 2, (1, 8, 6, 7)).astype(F)}
    np.testing.assert_array_equal(compiled.run(x)["y"], run_ort(m, x)[0])


def test_another_permutation_is_copied() -> None:
    m = _conv_then_transpose([0, 3, 2, 1])
    compiled = compile_model(m)
    assert [k for k in compiled.inspect()["kernels"] if k["node"] == "transpose"]
    x = {"x": np.random.default_rng(1).uniform(-2, 2, (1, 8, 6, 7)).astype(F)}
    np.testing.assert_array_equal(compiled.run(x)["y"], run_ort(m, x)[0])
