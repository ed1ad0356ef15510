"""A chain that goes on past its output quantize's dequantize into a float op of another
tensor (passes/fuse_post_ops.py ``_past_dequantize``): NNCF's residual stream, where a block's
branch ``s·x`` is quantized, dequantized and added to the float32 stream that two nodes read
(the next LayerNorm and the next residual Add). The branch's kernel ends at that Add and writes
the float32 sum: one kernel instead of the branch, a dequantize and the Add (PoolFormer-S12
NNCF 238 → 214 kernels, XCiT-N12 NNCF 557 → 529). Bit-exact: the same float32 operations."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from qfuse.compiler.api import compile_model

SHAPE = [1, 8, 6, 6]


def _model() -> onnx.ModelProto:
    inits = [h.make_tensor("ls", TensorProto.FLOAT, [1, 8, 1, 1],
                           np.linspace(0.5, 1.5, 8).tolist()),
             h.make_tensor("s", TensorProto.FLOAT, [], [0.0371]),
             h.make_tensor("z", TensorProto.INT8, [], [0])]
    nodes = [h.make_node("Sub", ["x", "r"], ["d"]),  # a float branch (PoolFormer: pool(x) − x)
             h.make_node("Mul", ["d", "ls"], ["b"]),  # its layer scale
             h.make_node("QuantizeLinear", ["b", "s", "z"], ["bq"]),
             h.make_node("DequantizeLinear", ["bq", "s", "z"], ["bd"]),
             h.make_node("Add", ["r", "bd"], ["stream"]),  # the residual stream, read twice
             h.make_node("Sigmoid", ["stream"], ["y1"]),
             h.make_node("Tanh", ["stream"], ["y2"])]
    graph = h.make_graph(nodes, "stream",
                         [h.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in "xr"],
                         [h.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE)
                          for n in ("y1", "y2")], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("seed", [0, 1])
def test_branch_kernel_writes_the_stream(seed: int) -> None:
    rng = np.random.default_rng(seed)
    feeds = {n: rng.normal(0, 2, SHAPE).astype(np.float32) for n in "xr"}
    fused = compile_model(_model())
    kernels = fused.inspect()["kernels"]
    branch = next(k for k in kernels if "Mul_1" in k["absorbed"])  # (the Sub's own chain)
    assert "Add_4" in branch["absorbed"], [(k["name"], k["absorbed"]) for k in kernels]
    assert not [k for k in kernels if k["name"].startswith("DequantizeLinear")], kernels
    want = compile_model(_model(), mode="unfused").run(feeds)
    got = fused.run(feeds)
    for name in ("y1", "y2"):
        np.testing.assert_array_equal(got[name], want[name])
