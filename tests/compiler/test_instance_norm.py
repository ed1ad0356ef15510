"""InstanceNormalization (compiler/onnx_import/convert_math.py ``instance_norm``): oneDNN's
layer normalization over axis 2, with the per-channel scale and B as Mul / Add when they are
not 1 and 0; before, an onnxruntime island per node (PoolFormer-S12: 24 of them). GroupNorm as
torch exports it (Reshape to [N, G, -1], InstanceNormalization with scale 1 and B 0, Reshape
back, the affine Mul / Add), quantized: within 1 LSB of onnxruntime, nearly all identical
(oneDNN's normalization differs from onnxruntime's in float ulps, so a near-tie may round one
step apart; measured here: within 2.4e-7 in float32 on inputs of magnitude 1 to 10).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qfuse
from qfuse.compiler.api import import_graph
from qfuse.ir import Op

MODES = ("fused", "unfused", "fp32", "reference")


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _instance_norm(shape: tuple[int, ...], affine: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    c = shape[1]
    scale = rng.standard_normal(c).astype(np.float32) if affine else np.ones(c, np.float32)
    bias = rng.standard_normal(c).astype(np.float32) if affine else np.zeros(c, np.float32)
    graph = helper.make_graph(
        [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)],
        "instance_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("shape", "affine"), [((1, 4, 5, 6), True), ((2, 3, 7), False),
                                               ((1, 1, 300), False), ((2, 2, 3, 4, 5), True),
                                               ((1, 1, 128, 128), False)])
def test_instance_norm_is_native(shape: tuple[int, ...], affine: bool) -> None:
    model = _instance_norm(shape, affine)
    ops = {n.op for n in import_graph(model).topo_order()}
    assert Op.LAYER_NORM in ops and Op.ISLAND not in ops
    x = (np.random.default_rng(1).standard_normal(shape) * 3 + 1).astype(np.float32)
    want = _ort(model, {"x": x})
    for mode in MODES:
        got = qfuse.compile_model(model, mode=mode).run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=mode)


def _group_norm_qdq(groups: int = 2, channels: int = 8, side: int = 6) -> onnx.ModelProto:
    """x → Q/DQ → GroupNorm as torch exports it → Q/DQ (u8)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(np.asarray(v, t), n) for n, v, t in (
        ("xs", 0.05, np.float32), ("xz", 128, np.uint8), ("ys", 0.02, np.float32),
        ("yz", 128, np.uint8), ("g_shape", [1, groups, -1], np.int64),
        ("x_shape", [1, channels, side, side], np.int64), ("one", np.ones(groups), np.float32),
        ("zero", np.zeros(groups), np.float32),
        ("gamma", rng.uniform(0.5, 1.5, (channels, 1, 1)), np.float32),
        ("beta", rng.uniform(-0.5, 0.5, (channels, 1, 1)), np.float32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("Reshape", ["xd", "g_shape"], ["g"]),
             helper.make_node("InstanceNormalization", ["g", "one", "zero"], ["n"],
                              epsilon=1e-5),
             helper.make_node("Reshape", ["n", "x_shape"], ["n4"]),
             helper.make_node("Mul", ["n4", "gamma"], ["m"]),
             helper.make_node("Add", ["m", "beta"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "ys", "yz"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "ys", "yz"], ["y"])]
    shape = [1, channels, side, side]
    graph = helper.make_graph(nodes, "group_norm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantized_group_norm_within_one_step() -> None:
    model = _group_norm_qdq()
    x = np.random.default_rng(3).standard_normal((1, 8, 6, 6)).astype(np.float32)
    want = _ort(model, {"x": x})
    for mode in ("fused", "unfused"):
        compiled = qfuse.compile_model(model, mode=mode)
        steps = np.abs(compiled.run({"x": x})["y"] - want) / np.float32(0.02)
        assert steps.max() <= 1.0 + 1e-4 and np.mean(steps > 0.5) <= 0.01, mode
        assert not [k for k in compiled.inspect()["kernels"] if k["impl"] == "numpy"]


def test_group_norm_of_one_wide_row_is_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """GroupNorm(1) (PoolFormer): one row of C·H·W = 16384. It runs as 16 rows of 1024 whose
    training-mode statistics a numpy kernel pools (lower_norm.WIDE_ROW), then a layer
    normalization with those statistics; within 1 LSB of onnxruntime as before, and of the
    unsplit row's result (one pass, summed in another order: a near-tie may round apart)."""
    from qfuse.compiler.lower import lower_norm

    model = _group_norm_qdq(groups=1, channels=16, side=32)
    compiled = qfuse.compile_model(model)
    kernels = compiled.inspect()["kernels"]
    [norm] = [k for k in kernels if k["primitive"] == "layer_normalization"
              and "statistics_over_16_parts_per_row" in k["optimizations"]]
    assert norm["impl"].startswith("jit") and norm["src_dtype"] == "u8"
    assert [k["name"].rsplit("/", 1)[-1] for k in kernels if "/" in k["name"]] == [
        "statistics", "pool_statistics"]
    monkeypatch.setattr(lower_norm, "FEW_ROWS", 0)  # the unsplit row, as before
    assert not [k for k in qfuse.compile_model(model).inspect()["kernels"]
                if "statistics" in k["name"]]
    differ = 0
    for seed in range(4):
        x = (np.random.default_rng(seed).standard_normal((1, 16, 32, 32)) * 2
             ).astype(np.float32)
        got = compiled.run({"x": x})["y"]
        for want in (_ort(model, {"x": x}), qfuse.compile_model(model).run({"x": x})["y"]):
            steps = np.abs(got - want) / np.float32(0.02)
            assert steps.max() <= 1.0 + 1e-4 and np.mean(steps > 0.5) <= 0.01
        differ += int(np.sum(steps > 0.5))
    assert differ <= 8, differ  # of 65536 values, against the unsplit row

