"""fuse_quantized_norm: Softmax / LayerNormalization take their source DequantizeLinear and
their output quantize (golden structure, declines with reasons, and the reference before vs
after the pass bit-identical)."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import add, const, dq, reference, run
from norm_helpers import norm_graph, random_feeds

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.chain import Quantize
from qfuse.ir.ops import AxisAttrs, DequantizeAttrs, FakeQuantizeAttrs, LayerNormAttrs
from qfuse.passes import fuse_quantized_norm
from qfuse.passes.base import PassResult


def _run_exact(graph: Graph, changed: int = 1) -> PassResult:
    """The pass on ``graph``; the reference outputs are bit-identical before and after."""
    feeds = random_feeds(graph, seed=3)
    before = reference(graph, feeds)
    result = run(fuse_quantized_norm, graph)
    assert result.changed == changed
    after = reference(graph, feeds)
    for name, array in before.items():
        np.testing.assert_array_equal(after[name], array)
    return result


def _ops(graph: Graph) -> list[Op]:
    return [n.op for n in graph.topo_order()]


def test_layer_norm_golden() -> None:
    graph = norm_graph(Op.LAYER_NORM, src_scale=0.05, src_zp=130, dst_scale=0.03, dst_zp=128)
    result = _run_exact(graph)
    assert result.declined == []
    assert _ops(graph) == [Op.LAYER_NORM]
    node = graph.producer("y")
    assert node is not None and node.inputs[:2] == ["x", "gamma"]
    fused = node.fused
    assert fused is not None
    assert (fused.src_scale, fused.src_zero_point) == (pytest.approx(0.05), 130)
    assert len(fused.chain) == 1 and isinstance(fused.chain[0], Quantize)
    assert fused.chain[0].dtype is DType.U8
    assert set(fused.absorbed) == {"x_dq", "n", "y"}
    assert graph.info("y").dtype is DType.U8


@pytest.mark.parametrize(("src", "dst"), [(DType.F32, DType.U8), (DType.U8, DType.F32),
                                          (DType.S8, DType.S8)])
def test_layer_norm_one_side_or_signed(src: DType, dst: DType) -> None:
    graph = norm_graph(Op.LAYER_NORM, src=src, src_zp=-5 if src is DType.S8 else 130,
                       dst=dst, dst_zp=-9 if dst is DType.S8 else 128)
    _run_exact(graph)
    node = graph.producer("y")
    assert node is not None and node.op is Op.LAYER_NORM and node.inputs[0] == "x"
    assert node.fused is not None
    assert (node.fused.src_scale is None) == (src is DType.F32)
    assert bool(node.fused.chain) == dst.is_quantized


def test_softmax_takes_the_output_quantize_only() -> None:
    """softmax(s·x) depends on s: the DequantizeLinear stays, with the reason on it."""
    graph = norm_graph(Op.SOFTMAX, shape=(2, 4, 8, 8), dst_scale=1 / 255, dst_zp=0)
    result = _run_exact(graph)
    assert _ops(graph) == [Op.DEQUANTIZE_LINEAR, Op.SOFTMAX]
    node = graph.producer("y")
    assert node is not None and node.inputs == ["x_dq"] and node.fused is not None
    assert node.fused.src_scale is None and isinstance(node.fused.chain[0], Quantize)
    assert [(d.node, d.op) for d in result.declined] == [("x_dq", "DequantizeLinear")]
    assert "src scale multiplies the output" in result.declined[0].reason


def test_softmax_output_zero_point_declined() -> None:
    graph = norm_graph(Op.SOFTMAX, src=DType.F32, shape=(2, 4, 8, 8), dst_scale=1 / 256,
                       dst_zp=-128, dst=DType.S8)
    result = _run_exact(graph, changed=0)
    assert [(d.node, d.op) for d in result.declined] == [("y", "FakeQuantize")]
    assert "no dst zero point" in result.declined[0].reason


def test_layer_norm_source_checks() -> None:
    graph = norm_graph(Op.LAYER_NORM, dst=DType.F32)
    x_dq = graph.producer("x_dq")
    assert x_dq is not None
    graph.add_constant("neg", np.asarray(-0.05, np.float32))
    graph.set_input(x_dq, 1, "neg")
    result = _run_exact(graph, changed=0)
    assert [d.node for d in result.declined] == ["x_dq"]
    assert "not positive" in result.declined[0].reason


def test_per_channel_dequantize_keeps_the_source_float() -> None:
    graph = norm_graph(Op.LAYER_NORM, shape=(2, 4, 8))
    x_dq = graph.producer("x_dq")
    assert x_dq is not None
    graph.add_constant("s_pc", np.linspace(0.01, 0.05, 8).astype(np.float32))
    graph.add_constant("zp_pc", np.full(8, 130, np.uint8))
    graph.set_input(x_dq, 1, "s_pc")
    graph.set_input(x_dq, 2, "zp_pc")
    x_dq.attrs = DequantizeAttrs(axis=2)
    result = _run_exact(graph)
    assert "per-channel" in result.declined[0].reason
    node = graph.producer("y")
    assert node is not None and node.inputs[0] == "x_dq" and node.fused is not None
    assert node.fused.src_scale is None and node.fused.chain


def test_no_pattern_no_decline() -> None:
    graph = norm_graph(Op.LAYER_NORM, src=DType.F32, dst=DType.F32)
    result = _run_exact(graph, changed=0)
    assert result.declined == []


def test_output_with_two_readers_stays_float() -> None:
    graph = norm_graph(Op.SOFTMAX, src=DType.F32, shape=(2, 4, 8, 8), dst_scale=1 / 255,
                       dst_zp=0)
    add(graph, Op.RELU, ["n"], "other")
    graph.outputs.append("other")
    result = _run_exact(graph, changed=0)
    assert result.declined == []


def test_narrow_output_range_declined() -> None:
    """A 7-bit quantize (128 levels onto [0, 127]) is no dst scale onto u8: the source side
    is still taken."""
    graph = norm_graph(Op.LAYER_NORM, dst=DType.F32)
    s = 0.03
    ranges = [const(graph, f"q_{k}", v) for k, v in (("il", -64 * s), ("ih", 63 * s),
                                                       ("ol", 0.0), ("oh", 127.0))]
    info = TensorInfo(graph.info("y").shape, DType.U8, QuantParams.make(s, 64))
    add(graph, Op.FAKE_QUANTIZE, ["y", *ranges], "q", FakeQuantizeAttrs(128), info)
    graph.outputs[:] = ["q"]
    result = _run_exact(graph)
    assert [d.node for d in result.declined] == ["q"]
    assert "not a dst scale" in result.declined[0].reason
    assert _ops(graph) == [Op.LAYER_NORM, Op.FAKE_QUANTIZE]


def test_layer_norm_with_used_statistics_is_left_alone() -> None:
    graph = Graph("stats")
    graph.add_input("x", TensorInfo((2, 8, 64), DType.U8, QuantParams.make(0.05, 130)))
    x = dq(graph, "x", "x_dq", 0.05, 130).outputs[0]
    gamma = const(graph, "gamma", np.ones(64, np.float32))
    infos = [TensorInfo((2, 8, 64), DType.F32), *[TensorInfo((2, 8, 1), DType.F32)] * 2]
    graph.add_node(Op.LAYER_NORM, [x, gamma], ["y", "mean", "inv"], LayerNormAttrs(2),
                   name="ln", infos=infos)
    graph.outputs.extend(["y", "mean"])
    result = _run_exact(graph, changed=0)
    assert [d.node for d in result.declined] == ["x_dq"]
    assert "Mean / InvStdDev" in result.declined[0].reason


def test_softmax_axis_is_kept() -> None:
    graph = norm_graph(Op.SOFTMAX, src=DType.F32, shape=(2, 6, 4), axis=1, dst_scale=1 / 255,
                       dst_zp=0)
    _run_exact(graph)
    node = graph.producer("y")
    assert node is not None and node.attrs == AxisAttrs(1)
