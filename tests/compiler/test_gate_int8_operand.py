"""A residual Add of two symmetric int8 branches (compiler/lower/lower_gate.py
``int8_operand``, NNCF's EdgeNeXt / transformer blocks): the gate chain reads both 8-bit
tensors in one binary primitive with SRC_0 / SRC_1 scales (each ``f32(q)·s``, the
DequantizeLinear's own multiply) instead of a dequantize kernel writing the second one in
float32. Bit-exact against the unfused mode; with a zero point the dequantize kernel stays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from qfuse.compiler.api import compile_model
from qfuse.compiler.lower.no_vnni import isa_is_exact

SHAPE = [1, 16, 10, 10]


def _model(zero_point: int) -> onnx.ModelProto:
    """x → Q/DQ → (Conv → Q → Transpose → DQ) + x → Q → DQ → Conv → Q → DQ: the branch's
    Transpose keeps the Add out of the convolution's chain, as EdgeNeXt's NHWC↔NCHW permute."""
    def qdq(n: str, src: str, dst: str) -> list[onnx.NodeProto]:
        return [h.make_node("QuantizeLinear", [src, f"{n}_s", f"{n}_z"], [f"{n}_q"]),
                h.make_node("DequantizeLinear", [f"{n}_q", f"{n}_s", f"{n}_z"], [dst])]

    inits = []
    for name, scale, zp in (("a", 0.0313, 0), ("b", 0.0271, zero_point), ("o", 0.0407, 0),
                            ("p", 0.05, 0), ("w", 0.01, 0)):
        inits += [h.make_tensor(f"{name}_s", TensorProto.FLOAT, [], [scale]),
                  h.make_tensor(f"{name}_z", TensorProto.INT8, [], [zp])]
    rng = np.random.default_rng(4)
    inits.append(h.make_tensor("wq", TensorProto.INT8, [16, 16, 1, 1],
                               rng.integers(-100, 100, 256).tolist()))
    nodes = [*qdq("a", "x", "xd"), h.make_node("DequantizeLinear", ["wq", "w_s", "w_z"], ["wd"]),
             h.make_node("Conv", ["xd", "wd"], ["c"]),
             h.make_node("QuantizeLinear", ["c", "b_s", "b_z"], ["cq"]),
             h.make_node("Transpose", ["cq"], ["ct"], perm=[0, 1, 3, 2]),
             h.make_node("DequantizeLinear", ["ct", "b_s", "b_z"], ["cd"]),
             h.make_node("Add", ["xd", "cd"], ["s"]), *qdq("o", "s", "sd"),
             h.make_node("Conv", ["sd", "wd"], ["c2"]), *qdq("p", "c2", "y")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("zero_point", [0, 3])
def test_symmetric_branches_read_as_int8(zero_point: int) -> None:
    m = _model(zero_point)
    fused = compile_model(m)
    kernels = fused.inspect()["kernels"]
    add = next(k for k in kernels if k["node"] == "Add_7")
    standalone = [k["name"] for k in kernels if k["name"].startswith("DequantizeLinear")]
    if zero_point == 0 and isa_is_exact():  # (without VNNI s8 activations become u8 with
        # zero point 128, decompose_fake_quantize: then the dequantize stays a kernel)
        assert "DequantizeLinear_6" in add["absorbed"] and not standalone, kernels
        assert add["impl"] == "jit:uni" and add["post_ops"][0] == "binary_add", add
    elif zero_point:  # oneDNN's binary takes no zero point: the dequantize stays a kernel
        assert standalone == ["DequantizeLinear_6"], kernels
    unfused = compile_model(m, mode="unfused")
    for seed in range(3):
        x = np.random.default_rng(seed).normal(0, 2, SHAPE).astype(np.float32)
        np.testing.assert_array_equal(fused.run({"x": x})["y"], unfused.run({"x": x})["y"])
