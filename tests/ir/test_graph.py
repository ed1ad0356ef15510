"""The graph container: building, rewiring, removal and the verifier."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.ir import DType, Graph, GraphError, Op, QuantParams, TensorInfo
from qfuse.ir.ops import ClipAttrs


def small_graph() -> Graph:
    g = Graph("t")
    g.add_input("x", TensorInfo((1, 4), DType.F32))
    g.add_constant("w", np.ones((4, 4), np.float32))
    mm = g.add_node(Op.MATMUL, ["x", "w"], ["y"], name="mm")
    relu = g.add_node(Op.RELU, [mm.outputs[0]], ["z"], name="relu")
    g.outputs = [relu.outputs[0]]
    return g


def test_build_and_topo_order() -> None:
    g = small_graph()
    g.verify()
    assert [n.name for n in g.topo_order()] == ["mm", "relu"]
    assert g.producer("y").name == "mm"
    assert [(n.name, p) for n, p in g.consumers("y")] == [("relu", 0)]
    assert g.producer("x") is None
    assert g.constant("w") is not None and g.constant("x") is None


def test_constants_are_read_only() -> None:
    g = small_graph()
    with pytest.raises(ValueError):
        g.constant("w")[0, 0] = 3.0


def test_replace_all_uses_and_bypass() -> None:
    g = small_graph()
    clip = g.add_node(Op.CLIP, ["y"], ["c"], ClipAttrs(0.0, 6.0), name="clip")
    g.set_input(g.node("relu"), 0, clip.outputs[0])
    g.verify()
    assert [n.name for n in g.topo_order()] == ["mm", "clip", "relu"]
    g.bypass(clip)
    g.verify()
    assert g.node("relu").inputs == ["y"]
    assert not g.has_node("clip") and "c" not in g.values


def test_insert_after_keeps_the_value_name_and_its_readers() -> None:
    g = small_graph()
    g.outputs.append("y")  # y is read by relu and is a graph output
    mm = g.node("mm")
    new = g.insert_after(mm, 0, Op.RELU, None, TensorInfo((1, 4), DType.F32), name="after")
    g.verify()
    inner = mm.outputs[0]
    assert inner != "y" and new.inputs == [inner] and new.outputs == ["y"]
    assert g.producer("y") is new and g.producer(inner) is mm
    assert [(n.name, p) for n, p in g.consumers("y")] == [("relu", 0)]
    assert [n.name for n in g.topo_order()] == ["mm", "after", "relu"]
    assert g.outputs == ["z", "y"]


def test_remove_node_refuses_when_read() -> None:
    g = small_graph()
    with pytest.raises(GraphError, match="'mm'.*still read"):
        g.remove_node(g.node("mm"))


def test_remove_unused_drops_dead_nodes_and_constants() -> None:
    g = small_graph()
    g.add_constant("unused", np.zeros(3, np.float32))
    g.add_node(Op.SIGMOID, ["y"], ["dead"], name="dead")
    assert g.remove_unused() == 1
    assert "unused" not in g.values and not g.has_node("dead")
    g.verify()


def test_verify_reports_by_name() -> None:
    g = small_graph()
    g.node("relu").attrs = ClipAttrs()
    g.outputs.append("nowhere")
    with pytest.raises(GraphError) as err:
        g.verify()
    text = str(err.value)
    assert "'relu' (Relu): attrs ClipAttrs" in text
    assert "graph output 'nowhere'" in text


def test_unknown_input_is_refused() -> None:
    g = small_graph()
    with pytest.raises(GraphError, match="'bad'.*unknown value 'nope'"):
        g.add_node(Op.RELU, ["nope"], name="bad")


def test_arity_checked() -> None:
    g = small_graph()
    g.add_node(Op.MATMUL, ["x"], ["lonely"], name="half")
    assert any("'half' (MatMul): 1 inputs" in p for p in g.problems())


def test_copy_is_independent() -> None:
    g = small_graph()
    h = g.copy()
    h.bypass(h.node("relu"))
    assert g.has_node("relu") and not h.has_node("relu")
    g.verify()
    h.verify()


def test_quant_params() -> None:
    q = QuantParams.make(0.5, 3)
    assert q.per_tensor and q.scale == (0.5,) and q.zero_point == (3,)
    pc = QuantParams.make([0.1, 0.2], 0, axis=0)
    assert not pc.per_tensor and pc.zero_point == (0, 0)
    assert str(TensorInfo((1, 2), DType.U8, q)) == "u8[1x2] (s=0.5, zp=3)"
    assert DType.S8.range == (-128, 127) and DType.U8.range == (0, 255)
