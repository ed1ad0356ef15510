"""Pattern matching and planning of the emulator, on tiny hand-built QDQ graphs.

Matching and not matching (a QuantizeLinear that roots no pattern says why), kernels that
decline on a failed precondition (and the float path that then runs, equal to the reference
interpreter), the skipping of absorbed nodes, and each framework on a zoo model within a
stated LSB bound of the reference.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.api import import_graph
from qfuse.examples import zoo
from qfuse.runtime.emulate import FRAMEWORKS, Decline, Pattern, emulate, match, plan
from qfuse.runtime.reference import evaluate
from tests.runtime.emulate_models import ConvCase, qdq_conv


def _unary_model(op: str, x_scale: float, y_scale: float, slope: np.ndarray | None = None,
                 **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Q(op(DQ(x))) on a u8 input; PRelu reads DQ(slope_q) with an s8 per-channel slope."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 4, 5, 6)).astype(np.uint8)
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in [
        ("xs", np.float32(x_scale)), ("xz", np.uint8(128)),
        ("ys", np.float32(y_scale)), ("yz", np.uint8(128))]]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"], name="dq_x")]
    inputs = ["xf"]
    if slope is not None:
        inits += [numpy_helper.from_array(slope, "al"),
                  numpy_helper.from_array(np.float32(0.01), "als"),
                  numpy_helper.from_array(np.int8(0), "alz")]
        nodes.append(helper.make_node("DequantizeLinear", ["al", "als", "alz"], ["alf"]))
        inputs.append("alf")
    nodes += [helper.make_node(op, inputs, ["yf"], name="op", **attrs),
              helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"], name="q_y")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.UINT8, list(x.shape))], [helper.make_tensor_value_info(
            "y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model), {"x": x}


def _q(graph, name: str = "q_y"):
    return graph.node(name)


def test_conv_pattern_matches_and_absorbs_its_dequantizes() -> None:
    model, _ = qdq_conv(ConvCase(4, 6, 3, pad=1), seed=0)
    graph = import_graph(model)
    m = match(graph, _q(graph))
    assert not isinstance(m, Decline)
    assert m.pattern is Pattern.COMPUTE and m.op.name == "conv" and m.bias is not None
    assert {n.name for n in m.absorbed} == {"conv", "dq_x", "dq_w", "dq_b"}
    decisions = {fw: plan(graph, fw) for fw in FRAMEWORKS}
    assert all(len(d) == 1 and d[0].integer for d in decisions.values())


def test_quantize_without_pattern_declines_with_reason() -> None:
    model, feeds = _unary_model("MaxPool", 0.02, 0.02, kernel_shape=[2, 2])
    graph = import_graph(model)
    m = match(graph, _q(graph))
    assert isinstance(m, Decline) and "MaxPool" in m.reason and "no integer pattern" in m.reason
    (d,) = plan(graph, "onnxruntime")
    assert not d.integer and d.pattern is None and "no integer pattern" in d.how
    assert np.array_equal(emulate(graph, feeds, "onnxruntime")["y"],
                          evaluate(graph, feeds)["y"])
    # frameworks with their own quantizer apply it to the float path's value
    for fw in ("tflite", "onednn"):
        (d,) = plan(graph, fw)
        assert d.pattern is Pattern.QUANTIZE and d.summary().startswith("quantize:")
        assert not d.integer
        assert np.array_equal(emulate(graph, feeds, fw)["y"], evaluate(graph, feeds)["y"])


def test_bias_at_the_wrong_scale_falls_back_to_float() -> None:
    model, feeds = qdq_conv(ConvCase(4, 6, 3, pad=1), seed=0)
    for t in model.graph.initializer:
        if t.name == "bs":
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 2, "bs"))
    graph = import_graph(model)
    for fw in FRAMEWORKS:
        (d,) = plan(graph, fw)
        assert not d.integer and "bias" in d.how and "s_x·s_w" in d.how
    assert np.array_equal(emulate(graph, feeds, "onnxruntime")["y"], evaluate(graph, feeds)["y"])


def test_keep_false_skips_absorbed_nodes() -> None:
    model, feeds = qdq_conv(ConvCase(4, 6, 3, pad=1), seed=1)
    graph = import_graph(model)
    everything = emulate(graph, feeds, "tflite", keep=True)
    assert {"xf", "wf", "bf", "yf", "y"} <= set(everything)
    # the internal float values are the float path's (the reference interpreter's)
    assert np.array_equal(everything["yf"], evaluate(graph, feeds, keep=True)["yf"])
    outputs = emulate(graph, feeds, "tflite", keep=False)
    assert set(outputs) == {"y"} and np.array_equal(outputs["y"], everything["y"])


def test_relu_is_an_integer_clamp_and_onnxruntime_keeps_a_relu_it_cannot_remove() -> None:
    case = ConvCase(4, 6, 3, pad=1, relu=True)
    model, feeds = qdq_conv(case, seed=2)
    for t in model.graph.initializer:  # zero point 37: ReluQuantFusion cannot drop the Relu
        if t.name == "yzp":
            t.CopyFrom(numpy_helper.from_array(np.uint8(37), "yzp"))
    graph = import_graph(model)
    (ort_decision,) = plan(graph, "onnxruntime")
    assert not ort_decision.integer and "keeps" in ort_decision.how
    (tfl,) = plan(graph, "tflite")
    assert tfl.integer
    plain, _ = qdq_conv(ConvCase(4, 6, 3, pad=1), seed=2)
    for t in plain.graph.initializer:
        if t.name == "yzp":
            t.CopyFrom(numpy_helper.from_array(np.uint8(37), "yzp"))
    with_relu = emulate(graph, feeds, "tflite")["y"]
    without = emulate(import_graph(plain), feeds, "tflite")["y"]
    assert np.array_equal(with_relu, np.maximum(without, 37))


def test_float_fallback_says_why_and_equals_reference() -> None:
    model, feeds = _unary_model("LeakyRelu", 0.02, 0.02, alpha=0.1)
    graph = import_graph(model)
    (d,) = plan(graph, "caffe2")
    assert not d.integer and d.pattern is None and "Caffe2" in d.how
    assert np.array_equal(emulate(graph, feeds, "caffe2")["y"], evaluate(graph, feeds)["y"])
    # oneDNN: the float path too, but quantized by oneDNN's reorder
    (d,) = plan(graph, "onednn")
    assert not d.integer and d.pattern is Pattern.QUANTIZE and "post-op" in d.how


def test_tpu_leaky_relu_needs_equal_scales() -> None:
    model, feeds = _unary_model("LeakyRelu", 0.02, 0.03, alpha=0.1)
    (d,) = plan(import_graph(model), "tpu-mlir")
    assert not d.integer and "S_x == S_y" in d.how
    model, feeds = _unary_model("LeakyRelu", 0.02, 0.02, alpha=0.1)
    graph = import_graph(model)
    (d,) = plan(graph, "tpu-mlir")
    assert d.integer
    got = emulate(graph, feeds, "tpu-mlir")["y"].astype(int)
    assert np.abs(got - evaluate(graph, feeds)["y"].astype(int)).max() <= 1


@pytest.mark.parametrize("framework", ["tflite", "tpu-mlir"])
def test_leaky_relu_and_prelu_within_one_lsb(framework: str) -> None:
    for op, slope, attrs in [("LeakyRelu", None, {"alpha": 0.1}),
                             ("PRelu", np.array([5, 10, 20, 40], np.int8).reshape(4, 1, 1), {})]:
        model, feeds = _unary_model(op, 0.02, 0.02, slope=slope, **attrs)
        graph = import_graph(model)
        (d,) = plan(graph, framework)
        assert d.integer, d.how
        got = emulate(graph, feeds, framework)["y"].astype(int)
        assert np.abs(got - evaluate(graph, feeds)["y"].astype(int)).max() <= 1


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_framework_runs_a_zoo_model(framework: str) -> None:
    """Each framework on mobilenetv2 (conv, depthwise, add, GAP, Gemm): at most 1 LSB off the
    reference on the first quantized tensor of each pattern computed in integers."""
    path = zoo.model_path("mobilenetv2", quantized=True)
    graph = import_graph(path)
    feeds = zoo.sample_inputs(path, 1, seed=2)[0]
    decisions = plan(graph, framework)
    got = emulate(graph, feeds, framework, decisions=decisions)
    ref = evaluate(graph, feeds, keep=True)
    assert any(d.integer for d in decisions)
    first_integer = next(d for d in decisions if d.integer)
    diff = np.abs(got[first_integer.tensor].astype(int) - ref[first_integer.tensor].astype(int))
    assert diff.max() <= 1
    out = graph.outputs[0]
    assert got[out].shape == ref[out].shape


def test_framework_quantizers_round_their_own_way() -> None:
    """A graph input's QuantizeLinear: ONNX divides and rounds half to even, TFLite rounds half
    away from zero, oneDNN's reorder multiplies by f32(1/s) and adds the zero point in f32."""
    s, zp = np.float32(0.1), np.uint8(3)
    inits = [numpy_helper.from_array(np.asarray(s), "s"),
             numpy_helper.from_array(np.asarray(zp), "z")]
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q_y")
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [64])], [helper.make_tensor_value_info(
            "y", TensorProto.UINT8, [64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    g = import_graph(model)
    x = (np.arange(64, dtype=np.float32) * np.float32(0.05)).astype(np.float32)  # k/2 · s
    onnx_q = emulate(g, {"x": x}, "onnxruntime")["y"].astype(int)
    ratio = (x / s).astype(np.float32)
    half_away = np.where(ratio - np.floor(ratio) >= 0.5, np.floor(ratio) + 1, np.floor(ratio))
    assert np.array_equal(emulate(g, {"x": x}, "tflite")["y"].astype(int), half_away + 3)
    inv = np.float32(1) / s
    want = np.rint(((x * inv).astype(np.float32) + np.float32(3)).astype(np.float32))
    assert np.array_equal(emulate(g, {"x": x}, "onednn")["y"].astype(int), want.astype(int))
    assert np.array_equal(onnx_q, np.rint(ratio).astype(int) + 3)
    assert not np.array_equal(onnx_q, half_away + 3)  # the inputs do hit ties
