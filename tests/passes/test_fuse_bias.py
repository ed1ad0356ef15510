"""fuse_bias: Conv / ConvTranspose / MatMul → Add(constant per output channel).

Numerics: on int8 compute nodes and float MatMul the bias becomes a chain Shift that adds the
same float32 values to the same float32 accumulator value as the Add did: bit-exact (asserted).
Float Conv / ConvTranspose take it into their bias input; the reference adds the bias to the
float64 accumulator, so ``f32(acc + f32(b0 + b))`` may differ from ``f32(f32(acc + b0) + b)`` by
a float32 rounding of the output: asserted within 2 ulps of max |y| (``assert_ulps``).
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
    int8_conv,
    int8_matmul,
    new_graph,
    reference,
    run,
)

from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.chain import Scale, Shift
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs
from qfuse.passes import fuse_bias

F32 = np.float32


def assert_ulps(a: np.ndarray, b: np.ndarray, ulps: int = 2) -> None:
    tol = ulps * np.spacing(F32(np.abs(a).max()))
    assert np.abs(a.astype(np.float64) - b).max() <= tol


def conv_add(bias_shape: tuple[int, ...], *, output: bool = True) -> Graph:
    graph = new_graph()
    int8_conv(graph, bias=False)
    b = const(graph, "b", np.linspace(-1, 1, int(np.prod(bias_shape))).reshape(bias_shape))
    add(graph, Op.ADD, ["conv", b], "y")
    if output:
        graph.outputs.append("y")
    return graph


@pytest.mark.parametrize("shape", [(1, C, 1, 1), (C, 1, 1), (1,), ()])
def test_int8_conv_takes_a_per_channel_bias(shape: tuple[int, ...]) -> None:
    graph = conv_add(shape)
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    result = run(fuse_bias, graph)
    assert result.changed == 1 and not result.declined
    node = graph.producer("y")
    assert node is not None and node.name == "conv" and node.op is Op.CONV
    assert graph.outputs == ["y"] and not graph.has_node("y")
    assert node.fused is not None
    assert [type(i) for i in node.fused.chain] == [Scale, Shift]
    assert len(node.fused.chain[1].values) == (C if len(shape) > 1 else 1)
    assert node.fused.absorbed == ["conv", "y"]
    np.testing.assert_array_equal(reference(graph, feeds)["y"], before)  # bit-exact


def test_bias_is_appended_after_an_existing_shift() -> None:
    graph = new_graph()
    int8_conv(graph, bias=True)
    add(graph, Op.ADD, [const(graph, "b", np.ones((1, C, 1, 1))), "conv"], "y")
    graph.outputs.append("y")
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    assert run(fuse_bias, graph).changed == 1
    chain = graph.node("conv").fused.chain
    assert [type(i) for i in chain] == [Scale, Shift, Shift]
    np.testing.assert_array_equal(reference(graph, feeds)["y"], before)


def test_bias_given_as_dequantize_of_int32_is_evaluated() -> None:
    graph = new_graph()
    int8_conv(graph, bias=False)
    q = const(graph, "b_q", np.arange(C).reshape(1, C, 1, 1) * 1000 - 2500, np.int32)
    graph.set_info(q, TensorInfo((1, C, 1, 1), DType.S32))
    b = add(graph, Op.DEQUANTIZE_LINEAR, [q, const(graph, "b_s", 2e-4)], "b").outputs[0]
    add(graph, Op.ADD, ["conv", b], "y")
    graph.outputs.append("y")
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    assert run(fuse_bias, graph).changed == 1
    assert not graph.has_node("b")  # the DequantizeLinear of constants went with the Add
    np.testing.assert_array_equal(reference(graph, feeds)["y"], before)


def test_int8_matmul_bias_on_the_last_dim() -> None:
    graph = new_graph(shape=(2, 3, 8))
    int8_matmul(graph)
    add(graph, Op.ADD, ["mm", const(graph, "b", np.linspace(0, 1, C))], "y")
    graph.outputs.append("y")
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    assert run(fuse_bias, graph).changed == 1
    assert graph.producer("y").op is Op.MATMUL
    np.testing.assert_array_equal(reference(graph, feeds)["y"], before)


def test_declines_an_operand_along_another_dim() -> None:
    graph = new_graph(shape=(1, 4, C, C))  # [C] runs along W of [N, C, H, W = C]
    int8_conv(graph, bias=False)
    add(graph, Op.ADD, ["conv", const(graph, "b", np.arange(C))], "y")
    result = run(fuse_bias, graph)
    assert result.changed == 0
    assert "broadcasts along dim 3" in result.declined[0].reason
    assert result.declined[0].node == "y"


def test_declines_a_non_constant_operand() -> None:
    graph = new_graph()
    graph.add_input("r", TensorInfo((1, C, 5, 5), DType.F32))
    int8_conv(graph)
    add(graph, Op.ADD, ["conv", "r"], "y")
    result = run(fuse_bias, graph)
    assert result.changed == 0 and "is not a constant" in result.declined[0].reason


def test_declines_when_the_output_has_other_readers() -> None:
    graph = conv_add((1, C, 1, 1))
    graph.outputs.append("conv")
    result = run(fuse_bias, graph)
    assert result.changed == 0 and "is a graph output" in result.declined[0].reason
    graph = conv_add((1, C, 1, 1))
    add(graph, Op.RELU, ["conv"], "r")
    result = run(fuse_bias, graph)
    assert result.changed == 0 and "has 2 readers" in result.declined[0].reason


def test_no_add_is_not_this_pattern() -> None:
    graph = new_graph()
    int8_conv(graph)
    add(graph, Op.RELU, ["conv"], "y")
    result = run(fuse_bias, graph)
    assert result.changed == 0 and not result.declined


def float_graph(op: Op, bias: bool) -> Graph:
    graph = new_graph(DType.F32)
    rng = np.random.default_rng(3)
    if op is Op.CONV:
        w = const(graph, "w", rng.standard_normal((C, 4, 3, 3)))
        attrs: object = ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    else:
        w = const(graph, "w", rng.standard_normal((4, C, 3, 3)))
        attrs = ConvTransposeAttrs((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1))
    ins = ["x", w] + ([const(graph, "b0", rng.standard_normal(C))] if bias else [])
    add(graph, op, ins, "conv", attrs)
    add(graph, Op.ADD, ["conv", const(graph, "b", rng.standard_normal((1, C, 1, 1)))], "y")
    graph.outputs.append("y")
    return graph


@pytest.mark.parametrize("op", [Op.CONV, Op.CONV_TRANSPOSE])
@pytest.mark.parametrize("bias", [False, True])
def test_float_conv_takes_the_add_into_its_bias_input(op: Op, bias: bool) -> None:
    graph = float_graph(op, bias)
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    assert run(fuse_bias, graph).changed == 1
    node = graph.producer("y")
    assert node is not None and node.op is op and node.fused is None and len(node.inputs) == 3
    assert graph.constant(node.inputs[2]).shape == (C,)
    assert_ulps(before, reference(graph, feeds)["y"])


def test_float_matmul_gets_a_fused_shift() -> None:
    graph = new_graph(DType.F32, shape=(3, 8))
    add(graph, Op.MATMUL, ["x", const(graph, "w", np.random.default_rng(1)
                                      .standard_normal((8, C)))], "mm")
    dq_b = dq(graph, const(graph, "b_q", np.arange(C), np.uint8), "b", 0.5, 2)
    add(graph, Op.ADD, [dq_b.outputs[0], "mm"], "y")
    graph.outputs.append("y")
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    assert run(fuse_bias, graph).changed == 1
    node = graph.producer("y")
    assert node.fused is not None and node.fused.chain == [Shift.of(np.arange(C) * 0.5 - 1)]
    np.testing.assert_array_equal(reference(graph, feeds)["y"], before)  # bit-exact
