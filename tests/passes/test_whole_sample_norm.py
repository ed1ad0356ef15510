"""GroupNorm(1) as torch exports it — Reshape to [N, 1, -1], InstanceNormalization, Reshape
back — normalizes each sample itself (passes/whole_sample_norm.py), and the norm reads and
writes the channels-last bytes of the convolutions around it (compiler/lower/lower_norm.py
``_sample_layout``): no reorder into and out of a row-major row. Quantized the two ways users
quantize: NNCF (a FakeQuantize, here its Q/DQ pair, after the norm only) and quantize_static
(a Q/DQ pair on each side of it)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qfuse
from qfuse.compiler.api import import_graph
from qfuse.ir import Op
from qfuse.ir.postops import ComposerOptions
from qfuse.passes import whole_sample_norm
from qfuse.passes.base import PassContext

C, SIDE = 16, 12


def _model(batch: int = 1, groups: int = 1, both_sides: bool = False,
           back: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """x → Q/DQ → Conv 3x3 → Q/DQ → GroupNorm(groups) (Q/DQ after the norm; before it too
    when ``both_sides``) → γ, β → Q/DQ → Conv 1x1 → Q/DQ (u8 activations)."""
    rng = np.random.default_rng(0)
    shape = (batch, C, SIDE, SIDE)

    def const(name: str, value: object, dtype: object = np.float32) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, dtype), name)

    w1 = rng.integers(-100, 100, (C, 3, 3, 3)).astype(np.int8)
    w2 = rng.integers(-100, 100, (8, C, 1, 1)).astype(np.int8)
    inits = [const("s_in", 0.03), const("z", 128, np.uint8), const("s_c", 0.05),
             const("s_n", 0.04), const("s_a", 0.05), const("s_o", 0.2),
             const("w1q", w1, np.int8), const("w1s", rng.uniform(1e-3, 3e-3, C)),
             const("w1z", np.zeros(C), np.int8), const("w2q", w2, np.int8),
             const("w2s", rng.uniform(1e-3, 3e-3, 8)), const("w2z", np.zeros(8), np.int8),
             const("b1", rng.standard_normal(C)),
             const("g_shape", [batch, groups, -1], np.int64),
             const("x_shape", back or shape, np.int64),
             const("one", np.ones(groups)), const("zero", np.zeros(groups)),
             const("gamma", rng.uniform(0.5, 1.5, (C, 1, 1))),
             const("beta", rng.uniform(-0.5, 0.5, (C, 1, 1)))]

    def qdq(src: str, scale: str, dst: str) -> list[onnx.NodeProto]:
        return [helper.make_node("QuantizeLinear", [src, scale, "z"], [f"{dst}_q"]),
                helper.make_node("DequantizeLinear", [f"{dst}_q", scale, "z"], [dst])]

    nodes = [*qdq("x", "s_in", "xd"),
             helper.make_node("DequantizeLinear", ["w1q", "w1s", "w1z"], ["w1"], axis=0),
             helper.make_node("DequantizeLinear", ["w2q", "w2s", "w2z"], ["w2"], axis=0),
             helper.make_node("Conv", ["xd", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             *qdq("c1", "s_c", "c1d"),
             helper.make_node("Reshape", ["c1d", "g_shape"], ["r"])]
    src = "r"
    if both_sides:
        nodes += qdq("r", "s_c", "rd")
        src = "rd"
    nodes += [helper.make_node("InstanceNormalization", [src, "one", "zero"], ["n"],
                               epsilon=1e-5),
              *qdq("n", "s_n", "nd"),
              helper.make_node("Reshape", ["nd", "x_shape"], ["n4"]),
              helper.make_node("Mul", ["n4", "gamma"], ["m"]),
              helper.make_node("Add", ["m", "beta"], ["a"]),
              *qdq("a", "s_a", "ad"),
              helper.make_node("Conv", ["ad", "w2"], ["c2"]),
              *qdq("c2", "s_o", "y")]
    graph = helper.make_graph(
        nodes, "group_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, 3, SIDE, SIDE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (batch, 8, *(back or shape)[2:]))],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _rewritten(model: onnx.ModelProto) -> tuple[int, list]:
    graph = import_graph(model)
    changed = whole_sample_norm.run(graph, PassContext())
    return changed, graph.topo_order()


@pytest.mark.parametrize("both_sides", [False, True])
def test_group_norm_of_one_group_normalizes_the_sample(both_sides: bool) -> None:
    changed, nodes = _rewritten(_model(both_sides=both_sides))
    assert changed == 1
    assert not [n for n in nodes if n.op is Op.RESHAPE]
    [norm] = [n for n in nodes if n.op is Op.LAYER_NORM]
    assert norm.attrs.axis == 1


@pytest.mark.parametrize("kwargs", [{"groups": 2}, {"back": (1, C, SIDE * SIDE, 1)}])
def test_other_groupings_and_shapes_stay(kwargs: dict) -> None:
    """Two groups normalize channel groups, not the sample; a Reshape back to another shape
    is not the sample's own."""
    changed, nodes = _rewritten(_model(**kwargs))
    assert changed == 0
    assert len([n for n in nodes if n.op is Op.RESHAPE]) == 2


@pytest.mark.parametrize(("batch", "both_sides"), [(1, False), (1, True), (2, False)])
def test_norm_runs_in_the_convolutions_layout(batch: int, both_sides: bool) -> None:
    model = _model(batch=batch, both_sides=both_sides)
    compiled = qfuse.compile_model(model)
    kernels = compiled.inspect()["kernels"]
    [norm] = [k for k in kernels if k["primitive"] == "layer_normalization"
              and "whole_sample_norm" in k["optimizations"]]
    assert norm["src_dtype"] == "u8"
    assert not [k for k in kernels if k["role"] == "reorder"], \
        [k["name"] for k in kernels if k["role"] == "reorder"]
    without = qfuse.compile_model(model, composer=ComposerOptions().without(
        "whole_sample_norm"))
    assert [k for k in without.inspect()["kernels"] if k["role"] == "reorder"]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((batch, 3, SIDE, SIDE)).astype(
            np.float32)
        got = compiled.run({"x": x})["y"]
        for want in (session.run(None, {"x": x})[0], without.run({"x": x})["y"]):
            # the moments are summed in the bytes' order: a near-tie may round one step
            # apart (module docstring); one step of the output is 0.2
            steps = np.abs(got - want) / np.float32(0.2)
            assert steps.max() <= 1.0 + 1e-4 and np.mean(steps > 0.5) <= 0.01


def test_a_norm_ending_the_graph_keeps_the_output_name() -> None:
    """The Reshape back writing a graph output stays (removing it would rename the output)."""
    shape = [1, 8, 6, 6]
    inits = [numpy_helper.from_array(np.array([1, 1, -1], np.int64), "g"),
             numpy_helper.from_array(np.array(shape, np.int64), "s"),
             numpy_helper.from_array(np.ones(1, np.float32), "one"),
             numpy_helper.from_array(np.zeros(1, np.float32), "zero")]
    nodes = [helper.make_node("Relu", ["x"], ["r0"]),
             helper.make_node("Reshape", ["r0", "g"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "one", "zero"], ["n"]),
             helper.make_node("Reshape", ["n", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "ends", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for mode in ("fused", "fp32"):
        got = qfuse.compile_model(model, mode=mode).run({"x": x})
        assert list(got) == ["y"], mode
        np.testing.assert_allclose(got["y"], want, rtol=0, atol=1e-5, err_msg=mode)
