"""Importing single-op ONNX models: each op lands in the right IR op and attribute class,
with shapes that match onnx.shape_inference / ONNX Runtime."""

from __future__ import annotations

import math

import numpy as np
import pytest
from island_helpers import assert_island
from onnx import TensorProto, helper
from onnx_builders import infer_onnx, init, model, run_ort, run_reference, single

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import DType, Graph, Node, Op
from qfuse.ir.ops import (
    AlphaAttrs,
    AxisAttrs,
    BatchNormAttrs,
    ClipAttrs,
    ConvAttrs,
    ConvTransposeAttrs,
    GeluApprox,
    GeluAttrs,
    GemmAttrs,
    HardSigmoidAttrs,
    LayerNormAttrs,
    PoolAttrs,
)

F = np.float32


def f32(value: float) -> float:
    """ONNX float attributes are float32: 0.2 arrives as 0.20000000298023224."""
    return float(np.float32(value))


def only(g: Graph) -> Node:
    nodes = list(g)
    assert len(nodes) == 1, [str(n) for n in nodes]
    return nodes[0]


def out_shape(g: Graph) -> tuple[int, ...]:
    return g.info(g.outputs[0]).shape


def weights(*shape: int, name: str = "w") -> object:
    return init(name, np.random.default_rng(0).standard_normal(shape).astype(F))


# ------------------------------------------------------------------------------------- Conv
@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize(("size", "k", "s", "d"), [(10, 3, 2, 1), (9, 4, 3, 1), (11, 3, 1, 2),
                                                   (7, 2, 2, 2)])
def test_conv_auto_pad_matches_onnx_and_onnxruntime(auto_pad: str, size: int, k: int, s: int,
                                                    d: int) -> None:
    w = weights(4, 2, k, k)
    m = single("Conv", [1, 2, size, size + 1], [w], strides=[s, s], dilations=[d, d],
               auto_pad=auto_pad)
    g = import_model(m)
    node = only(g)
    assert node.op is Op.CONV and isinstance(node.attrs, ConvAttrs)
    assert node.attrs.kernel_shape == (k, k) and node.origin == ["n"]
    assert out_shape(g) == infer_onnx(m)[0]
    # The explicit pads compute the same numbers as auto_pad (ONNX Runtime refuses SAME with
    # dilation, onnx.reference takes it).
    explicit = single("Conv", [1, 2, size, size + 1], [w], strides=[s, s], dilations=[d, d],
                      pads=list(node.attrs.pads))
    x = np.random.default_rng(1).standard_normal((1, 2, size, size + 1)).astype(F)
    run = run_reference if d > 1 and auto_pad.startswith("SAME") else run_ort
    np.testing.assert_array_equal(run(m, {"x": x})[0], run(explicit, {"x": x})[0])


def test_conv_attributes_groups_and_bias() -> None:
    m = single("Conv", [2, 8, 9, 9], [weights(8, 1, 3, 3), weights(8, name="b")], group=8,
               pads=[1, 2, 1, 2], strides=[2, 1], dilations=[1, 2])
    node = only(import_model(m))
    assert node.attrs == ConvAttrs((3, 3), (2, 1), (1, 2, 1, 2), (1, 2), 8)
    assert node.inputs == ["x", "w", "b"]
    assert out_shape(import_model(m)) == infer_onnx(m)[0]


def test_conv_1d_and_kernel_shape_attribute() -> None:
    m = single("Conv", [1, 3, 20], [weights(5, 3, 4)], kernel_shape=[4])
    g = import_model(m)
    assert only(g).attrs.kernel_shape == (4,) and out_shape(g) == (1, 5, 17)


@pytest.mark.parametrize("kw", [
    {"strides": [2, 2], "output_padding": [1, 1], "pads": [1, 1, 1, 1]},
    {"strides": [2, 2], "output_shape": [10, 10]},
    {"strides": [2, 2], "output_shape": [9, 10]},
    {"strides": [2, 3], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 3], "auto_pad": "SAME_LOWER"},
    {"strides": [2, 2], "auto_pad": "VALID", "group": 2},
    {"strides": [3, 3], "dilations": [2, 1], "output_padding": [1, 2]},
])
def test_conv_transpose_pads_match_onnxruntime(kw: dict) -> None:
    group = kw.get("group", 1)
    w = weights(4, 4 // group, 3, 3)
    m = single("ConvTranspose", [1, 4, 5, 5], [w], **kw)
    g = import_model(m)
    node = only(g)
    assert node.op is Op.CONV_TRANSPOSE and isinstance(node.attrs, ConvTransposeAttrs)
    a = node.attrs
    explicit = single("ConvTranspose", [1, 4, 5, 5], [w], strides=list(a.strides),
                      pads=list(a.pads), dilations=list(a.dilations),
                      output_padding=list(a.output_padding), group=a.group)
    x = np.random.default_rng(2).standard_normal((1, 4, 5, 5)).astype(F)
    want = run_ort(m, {"x": x})[0]
    assert out_shape(g) == want.shape
    np.testing.assert_array_equal(want, run_ort(explicit, {"x": x})[0])


def test_conv_transpose_output_shape_too_large_is_an_island() -> None:
    m = single("ConvTranspose", [1, 4, 5, 5], [weights(4, 2, 3, 3)], strides=[2, 2],
               output_shape=[20, 20])
    assert_island(m, {"ConvTranspose"}, r"^output_shape", run=False)


# ----------------------------------------------------------------------------- Gemm, MatMul
@pytest.mark.parametrize(("ta", "tb"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm(ta: int, tb: int) -> None:
    a = [6, 3] if ta else [3, 6]
    b = weights(*([4, 6] if tb else [6, 4]))
    m = single("Gemm", a, [b, weights(4, name="c")], alpha=0.5, beta=2.0, transA=ta, transB=tb)
    g = import_model(m)
    assert only(g).attrs == GemmAttrs(0.5, 2.0, bool(ta), bool(tb))
    assert out_shape(g) == (3, 4) == infer_onnx(m)[0]


def test_matmul_batched() -> None:
    m = single("MatMul", [2, 1, 3, 5], inputs=["x", "x2"], opset=17)
    m = model([helper.make_node("MatMul", ["x", "y0"], ["y"], name="n")],
              {"x": ([2, 1, 3, 5], TensorProto.FLOAT), "y0": ([4, 5, 6], TensorProto.FLOAT)},
              ["y"])
    g = import_model(m)
    assert only(g).op is Op.MATMUL and out_shape(g) == (2, 4, 3, 6) == infer_onnx(m)[0]


# -------------------------------------------------------------------------- elementwise
@pytest.mark.parametrize(("op_type", "op"), [("Add", Op.ADD), ("Sub", Op.SUB), ("Mul", Op.MUL),
                                             ("Div", Op.DIV)])
def test_binary_with_a_constant(op_type: str, op: Op) -> None:
    m = single(op_type, [2, 3, 4], [init("c", np.ones((3, 1), F))])
    g = import_model(m)
    node = only(g)
    assert node.op is op and node.inputs == ["x", "c"] and g.constant("c") is not None
    assert out_shape(g) == (2, 3, 4)


def test_sum_of_three() -> None:
    m = model([helper.make_node("Sum", ["a", "b", "c"], ["y"], name="n")],
              {k: ([2, 3], TensorProto.FLOAT) for k in "abc"}, ["y"])
    node = only(import_model(m))
    assert node.op is Op.SUM and node.inputs == ["a", "b", "c"]


@pytest.mark.parametrize(("op_type", "op", "kw", "attrs"), [
    ("Relu", Op.RELU, {}, None),
    ("Sigmoid", Op.SIGMOID, {}, None),
    ("Tanh", Op.TANH, {}, None),
    ("HardSwish", Op.HARD_SWISH, {}, None),
    ("LeakyRelu", Op.LEAKY_RELU, {"alpha": 0.2}, AlphaAttrs(f32(0.2))),
    ("LeakyRelu", Op.LEAKY_RELU, {}, AlphaAttrs(0.01)),
    ("HardSigmoid", Op.HARD_SIGMOID, {"alpha": 0.1}, HardSigmoidAttrs(f32(0.1), 0.5)),
    ("Identity", Op.IDENTITY, {}, None),
])
def test_activations(op_type: str, op: Op, kw: dict, attrs: object) -> None:
    node = only(import_model(single(op_type, [2, 3], **kw)))
    assert node.op is op
    if attrs is not None:
        assert node.attrs == attrs


def test_prelu() -> None:
    m = single("PRelu", [1, 3, 4, 4], [init("slope", np.full((3, 1, 1), 0.1, F))])
    node = only(import_model(m))
    assert node.op is Op.PRELU and node.inputs == ["x", "slope"]


@pytest.mark.parametrize(("bounds", "expected"), [
    ((0.0, 6.0), ClipAttrs(0.0, 6.0)),
    ((None, 6.0), ClipAttrs(-math.inf, 6.0)),
    ((-1.0, None), ClipAttrs(-1.0, math.inf)),
    ((None, None), ClipAttrs()),
])
def test_clip_bounds_from_constant_inputs(bounds: tuple[float | None, float | None],
                                          expected: ClipAttrs) -> None:
    inits, names = [], ["x"]
    for name, value in zip(("lo", "hi"), bounds, strict=True):
        if value is None:
            names.append("")
        else:
            inits.append(init(name, np.array(value, F)))
            names.append(name)
    while names[-1] == "" and len(names) > 1:
        names.pop()
    node = only(import_model(single("Clip", [2, 3], inits, inputs=names, opset=13)))
    assert node.op is Op.CLIP and node.attrs == expected and node.inputs == ["x"]


@pytest.mark.parametrize("bounds", [("lo", ""), ("", "hi"), ("lo", "hi"), ("lo", "six")])
def test_clip_with_a_computed_bound_is_a_binary_max_and_min(bounds: tuple[str, str]) -> None:
    """ONNX's Clip is ``min(max(x, lo), hi)``: a bound computed at run time (a log-mel floor,
    ``max(x) − 80``: openWakeWord's mel, an island before) is a Max / Min by that one value
    (oneDNN's binary_max / binary_min), a constant one a Clip. onnxruntime's values."""
    import qfuse

    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0, name="rmax"),
             helper.make_node("Sub", ["mx", "eighty"], ["lo"], name="sub"),
             helper.make_node("Add", ["mx", "eighty"], ["hi"], name="add"),
             helper.make_node("Clip", ["x", *bounds], ["y"], name="clip")]
    m = model(nodes, {"x": ([1, 4, 9], TensorProto.FLOAT)}, ["y"],
              [init("eighty", np.array(1.5, F)), init("six", np.array(6.0, F))], opset=13)
    ops = [n.op for n in import_model(m) if n.op not in (Op.REDUCE_MAX, Op.SUB, Op.ADD)]
    assert Op.ISLAND not in ops and (Op.MAX in ops) == (bounds[0] == "lo"), ops
    x = np.random.default_rng(0).normal(0, 2, (1, 4, 9)).astype(F)
    compiled = qfuse.compile_model(m)
    assert "island" not in [k["primitive"] for k in compiled.inspect()["kernels"]]
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], run_ort(m, {"x": x})[0])


def test_max_min_of_two_tensors_are_binary_primitives() -> None:
    """Max / Min of two float32 tensors (``torch.maximum``): oneDNN's binary_max / binary_min,
    the operands in the model's order (a tie of ±0 gives the second, as numpy's maximum);
    the reference's values. A NaN operand first: numpy gives NaN, oneDNN's max the other
    operand (docs/numerics.md)."""
    import qfuse

    nodes = [helper.make_node("Max", ["x", "w"], ["a"], name="max"),
             helper.make_node("Min", ["a", "v"], ["y"], name="min")]
    m = model(nodes, {"x": ([2, 3, 5], TensorProto.FLOAT), "w": ([3, 1], TensorProto.FLOAT),
                      "v": ([2, 3, 5], TensorProto.FLOAT)}, ["y"], opset=13)
    assert [n.op for n in import_model(m)] == [Op.MAX, Op.MIN]
    rng = np.random.default_rng(1)
    feeds = {k: rng.normal(0, 1, s).astype(F) for k, s in
             (("x", (2, 3, 5)), ("w", (3, 1)), ("v", (2, 3, 5)))}
    feeds["x"][0, 0, :2], feeds["w"][0, 0] = (-0.0, 0.0), 0.0
    compiled = qfuse.compile_model(m)
    kinds = [(k["primitive"], k["impl"][:3]) for k in compiled.inspect()["kernels"]]
    assert ("binary", "jit") in kinds and "numpy" not in [k for k, _ in kinds], kinds
    got = compiled.run(feeds)["y"]
    want = run_reference(m, feeds)[0]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


C = float(F(-0.4))


@pytest.mark.parametrize(("op", "inputs", "expected"), [
    ("Max", ["x", "c"], ClipAttrs(C, math.inf)), ("Max", ["c", "x"], ClipAttrs(C, math.inf)),
    ("Min", ["x", "c"], ClipAttrs(-math.inf, C)), ("Max", ["x", "z"], ClipAttrs(0.0, math.inf)),
])
def test_max_min_of_a_tensor_and_one_constant_is_a_clip(op: str, inputs: list[str],
                                                        expected: ClipAttrs) -> None:
    """tf.maximum(x, c) (openWakeWord's embedding model: 19 islands before); the same values as
    onnxruntime's Max / Min."""
    inits = [init("c", np.full((1, 1, 1), -0.4, F)), init("z", np.array(0.0, F))]
    m = single(op, [2, 3, 4], inits, inputs=inputs, opset=13)
    node = only(import_model(m))
    assert node.op is Op.CLIP and node.attrs == expected and node.inputs == ["x"]
    import qfuse

    x = np.random.default_rng(0).normal(0, 1, (2, 3, 4)).astype(F)
    np.testing.assert_array_equal(qfuse.compile_model(m).run({"x": x})["y"],
                                  run_ort(m, {"x": x})[0])


@pytest.mark.parametrize("case", ["zero first", "three tensors", "per-channel constant"])
def test_other_max_min_are_islands(case: str) -> None:
    inits = {"zero first": [init("z", np.array(0.0, F))], "three tensors": [],
             "per-channel constant": [init("c", np.full((3, 1), 0.5, F))]}[case]
    inputs = {"zero first": ["z", "x"], "three tensors": ["x", "w", "v"],
              "per-channel constant": ["x", "c"]}[case]
    feeds = {"x": ([2, 3, 4], TensorProto.FLOAT)}
    if case == "three tensors":
        feeds["w"] = feeds["v"] = ([2, 3, 4], TensorProto.FLOAT)
    m = model([helper.make_node("Max", inputs, ["y"], name="max")], feeds, ["y"], inits)
    assert_island(m, {"Max"}, r"no native lowering", run=False)


@pytest.mark.parametrize(("approximate", "mode"), [("none", GeluApprox.NONE),
                                                   ("tanh", GeluApprox.TANH)])
def test_gelu_op(approximate: str, mode: GeluApprox) -> None:
    node = only(import_model(single("Gelu", [2, 8], opset=20, approximate=approximate)))
    assert node.op is Op.GELU and node.attrs == GeluAttrs(mode)


# ------------------------------------------------------------------------- normalization
def test_softmax_opset13_any_axis() -> None:
    node = only(import_model(single("Softmax", [2, 3, 4], opset=13, axis=1)))
    assert node.attrs == AxisAttrs(1)
    assert only(import_model(single("Softmax", [2, 3, 4], opset=13))).attrs == AxisAttrs(2)


@pytest.mark.parametrize(("shape", "axis", "ok"), [
    ([2, 5], 1, True), ([2, 3, 4], 2, True), ([2, 1, 4], 1, True), ([2, 3, 4], -1, True),
    ([2, 3, 4], 1, False), ([2, 3, 4], 0, False),
])
def test_softmax_opset11_only_when_it_is_a_last_axis_softmax(shape: list[int], axis: int,
                                                             ok: bool) -> None:
    m = single("Softmax", shape, opset=11, axis=axis)
    if ok:
        assert only(import_model(m)).attrs == AxisAttrs(len(shape) - 1)
    else:
        assert_island(m, {"Softmax"}, r"^opset 11 Softmax")


def test_layer_norm() -> None:
    m = single("LayerNormalization", [2, 5, 8], [weights(8, name="g"), weights(8, name="b")],
               axis=-1, epsilon=1e-6)
    node = only(import_model(m))
    assert node.attrs == LayerNormAttrs(2, f32(1e-6)) and node.inputs == ["x", "g", "b"]


def test_layer_norm_mean_output_used_is_an_island() -> None:
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y", "mean"], name="ln")
    m = model([node], {"x": ([2, 8], TensorProto.FLOAT)}, ["y", "mean"], [weights(8, name="g")])
    assert_island(m, {"LayerNormalization"}, r"^output 'mean'")


def test_batch_norm() -> None:
    params = [weights(3, name=n) for n in ("s", "b", "m")] + [init("v", np.ones(3, F))]
    node = only(import_model(single("BatchNormalization", [1, 3, 4, 4], params, epsilon=1e-3)))
    assert node.op is Op.BATCH_NORM and node.attrs == BatchNormAttrs(f32(1e-3))


def test_batch_norm_training_is_unsupported() -> None:
    params = [weights(3, name=n) for n in ("s", "b", "m")] + [init("v", np.ones(3, F))]
    m = single("BatchNormalization", [1, 3, 4, 4], params, training_mode=1, opset=15)
    with pytest.raises(UnsupportedModelError, match="training_mode=1 .*; as a float island: "):
        import_model(m)  # training mode needs the running mean / var outputs: no types


# ------------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("kw", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3, 2], "strides": [3, 1], "auto_pad": "SAME_LOWER"},
])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pooling_matches_onnxruntime(op_type: str, kw: dict) -> None:
    m = single(op_type, [1, 2, 10, 11], opset=19, **kw)
    g = import_model(m)
    node = only(g)
    assert isinstance(node.attrs, PoolAttrs) and node.attrs.ceil_mode == bool(kw.get("ceil_mode"))
    x = np.random.default_rng(3).standard_normal((1, 2, 10, 11)).astype(F)
    want = run_ort(m, {"x": x})[0]
    assert out_shape(g) == want.shape
    a = node.attrs
    explicit = single(op_type, [1, 2, 10, 11], opset=19, kernel_shape=list(a.kernel_shape),
                      strides=list(a.strides), pads=list(a.pads), dilations=list(a.dilations),
                      ceil_mode=int(a.ceil_mode))
    np.testing.assert_array_equal(want, run_ort(explicit, {"x": x})[0])


def test_average_pool_count_include_pad() -> None:
    m = single("AveragePool", [1, 1, 4, 4], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               count_include_pad=1)
    assert only(import_model(m)).attrs.count_include_pad is True


def test_max_pool_indices_used_is_unsupported_unused_is_dropped() -> None:
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], name="mp", kernel_shape=[2, 2])
    m = model([node], {"x": ([1, 1, 4, 4], TensorProto.FLOAT)}, ["y", "idx"])
    assert_island(m, {"MaxPool"}, r"^output 'idx' \(Indices")
    m = model([node], {"x": ([1, 1, 4, 4], TensorProto.FLOAT)}, ["y"])
    assert only(import_model(m)).outputs == ["y"]


def test_global_average_pool() -> None:
    g = import_model(single("GlobalAveragePool", [2, 3, 5, 7]))
    assert only(g).op is Op.GLOBAL_AVG_POOL and out_shape(g) == (2, 3, 1, 1)


def test_dropout_inference_and_mask() -> None:
    node = only(import_model(single("Dropout", [2, 3], opset=13)))
    assert node.op is Op.DROPOUT and node.inputs == ["x"]
    n = helper.make_node("Dropout", ["x"], ["y", "mask"], name="do")
    m = model([n], {"x": ([2], TensorProto.FLOAT)}, ["y", "mask"], opset=13)
    assert_island(m, {"Dropout"}, r"^output 'mask'")


def test_cast_of_a_runtime_value() -> None:
    node = only(import_model(single("Cast", [2, 3], to=TensorProto.INT32)))
    assert node.op is Op.CAST and node.attrs.to is DType.S32
    with pytest.raises(UnsupportedModelError, match=r"'n' \(Cast\): cast to BFLOAT16.*island.*"
                                                    r"BFLOAT16, which the IR cannot hold"):
        import_model(single("Cast", [2], to=TensorProto.BFLOAT16))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max"])
def test_a_binary_op_reads_a_rank_0_operand_as_one_value(op: str) -> None:
    """x ∘ s with s a float32 scalar computed at run time (rank 0, a host value oneDNN does
    not describe): the binary primitive reads its bytes as one value (LowerContext.ranked)
    instead of the op running in numpy; bit-identical to the reference."""
    import qfuse

    nodes = [helper.make_node("ReduceMax", ["x"], ["s"], keepdims=0, name="rmax"),
             helper.make_node(op, ["x", "s"], ["y"], name="op")]
    m = model(nodes, {"x": ([2, 3, 5], TensorProto.FLOAT)}, ["y"], opset=13)
    compiled = qfuse.compile_model(m)
    (kernel,) = [k for k in compiled.inspect()["kernels"] if k["node"] == "op"]
    assert kernel["primitive"] == "binary", kernel
    x = np.random.default_rng(2).normal(0, 1, (2, 3, 5)).astype(F)
    got, want = compiled.run({"x": x})["y"], run_reference(m, {"x": x})[0]
    assert np.array_equal(got.view(np.uint32), want.astype(F).view(np.uint32))
