"""compiler/fusion_report: the quantized region, not_fused reasons and the summary, on tiny
hand-built graphs (the zoo models are in tests/passes/test_fusion_zoo.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "passes"))  # fusion_helpers

from fusion_helpers import add, dq, fq, int8_conv, new_graph, run

from qfuse.compiler.fusion_report import (
    not_fused,
    quantized_region,
    standalone,
    summary,
)
from qfuse.ir import DType, Graph, Op
from qfuse.ir.ops import AxisAttrs, ReshapeAttrs
from qfuse.passes import fuse_post_ops
from qfuse.passes.base import Decline, PassResult


def small_net() -> Graph:
    """x(f32) → FQ → conv(int8) → Relu → FQ → Reshape(int8) → DQ → Softmax → FQ → DQ → y."""
    graph = new_graph(DType.F32)
    fq(graph, "x", "xq", 0.05, 3)
    int8_conv(graph, "xq")
    add(graph, Op.RELU, ["conv"], "relu")
    fq(graph, "relu", "q1", 0.02, 0)
    add(graph, Op.RESHAPE, ["q1"], "flat", ReshapeAttrs((1, 150)))
    dq(graph, "flat", "d1")
    add(graph, Op.SOFTMAX, ["d1"], "soft", AxisAttrs(1))
    fq(graph, "soft", "q2", 1 / 255, 0)
    dq(graph, "q2", "y")
    graph.outputs.append("y")
    return graph


def test_quantized_region_excludes_the_input_quantize_and_output_dequantize() -> None:
    graph = small_net()
    region = quantized_region(graph)
    assert region == {"conv", "relu", "q1", "flat", "d1", "soft", "q2"}


def test_standalone_before_and_after_fusion() -> None:
    graph = small_net()
    assert [n.name for n in standalone(graph)] == ["relu", "q1"]
    first = summary(graph)
    assert first["standalone"] == {"Relu": 1, "FakeQuantize": 1}
    assert first["float_ops"] == {"Softmax": 1}
    assert first["float_boundary"] == {"DequantizeLinear": 1, "FakeQuantize": 1}
    result = run(fuse_post_ops, graph)
    assert result.changed == 1 and standalone(graph) == []
    after = summary(graph)
    assert after["fused_compute"] == after["int8_compute"] == 1
    assert after["chain_lengths"] == {"conv": 4} and after["with_output_quantize"] == 1
    assert after["standalone"] == {}


def test_not_fused_reasons() -> None:
    graph = small_net()
    results = [run(fuse_post_ops, graph)]
    results.append(PassResult("later", declined=[Decline("soft", "Softmax", "a later reason")]))
    found = {d["node"]: d for d in not_fused(graph, results)}
    assert "conv" not in found and "flat" not in found  # fused kernel, int8 data movement
    assert found["soft"]["reason"] == "a later reason"  # the last recorded reason wins
    assert found["d1"]["reason"] == "quantization boundary for a float32 op"
    assert found["q2"]["reason"] == "quantization boundary after a float32 op"
    assert found["xq"]["reason"].startswith("quantizes the graph input 'x'")
    assert found["y"]["reason"].startswith("dequantizes the graph output 'y'")


def test_requantize_pair_and_constant_nodes() -> None:
    graph = new_graph()
    int8_conv(graph)
    fq(graph, "conv", "q1", 0.02, 0)
    dq(graph, "q1", "d1")
    fq(graph, "d1", "q2", 0.03, 5)
    q = graph.add_constant("cq", np.arange(3, dtype=np.uint8)).name
    dq(graph, q, "c", 0.5, 0)
    graph.outputs += ["q2", "c"]
    found = {d["node"]: d["reason"] for d in not_fused(graph, [])}
    assert found["d1"].startswith("requantize") and found["q2"].startswith("requantize")
    assert found["c"] == "computes a constant (evaluated at compile time)"
    # a per-tensor dequantize read only by quantizes is no kernel (lower_quant defers it into
    # each reader): that, not a recorded post-op decline, is what inspect says of it
    fq(graph, "d1", "q3", 0.05, 9)
    graph.outputs.append("q3")
    declined = PassResult("fuse_post_ops", declined=[Decline("d1", "DequantizeLinear", "post-op")])
    found = {d["node"]: d["reason"] for d in not_fused(graph, [declined])}
    assert "no dequantize kernel" in found["d1"], found["d1"]


def test_a_float_add_read_twice_and_its_dequantized_input_say_why() -> None:
    """NNCF's residual Add in Swin: a float32 stream x plus a dequantized 8-bit tensor, the
    sum read by two float ops. The Add is read twice (a chain takes a value read once) and
    the dequantize feeds a binary op that writes float32; `inspect` says both, not "no pass
    matched"."""
    from onnx import TensorProto, helper

    from qfuse.compiler.api import compile_model
    from tests.compiler.onnx_builders import init, model

    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Add", ["x", "d"], ["a"]),
             helper.make_node("Relu", ["a"], ["y1"]), helper.make_node("Sigmoid", ["a"], ["y2"])]
    m = model(nodes, {"x": ([1, 4, 6, 6], TensorProto.FLOAT),
                      "q": ([1, 4, 6, 6], TensorProto.UINT8)}, ["y1", "y2"],
              [init("s", np.float32(0.05)), init("z", np.uint8(128))])
    reasons = {d["op"]: d["reason"] for d in compile_model(m).inspect()["not_fused"]}
    assert "read once" in reasons["Add"], reasons
    assert reasons["DequantizeLinear"].startswith("dequantizes an input of"), reasons
    assert "writes float32" in reasons["DequantizeLinear"], reasons
