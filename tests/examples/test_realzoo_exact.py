"""examples/realzoo/exact.py: a QOperator model's QLinearConv / QLinearMatMul / QGemm in QDQ
form compute the exact integer sums requantized (what the ops mean), which ONNX Runtime's
own int8 kernels do not on CPUs without VNNI (int16 saturation)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from qfuse.examples.realzoo.exact import exact_qdq

OPSET = [helper.make_opsetid("", 12), helper.make_opsetid("com.microsoft", 1)]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _requantize(acc: np.ndarray, scale: np.ndarray, zp: int) -> np.ndarray:
    """Exact integer ``acc`` requantized as onnxruntime does (docs/numerics.md), to u8."""
    v = np.clip(acc.astype(np.float32) * scale.astype(np.float32), -zp, 255 - zp)
    return (np.rint(v) + zp).astype(np.uint8)


def _model(node: onnx.NodeProto, x_shape: list[int], y_shape: list[int],
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, y_shape)],
        [nh.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=OPSET)


def _conv_model(w: np.ndarray, bias: np.ndarray, sx: float, sw: np.ndarray, sy: float, zy: int,
                hw: int) -> onnx.ModelProto:
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"],
                            ["y"], name="conv", pads=[1, 1, 1, 1])
    inits = {"sx": np.array(sx, np.float32), "zx": np.array(0, np.uint8), "w": w,
             "sw": sw.astype(np.float32), "zw": np.zeros(len(sw), np.int8),
             "sy": np.array(sy, np.float32), "zy": np.array(zy, np.uint8), "b": bias}
    return _model(node, [1, w.shape[1], hw, hw], [1, w.shape[0], hw, hw], inits)


def _exact_conv(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Integer 3x3 convolution, pads 1, stride 1, in int64."""
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    acc = np.zeros((1, w.shape[0], h, wd), np.int64)
    for i in range(3):
        for j in range(3):
            acc += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd],
                             w[:, :, i, j].astype(np.int64))
    return acc + bias.reshape(1, -1, 1, 1)


def test_qlinear_conv_qdq_form_is_the_exact_integer_conv() -> None:
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    w[0] = 127  # large weights on large inputs: pair sums beyond int16
    bias = rng.integers(-2000, 2000, 4).astype(np.int32)
    sx, sw, sy, zy = 0.02, np.array([0.001, 0.002, 0.0015, 0.003]), 0.5, 128
    model = _conv_model(w, bias, sx, sw, sy, zy, 6)
    x = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    x[:, :, :3] = 255
    acc = _exact_conv(x, w, bias)
    scale = (np.float32(sx) * sw.astype(np.float32)).astype(np.float32) / np.float32(sy)
    want = _requantize(acc, scale.reshape(1, -1, 1, 1), zy)
    got = _run(exact_qdq(model), {"x": x})
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 0  # 0 LSB
    assert {n.op_type for n in exact_qdq(model).graph.node} == {
        "DequantizeLinear", "Conv", "QuantizeLinear"}


def test_onnxruntime_qlinear_conv_saturates_without_vnni() -> None:
    """The reason for exact.py: 8 channels of 255·127 sum to 259080, ORT's int8 kernel on a
    CPU without VNNI adds channel pairs in int16 and gets 4·32767."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    if "avx2" not in flags or "vnni" in flags or "amx" in flags:
        pytest.skip("needs an AVX2 CPU without VNNI")
    w = np.full((1, 8, 3, 3), 0, np.int8)
    w[:, :, 1, 1] = 127
    model = _conv_model(w, np.zeros(1, np.int32), 1.0, np.array([1.0]), 2000.0, 0, 2)
    x = np.full((1, 8, 2, 2), 255, np.uint8)
    assert (_run(model, {"x": x}) == 66).all()  # rint(4·32767 / 2000)
    assert (_run(exact_qdq(model), {"x": x}) == 130).all()  # rint(8·255·127 / 2000)


def test_qgemm_and_qlinear_matmul_qdq_forms_are_exact() -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (2, 16)).astype(np.uint8)
    b = rng.integers(-127, 128, (5, 16)).astype(np.int8)
    c = rng.integers(-3000, 3000, 5).astype(np.int32)
    sa, sb, sy, zy, alpha = 0.03, np.linspace(0.001, 0.003, 5), 0.4, 100, 0.5
    gemm = helper.make_node("QGemm", ["x", "sa", "za", "b", "sb", "zb", "c", "sy", "zy"], ["y"],
                            domain="com.microsoft", alpha=alpha, transB=1, name="gemm")
    inits = {"sa": np.array(sa, np.float32), "za": np.array(3, np.uint8), "b": b,
             "sb": sb.astype(np.float32), "zb": np.zeros(5, np.int8),
             "c": c, "sy": np.array(sy, np.float32), "zy": np.array(zy, np.uint8)}
    got = _run(exact_qdq(_model(gemm, [2, 16], [2, 5], inits)), {"x": a})
    real = (alpha * ((a.astype(np.float64) - 3) * sa) @ (b.astype(np.float64) * sb[:, None]).T
            + c * alpha * sa * sb)
    want = np.clip(np.rint(real / sy) + zy, 0, 255)
    assert np.abs(got.astype(int) - want).max() <= 1  # float32 sums: 1 LSB at near-ties
    assert np.mean(got == want) > 0.99

    mm = helper.make_node("QLinearMatMul", ["x", "sa", "za", "bt", "sb", "zb", "sy", "zy"],
                          ["y"], name="mm")
    inits = {**inits, "bt": np.ascontiguousarray(b.T)}
    got = _run(exact_qdq(_model(mm, [2, 16], [2, 5], inits)), {"x": a})
    real = ((a.astype(np.float64) - 3) * sa) @ (b.T.astype(np.float64) * sb[None, :])
    want = np.clip(np.rint(real / sy) + zy, 0, 255)
    assert np.abs(got.astype(int) - want).max() <= 1
    assert np.mean(got == want) > 0.99


def test_other_nodes_are_kept() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    model = _model(node, [1, 2], [1, 2], {})
    assert [n.op_type for n in exact_qdq(model).graph.node] == ["Relu"]


def test_qlinear_add_qdq_form_rounds_the_real_sum() -> None:
    """Q(DQ(a) + DQ(b)) with ties of the real sum rounded half to even (ONNX)."""
    a = np.arange(256, dtype=np.uint8).reshape(1, 256)
    b = a[:, ::-1].copy()
    add = helper.make_node("QLinearAdd", ["x", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                           domain="com.microsoft", name="add")
    inits = {"sa": np.array(0.5, np.float32), "za": np.array(7, np.uint8), "b": b,
             "sb": np.array(0.25, np.float32), "zb": np.array(100, np.uint8),
             "sc": np.array(1.0, np.float32), "zc": np.array(3, np.uint8)}
    model = _model(add, [1, 256], [1, 256], inits)
    assert [n.op_type for n in exact_qdq(model).graph.node] == [
        "DequantizeLinear", "DequantizeLinear", "Add", "QuantizeLinear"]
    got = _run(exact_qdq(model), {"x": a})
    real = (a.astype(np.float64) - 7) * 0.5 + (b.astype(np.float64) - 100) * 0.25  # k/4
    want = np.clip(np.rint(real) + 3, 0, 255)
    assert np.array_equal(got, want)  # 0 LSB, ties included
