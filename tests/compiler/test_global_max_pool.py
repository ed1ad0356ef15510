"""GlobalMaxPool: imported as a native op (no float island), lowered to one oneDNN max pooling
over all spatial dims, int8 when a DequantizeLinear feeds it; bit-exact with onnxruntime (a
max selects one of its inputs: nothing rounds)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import qfuse
from qfuse.compiler.api import import_graph
from qfuse.ir import Op


def _model(quantized: bool, shape: tuple[int, ...]) -> onnx.ModelProto:
    out_shape = [*shape[:2], *[1] * (len(shape) - 2)]
    if not quantized:
        nodes = [helper.make_node("GlobalMaxPool", ["x"], ["y"], name="gmp")]
        inits = []
    else:
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
                 helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
                 helper.make_node("GlobalMaxPool", ["xd"], ["p"], name="gmp"),
                 helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"], name="q_out"),
                 helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["y"], name="dq_out")]
        inits = [nh.from_array(np.array(0.05, np.float32), "s"),
                 nh.from_array(np.array(120, np.uint8), "z")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("quantized", [False, True], ids=["f32", "qdq"])
@pytest.mark.parametrize("shape", [(1, 16, 7, 9), (2, 5, 11), (1, 8, 3, 4, 5)])
@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_global_max_pool_is_native_and_exact(quantized: bool, shape: tuple[int, ...],
                                             mode: str) -> None:
    model = _model(quantized, shape)
    graph = import_graph(model)
    assert [n.op for n in graph.topo_order() if n.op is Op.GLOBAL_MAX_POOL] == [Op.GLOBAL_MAX_POOL]
    assert not any(n.op is Op.ISLAND for n in graph.topo_order())
    x = np.random.default_rng(0).normal(0, 3, shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    compiled = qfuse.compile_model(model, mode=mode)
    got = compiled.run({"x": x})["y"]
    assert got.shape == want.shape
    assert np.array_equal(got, want)  # 0 LSB
    info = compiled.inspect()
    assert not info.get("islands")
    if quantized and mode == "fused" and len(shape) == 4:  # int8 pooling reads the u8 tensor
        pools = [k for k in info["kernels"] if "pooling" in str(k.get("primitive", k))]
        assert pools and all(str(k.get("src_dtype")) == "u8" for k in pools), pools


def test_reference_mode_matches_onnxruntime() -> None:
    model = _model(False, (1, 3, 5, 5))
    x = np.random.default_rng(1).normal(size=(1, 3, 5, 5)).astype(np.float32)
    got = qfuse.compile_model(model, mode="reference").run({"x": x})["y"]
    assert np.array_equal(got, x.max(axis=(2, 3), keepdims=True))
