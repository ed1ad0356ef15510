"""fuse_post_ops: the single-consumer chain after a fused compute node.

Numerics (reference interpreter before vs after, fused nodes through
runtime/reference/fused.py): each chain item computes in float32 exactly what the op it
replaces computed, so the rewrite is bit-exact — asserted everywhere except Sigmoid and Tanh,
which the chain evaluates with oneDNN's float32 formula where the op reference computes in
float64 and rounds once (a few float32 ulps apart); behind a quantize that flips at most a
near-tie: asserted ≤ 1 LSB and ≥ 99.9 % identical.
"""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import (
    C,
    add,
    const,
    dq,
    feeds_for,
    fq,
    int8_conv,
    int8_matmul,
    new_graph,
    reference,
    residual_block,
    residual_input,
    run,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.chain import (
    Act,
    Activation,
    PRelu,
    Quantize,
    Residual,
    Scale,
    Shift,
    TensorOperand,
)
from qfuse.ir.ops import (
    AlphaAttrs,
    AxisAttrs,
    ClipAttrs,
    FakeQuantizeAttrs,
    GeluApprox,
    GeluAttrs,
    HardSigmoidAttrs,
    LayerNormAttrs,
    ReshapeAttrs,
)
from qfuse.passes import fuse_bias, fuse_post_ops
from qfuse.passes.composer import compose
from qfuse.passes.post_op_match import depends_on
from qfuse.runtime.numerics import step_diff

SHAPE = (1, C, 5, 5)
def kinds(graph: Graph, node: str = "conv") -> list[type]:
    fused = graph.node(node).fused
    assert fused is not None
    return [type(i) for i in fused.chain]


def check_exact(graph: Graph, *passes: object, changed: int = 1) -> dict[str, np.ndarray]:
    feeds = feeds_for(graph)
    before = reference(graph, feeds)
    outputs = list(graph.outputs)
    total = sum(run(p, graph).changed for p in passes)
    assert total == changed and graph.outputs == outputs
    after = reference(graph, feeds)
    for name in outputs:
        np.testing.assert_array_equal(after[name], before[name])
    return after


def test_golden_bias_relu_quantize() -> None:
    graph = new_graph()
    int8_conv(graph, bias=False)
    add(graph, Op.ADD, ["conv", const(graph, "b", np.ones((1, C, 1, 1)))], "biased")
    add(graph, Op.RELU, ["biased"], "relu")
    fq(graph, "relu", "y", 0.02, 0)
    graph.outputs.append("y")
    check_exact(graph, fuse_bias, fuse_post_ops, changed=2)
    assert kinds(graph) == [Scale, Shift, Activation, Quantize]
    node = graph.producer("y")
    assert node.name == "conv" and graph.info("y").dtype is DType.U8
    assert node.fused.chain[2] == Activation(Act.RELU)
    assert node.fused.absorbed == ["conv", "biased", "relu", "y"]
    assert len(graph) == 1


def test_golden_residual_block() -> None:
    graph = residual_block()
    check_exact(graph, fuse_post_ops)
    assert kinds(graph) == [Scale, Shift, Quantize, Shift, Scale, Residual, Quantize]
    node = graph.producer("y")
    chain = node.fused.chain
    assert chain[3] == Shift.of(-100) and chain[4] == Scale.of(0.04)
    assert chain[5] == Residual(2, float(np.float32(0.03)), 7, DType.U8)
    assert node.inputs[2] == "r" and not graph.has_node("r_dq")  # r read directly
    assert sorted(n.name for n in graph) == ["conv"]


def test_golden_relu_before_residual_add() -> None:
    graph = residual_block(relu=True, via_qdq=False)
    check_exact(graph, fuse_post_ops)
    assert kinds(graph) == [Scale, Shift, Activation, Residual, Quantize]


def test_one_residual_per_chain() -> None:
    graph = new_graph()
    for name in ("r1", "r2"):
        graph.add_input(name, TensorInfo(SHAPE, DType.F32))
    int8_conv(graph)
    add(graph, Op.ADD, ["conv", "r1"], "s1")
    add(graph, Op.ADD, ["r2", "s1"], "y")
    graph.outputs.append("y")
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    result = run(fuse_post_ops, graph)
    assert result.changed == 1 and kinds(graph) == [Scale, Shift, Residual]
    assert graph.node("conv").fused.chain[2] == Residual(2)  # float residual: scale 1, zp 0
    assert [d.node for d in result.declined] == ["y"]
    assert "already has a residual sum" in result.declined[0].reason
    np.testing.assert_array_equal(reference(graph, feeds)["y"], before)


def test_dequantize_without_residual_rolls_back() -> None:
    graph = new_graph()
    int8_conv(graph)
    fq(graph, "conv", "q1", 0.04, 100)
    dq(graph, "q1", "d1")
    gamma = const(graph, "gamma", np.ones((5,), np.float32))
    add(graph, Op.LAYER_NORM, ["d1", gamma], "y", LayerNormAttrs(3))
    graph.outputs.append("y")
    result = run(fuse_post_ops, graph)
    assert result.changed == 1 and kinds(graph) == [Scale, Shift, Quantize]
    assert graph.producer("q1").name == "conv" and graph.has_node("d1")
    assert [d.node for d in result.declined] == ["d1"]
    assert "neither followed" in result.declined[0].reason
    assert "LayerNormalization has no oneDNN post-op" in result.declined[0].reason


def test_dequantize_into_a_softmax_is_kept() -> None:
    """A Softmax has no integer source in oneDNN: the node writes the dequantized f32 values."""
    graph = new_graph()
    int8_conv(graph)
    fq(graph, "conv", "q1", 0.04, 100)
    dq(graph, "q1", "d1")
    add(graph, Op.SOFTMAX, ["d1"], "y", AxisAttrs(1))
    graph.outputs.append("y")
    feeds = feeds_for(graph)
    before = reference(graph, feeds)
    result = run(fuse_post_ops, graph)
    np.testing.assert_array_equal(reference(graph, feeds)["y"], before["y"])  # bit-exact
    assert result.changed == 1 and kinds(graph) == [Scale, Shift, Quantize, Shift, Scale]
    assert graph.producer("d1").name == "conv" and not graph.has_node("q1")
    assert graph.info("d1").dtype is DType.F32
    assert [(d.node, d.op) for d in result.declined] == [("y", "Softmax")]


def test_requantize_through_a_multiply() -> None:
    graph = new_graph()
    int8_conv(graph)
    fq(graph, "conv", "q1", 0.04, 100)
    dq(graph, "q1", "d1")
    add(graph, Op.MUL, ["d1", const(graph, "c", 0.25)], "m")
    fq(graph, "m", "y", 0.01, 128)
    graph.outputs.append("y")
    check_exact(graph, fuse_post_ops)
    assert kinds(graph) == [Scale, Shift, Quantize, Shift, Scale, Scale, Quantize]


def test_float_output_sums_the_dequantized_residual() -> None:
    graph = residual_block(via_qdq=False)
    graph.outputs[0] = "sum"  # no output quantize: the dst stays f32
    graph.remove_node(graph.node("y"))
    check_exact(graph, fuse_post_ops)
    assert graph.node("conv").fused.chain[-1] == Residual(2)  # f32, read from r_dq
    assert graph.node("conv").inputs[2] == "r_dq" and graph.has_node("r_dq")


def test_float_residual_then_quantize_goes_into_the_int8_output() -> None:
    """TensorRT-style placement: the residual Add of two float32 tensors, then a quantize.
    The f32 residual cannot be oneDNN's sum into a u8 dst (the sum reads the dst buffer),
    so the lowering adds it as a binary_add post-op: the chain goes on to the quantize."""
    graph = new_graph()
    graph.add_input("r", TensorInfo(SHAPE, DType.F32))
    int8_conv(graph)
    add(graph, Op.ADD, ["conv", "r"], "sum")
    fq(graph, "sum", "y", 0.05, 0)
    graph.outputs.append("y")
    check_exact(graph, fuse_post_ops)
    assert kinds(graph)[:3] == [Scale, Shift, Residual] and kinds(graph)[-1] == Quantize
    assert graph.info(graph.node("conv").outputs[0]).dtype is DType.U8



def test_shared_value_stops_the_chain() -> None:
    graph = new_graph()
    int8_conv(graph)
    add(graph, Op.RELU, ["conv"], "a")
    add(graph, Op.SIGMOID, ["conv"], "b")
    graph.outputs += ["a", "b"]
    result = run(fuse_post_ops, graph)
    assert result.changed == 0
    assert sorted(d.node for d in result.declined) == ["a", "b"]
    assert all("'conv' has 2 readers" in d.reason for d in result.declined)


def test_graph_output_inside_the_chain_keeps_its_name() -> None:
    graph = new_graph()
    int8_conv(graph)
    add(graph, Op.RELU, ["conv"], "relu")
    fq(graph, "relu", "y", 0.02, 0)
    graph.outputs += ["relu", "y"]
    check_exact(graph, fuse_post_ops)
    assert graph.producer("relu").name == "conv" and graph.producer("y").op is Op.FAKE_QUANTIZE
    assert "'relu' is a graph output" in graph.node("conv").fused.notes[0]


ACTIVATIONS = [
    (Op.RELU, None, Activation(Act.RELU), True),
    (Op.LEAKY_RELU, AlphaAttrs(0.1), Activation(Act.RELU, 0.1), True),
    (Op.CLIP, ClipAttrs(0.0, 6.0), Activation(Act.CLIP, 0.0, 6.0), True),
    (Op.CLIP, ClipAttrs(0.0), Activation(Act.RELU), True),
    (Op.SIGMOID, None, Activation(Act.SIGMOID), False),
    (Op.TANH, None, Activation(Act.TANH), False),
    (Op.HARD_SIGMOID, HardSigmoidAttrs(0.3, 0.4), Activation(Act.HARD_SIGMOID, 0.3, 0.4), True),
    (Op.HARD_SWISH, None, Activation(Act.HARD_SWISH, 1 / 6, 0.5), True),
    (Op.GELU, GeluAttrs(), Activation(Act.GELU_ERF), True),
    (Op.GELU, GeluAttrs(GeluApprox.TANH), Activation(Act.GELU_TANH), True),
]


@pytest.mark.parametrize(("op", "attrs", "item", "exact"), ACTIVATIONS,
                         ids=[f"{a[0].value}-{a[2].act.name}" for a in ACTIVATIONS])
def test_activation_then_quantize(op: Op, attrs: object, item: Activation, exact: bool) -> None:
    graph = new_graph(shape=(4, 4, 16, 16))
    int8_conv(graph)
    add(graph, op, ["conv"], "act", attrs)
    graph.outputs.append("act")
    feeds = feeds_for(graph)
    act = reference(graph, feeds)["act"]  # the quantize covers the activation's range
    lo, hi = min(float(act.min()), 0.0), max(float(act.max()), 0.0)
    scale = (hi - lo) / 255
    graph.outputs.remove("act")
    fq(graph, "act", "y", scale, round(-lo / scale))
    graph.outputs.append("y")
    before = reference(graph, feeds)["y"]
    assert len(np.unique(before)) > 100  # the test exercises many levels
    assert run(fuse_post_ops, graph).changed == 1
    assert graph.node("conv").fused.chain[2] == item
    max_lsb, identical = step_diff(before, reference(graph, feeds)["y"])
    assert max_lsb <= (0 if exact else 1) and identical >= 0.999


@pytest.mark.parametrize("shape", [(1,), (C, 1, 1), (1, C, 1, 1)])
def test_prelu_and_constant_multiply(shape: tuple[int, ...]) -> None:
    graph = new_graph()
    int8_conv(graph)
    slopes = np.linspace(0.05, 0.3, int(np.prod(shape))).reshape(shape)
    add(graph, Op.PRELU, ["conv", const(graph, "slopes", slopes)], "p")
    c_q = const(graph, "c_q", np.full(shape, 200), np.uint8)
    c = dq(graph, c_q, "c", 0.01, 0).outputs[0]  # ONNX Runtime's quantized constant factor
    add(graph, Op.MUL, [c, "p"], "y")
    graph.outputs.append("y")
    check_exact(graph, fuse_post_ops)
    assert kinds(graph) == [Scale, Shift, PRelu, Scale]
    assert len(graph) == 1  # the DequantizeLinear of the constant went too


def test_operand_along_another_dim_is_declined() -> None:
    graph = new_graph()
    int8_conv(graph)
    add(graph, Op.MUL, ["conv", const(graph, "c", np.ones((1, 1, 5, 1)))], "y")
    result = run(fuse_post_ops, graph)
    assert result.changed == 0 and "broadcasts along dim 2" in result.declined[0].reason


@pytest.mark.parametrize(("op", "attrs", "reason"), [
    (Op.SOFTMAX, AxisAttrs(1), "Softmax has no oneDNN post-op"),
    (Op.RESHAPE, ReshapeAttrs((1, C * 25)), "Reshape changes the shape"),
])
def test_non_post_ops_are_declined(op: Op, attrs: object, reason: str) -> None:
    graph = new_graph()
    int8_conv(graph)
    add(graph, op, ["conv"], "y", attrs)
    result = run(fuse_post_ops, graph)
    assert result.changed == 0 and reason in result.declined[0].reason


def test_the_composer_judges() -> None:
    graph = new_graph()
    int8_conv(graph)
    ins = ["conv"] + [const(graph, f"r{i}", v) for i, v in enumerate((0.5, 0.5, 0.0, 255.0))]
    add(graph, Op.FAKE_QUANTIZE, ins, "y", FakeQuantizeAttrs(256),
        TensorInfo(SHAPE, DType.U8, QuantParams.make(1.0, 0)))
    result = run(fuse_post_ops, graph)
    assert result.changed == 0
    assert "the composer cannot take" in result.declined[0].reason
    assert "input_low == input_high" in result.declined[0].reason


def test_a_chain_stops_where_it_would_not_fit_a_primitive() -> None:
    """Eight Sigmoids, each requantized, after an int8 conv compose to far more than a oneDNN
    primitive's 32 post-ops: the walk stops at the last quantize that keeps the composed
    chain within CHAIN_POST_OPS (lowering's own post-ops fit beside it) and says why; what
    follows is left to other kernels, the int8 tensor between them the model's."""
    graph = new_graph()
    int8_conv(graph)
    value = fq(graph, "conv", "q0", 0.04, 100).outputs[0]
    for i in range(8):
        dq(graph, value, f"d{i}")
        add(graph, Op.SIGMOID, [f"d{i}"], f"s{i}")
        value = fq(graph, f"s{i}", f"q{i + 1}", 1 / 255, 0).outputs[0]
    graph.outputs.append(value)
    feeds = feeds_for(graph)
    before = reference(graph, feeds)
    result = run(fuse_post_ops, graph)
    np.testing.assert_array_equal(reference(graph, feeds)[value], before[value])
    node = graph.node("conv")
    composed = compose(node.fused.chain, channels=C, dst_dtype=graph.info(node.outputs[0]).dtype)
    assert 0 < len(composed.post_ops) <= fuse_post_ops.CHAIN_POST_OPS
    assert kinds(graph)[-1] is Quantize and graph.info(node.outputs[0]).dtype is DType.U8
    assert graph.has_node(f"d{kinds(graph).count(Activation)}")  # the rest stays for later
    assert any("post-ops, more than 24" in d.reason for d in result.declined)


def matmul_block(last: int = C) -> Graph:
    """ONNX Runtime's MatMulAddFusion shape: Reshape → 2-D MatMul → Reshape back."""
    graph = new_graph(shape=(2, 3, 8))
    graph.add_input("r", TensorInfo((2, 3, C), DType.U8, QuantParams.make(0.03, 7)))
    add(graph, Op.RESHAPE, ["x"], "x2d", ReshapeAttrs((6, 8)))
    int8_matmul(graph, "x2d")
    fq(graph, "mm", "q1", 0.04, 100)
    add(graph, Op.RESHAPE, ["q1"], "q3d", ReshapeAttrs((2, 3, C) if last == C else (2, 9, 2)))
    dq(graph, "q3d", "d1")
    if last == C:
        add(graph, Op.ADD, ["d1", dq(graph, "r", "r_dq").outputs[0]], "sum")
        fq(graph, "sum", "y", 0.05, 0)
    else:
        add(graph, Op.RELU, ["d1"], "y")
    graph.outputs.append("y")
    return graph


def test_matmul_chain_walks_through_a_reshape_keeping_the_last_dim() -> None:
    graph = matmul_block()
    check_exact(graph, fuse_post_ops)
    node = graph.producer("y")
    assert kinds(graph, "mm") == [Scale, Quantize, Shift, Scale, Residual, Quantize]
    assert node.inputs[0] == "x" and node.inputs[2] == "r"  # reads the 3-D source itself
    assert graph.info("y").shape == (2, 3, C)
    assert sorted(n.op.value for n in graph) == ["MatMul"]


def test_matmul_reshape_changing_the_last_dim_stops() -> None:
    graph = matmul_block(last=2)
    result = run(fuse_post_ops, graph)
    assert result.changed == 1 and kinds(graph, "mm") == [Scale, Quantize]
    assert "changes the last dim" in result.declined[0].reason


def test_matmul_reshape_after_a_tensor_operand_stops() -> None:
    """A chain that took a tensor operand at one shape stops at a later Reshape: the operand
    would be read at the old shape (ONNX Runtime's MatMulAddFusion before a GeGLU's gate
    product: Gemm → Reshape → ·g → Q → Reshape for the next Gemm)."""
    graph = new_graph(shape=(2, 3, 8))
    graph.add_input("g", TensorInfo((2, 3, C), DType.F32))
    add(graph, Op.RESHAPE, ["x"], "x2d", ReshapeAttrs((6, 8)))
    int8_matmul(graph, "x2d")
    fq(graph, "mm", "q1", 0.04, 100)
    add(graph, Op.RESHAPE, ["q1"], "q3d", ReshapeAttrs((2, 3, C)))
    dq(graph, "q3d", "d1")
    add(graph, Op.MUL, ["d1", "g"], "m")
    fq(graph, "m", "q2", 0.05, 0)
    add(graph, Op.RESHAPE, ["q2"], "y", ReshapeAttrs((6, C)))
    graph.outputs.append("y")
    result = run(fuse_post_ops, graph)
    assert result.changed == 1
    assert kinds(graph, "mm")[-2:] == [TensorOperand, Quantize]
    node = graph.producer("q2")
    assert graph.info(node.inputs[2]).shape == graph.info("q2").shape == (2, 3, C)
    assert graph.producer("y").op is Op.RESHAPE
    assert any("after a tensor operand" in d.reason for d in result.declined)


def test_second_run_changes_nothing() -> None:
    graph = residual_block()
    run(fuse_post_ops, graph)
    assert run(fuse_post_ops, graph).changed == 0


def test_depends_on() -> None:
    graph = residual_block()
    conv = graph.node("conv")
    assert depends_on(graph, "sum", conv) and not depends_on(graph, "r_dq", conv)


@settings(max_examples=30, deadline=None)
@given(s1=st.floats(0.005, 0.2), z1=st.integers(0, 255), sr=st.floats(0.005, 0.2),
       zr=st.integers(-128, 127), s2=st.floats(0.005, 0.2), z2=st.integers(0, 255),
       relu=st.booleans())
def test_residual_block_is_bit_exact(s1: float, z1: int, sr: float, zr: int, s2: float,
                                     z2: int, relu: bool) -> None:
    """Random scales and zero points, an s8 residual: the fused chain equals the graph."""
    graph = new_graph()
    r = residual_input(graph, scale=sr, zp=zr, dtype=DType.S8)
    int8_conv(graph)
    fq(graph, "conv", "q1", s1, z1)
    x = dq(graph, "q1", "d1").outputs[0]
    if relu:
        x = add(graph, Op.RELU, [x], "relu").outputs[0]
    add(graph, Op.ADD, [x, r], "sum")
    fq(graph, "sum", "y", s2, z2)
    graph.outputs.append("y")
    check_exact(graph, fuse_post_ops)
    assert Residual in kinds(graph)
