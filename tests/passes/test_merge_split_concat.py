"""merge_split_concat: a Concat of consecutive parts of one Split (YOLOv8's C2f) reads the slice
of the Split's source they make. Bit-identical to the plan without it (bytes move, nothing is
computed), one copy fewer per merged run; declined for parts out of order, another axis or a
single part."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32
OFF = ComposerOptions().without("merge_split_concat")


def _c2f(order: tuple[int, ...] = (0, 1), *, sizes: tuple[int, ...] = (8, 8),
         split_axis: int = 1, concat_axis: int = 1) -> onnx.ModelProto:
    """x[1, 8, 10, 10] → Q/DQ → 1x1 Conv (16 channels) → Q/DQ → Split(split_axis, ``sizes``);
    the last part → 3x3 Conv (as the bottleneck) → Q/DQ; Concat(concat_axis) of the parts in
    ``order`` and the bottleneck's output → Q/DQ → 1x1 Conv → Q/DQ."""
    rng = np.random.default_rng(5)
    parts = len(sizes)
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w1", "w1s"], ["w1d"], axis=0),
             helper.make_node("Conv", ["xd", "w1d", "b1"], ["c1"], name="cv1"),
             *_qdq("a1", "c1", "ad"),
             helper.make_node("Split", ["ad", "sizes"], [f"p{i}" for i in range(parts)],
                              axis=split_axis, name="split"),
             helper.make_node("DequantizeLinear", ["w2", "w2s"], ["w2d"], axis=0),
             helper.make_node("Conv", [f"p{parts - 1}", "w2d"], ["c2"], name="m0",
                              pads=[1, 1, 1, 1]),
             *_qdq("a2", "c2", "md"),
             helper.make_node("Concat", [*(f"p{i}" for i in order), "md"], ["cat"],
                              axis=concat_axis, name="concat"),
             *_qdq("a3", "cat", "catd"),
             helper.make_node("DequantizeLinear", ["w3", "w3s"], ["w3d"], axis=0),
             helper.make_node("Conv", ["catd", "w3d"], ["c3"], name="cv2"),
             *qdq_pair("y", "c3", "y")]
    c2_in = sizes[-1] if split_axis == 1 else 16
    c3_in = sum(sizes[i] for i in order) + c2_in if concat_axis == 1 else 16
    inits = [init("xs", F32(0.02)), init("xz", np.uint8(128)),
             init("w1", rng.integers(-127, 128, (16, 8, 1, 1)).astype(np.int8)),
             init("w1s", rng.uniform(0.002, 0.01, 16).astype(F32)),
             init("b1", rng.normal(0, 0.1, 16).astype(F32)),
             init("as", F32(0.05)), init("az", np.uint8(120)),
             init("sizes", np.array(sizes, np.int64)),
             init("w2", rng.integers(-127, 128, (c2_in, c2_in, 3, 3)).astype(np.int8)),
             init("w2s", rng.uniform(0.002, 0.01, c2_in).astype(F32)),
             init("w3", rng.integers(-127, 128, (8, c3_in, 1, 1)).astype(np.int8)),
             init("w3s", rng.uniform(0.002, 0.01, 8).astype(F32)),
             init("ys", F32(0.05)), init("yz", np.uint8(128))]
    return model(nodes, {"x": ((1, 8, 10, 10), TensorProto.FLOAT)}, ["y"], inits, opset=13)


def _qdq(name: str, src: str, dst: str) -> list[onnx.NodeProto]:
    """Q/DQ of ``src`` with the activations' shared scale and zero point (a Split's parts and
    a Concat's inputs and output share them in a quantized model)."""
    return [helper.make_node("QuantizeLinear", [src, "as", "az"], [f"{name}q"]),
            helper.make_node("DequantizeLinear", [f"{name}q", "as", "az"], [dst])]


def _plans(m: onnx.ModelProto, mode: str = "fused"):
    return compile_model(m, mode=mode), compile_model(m, mode=mode, composer=OFF)


@pytest.mark.parametrize("mode", ["fused", "unfused", "fp32"])
def test_the_concat_reads_the_split_source_once_and_bit_exact(mode: str) -> None:
    merged, plain = _plans(_c2f(), mode)
    assert merged.inspect()["passes"]["merge_split_concat"] == 1
    assert plain.inspect()["passes"].get("merge_split_concat", 0) == 0
    graph = merged.compiled_graph
    concat = next(n for n in graph.topo_order() if n.op.value == "Concat")
    split = next(n for n in graph.topo_order() if n.op.value == "Split")
    assert split.inputs[0] in concat.inputs  # the whole source: both parts, in order
    assert not graph.uses(split.outputs[0])
    assert len(merged.inspect()["kernels"]) < len(plain.inspect()["kernels"])
    feeds = random_inputs(merged)
    a, b = merged.run(feeds), plain.run(feeds)
    np.testing.assert_array_equal(a["y"], b["y"])


def test_a_run_inside_the_split_becomes_one_slice() -> None:
    """Parts 1 and 2 of three: one Slice of channels 6..15 of the source."""
    merged, plain = _plans(_c2f((1, 2), sizes=(6, 5, 5)))
    assert merged.inspect()["passes"]["merge_split_concat"] == 1
    graph = merged.compiled_graph
    slices = [n for n in graph.topo_order() if n.op.value == "Slice"]
    assert len(slices) == 1 and slices[0].attrs.starts == (6,) and slices[0].attrs.ends == (16,)
    feeds = random_inputs(merged)
    np.testing.assert_array_equal(merged.run(feeds)["y"], plain.run(feeds)["y"])


@pytest.mark.parametrize(("order", "sizes", "split_axis", "concat_axis"), [
    ((1, 0), (8, 8), 1, 1),   # out of order
    ((0,), (8, 8), 1, 1),     # one part only
    ((0, 1), (5, 5), 2, 2),   # split and concat along H: merged (same axis)
])
def test_declined_unless_consecutive_parts_in_order(order, sizes, split_axis,
                                                     concat_axis) -> None:
    m = _c2f(order, sizes=sizes, split_axis=split_axis, concat_axis=concat_axis)
    merged, plain = _plans(m)
    expected = 1 if order == (0, 1) else 0
    assert merged.inspect()["passes"].get("merge_split_concat", 0) == expected
    feeds = random_inputs(merged)
    np.testing.assert_array_equal(merged.run(feeds)["y"], plain.run(feeds)["y"])
