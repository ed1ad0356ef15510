"""examples/realzoo/quantize.py ``VARIANTS``: the other options users set each give a model
onnxruntime loads, and qfuse compiles every one: int8 convolutions (16-bit activations:
float32 ones) without numpy or ``ref:`` kernels (quantize_dynamic's: only its scales and zero
points, computed at run time), outputs within quantization noise of the model run by
onnxruntime without graph optimizations.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qfuse import compile_model
from qfuse.examples.realzoo.quantize import VARIANTS, quantize

SHAPE = (1, 3, 16, 16)


def float_block(residual: bool = True) -> onnx.ModelProto:
    """A MobileNetV3-like block: conv → HardSwish → depthwise conv → HardSwish → 1x1 conv,
    a residual from the first activation (``residual``), global pooling and a linear head.
    Without the residual the depthwise conv is its input's only reader, and NNCF's MIXED
    preset quantizes that input per channel (tests/compiler/test_per_channel_zero_points.py)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal(s).astype(np.float32) * k, n)
             for n, s, k in (("w0", (16, 3, 3, 3), 0.4), ("b0", (16,), 0.3),
                             ("w1", (16, 1, 3, 3), 0.5), ("b1", (16,), 0.3),
                             ("w2", (16, 16, 1, 1), 0.3), ("fc", (16, 10), 0.3))]
    nodes = [h.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             h.make_node("HardSwish", ["c0"], ["a0"]),
             h.make_node("Conv", ["a0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=16),
             h.make_node("HardSwish", ["c1"], ["a1"]),
             h.make_node("Conv", ["a1", "w2"], ["c2"]),
             *([h.make_node("Add", ["c2", "a0"], ["r"])] if residual else []),
             h.make_node("GlobalAveragePool", ["r" if residual else "c2"], ["p"]),
             h.make_node("Flatten", ["p"], ["f"]),
             h.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_quantizes_and_compiles(variant: str, tmp_path) -> None:
    rng = np.random.default_rng(1)
    calibration = [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)]
    model, _ = quantize(float_block(), calibration, variant)
    path = tmp_path / f"{variant}.onnx"
    onnx.save(model, path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = {"x": rng.standard_normal(SHAPE).astype(np.float32)}
    reference = ort.InferenceSession(str(path), options,
                                     providers=["CPUExecutionProvider"]).run(None, x)[0]
    compiled = compile_model(str(path))
    kernels = compiled.inspect()["kernels"]
    assert not [k["name"] for k in kernels if "ref" in k["impl"]]
    numpy_ops = {k["op"] for k in kernels if k["impl"] == "numpy"}
    # quantize_dynamic: each DynamicQuantizeLinear's scale and zero point (two floats in)
    dynamic = variant.startswith("dynamic")
    assert numpy_ops <= ({"DynamicQuantizeLinear"} if dynamic else set()), variant
    # 16-bit activations: float32 convolutions with the fake quantization as post-ops; every
    # other variant's convolutions int8 (u8 weights with a zero point beyond s8 too:
    # passes/weight_zero_point.py)
    src_types = {"f32"} if variant == "qdq-a16" else {"u8", "s8"}
    assert {k["src_dtype"] for k in kernels if k["primitive"] == "convolution"} <= src_types
    ours = compiled.run(x)["y"]
    cosine = float(np.sum(ours * reference) / np.linalg.norm(ours) / np.linalg.norm(reference))
    assert cosine > 0.999, (variant, cosine)
