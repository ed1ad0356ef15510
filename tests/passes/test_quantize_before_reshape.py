"""quantize_before_reshape: ``x → Reshape → Q`` (per tensor) becomes ``x → Q → Reshape``, so a
global pool whose quantize follows a flatten (torch.export's ResNet head, quantize_static) is one
int8 pooling kernel. Exact: the reference interpreter's outputs are bit-identical before and
after the pass."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qfuse.compiler.api import compile_model, import_graph
from qfuse.compiler.lower.no_vnni import EXACT_INT8_ISAS
from qfuse.compiler.pipeline import run_pipeline
from qfuse.ir import Graph, Op
from qfuse.passes import quantize_before_reshape
from qfuse.passes.base import PassContext
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.onednn import effective_cpu_isa
from qfuse.runtime.reference import evaluate

C, S_Y = 8, 0.02


def _pool_head(per_channel: bool = False, quantize_first: bool = False,
               reshape_name: str = "") -> onnx.ModelProto:
    """x → Q/DQ → int8 conv → Relu → Q/DQ → ReduceMean(H, W) → Reshape [1, C] → Q → DQ;
    ``quantize_first``: the Reshape after the Q → DQ (the TorchScript export's form);
    ``reshape_name``: the Reshape node's name."""
    rng = np.random.default_rng(4)
    y_scale = rng.uniform(0.01, 0.03, C) if per_channel else S_Y
    inits = [nh.from_array(rng.integers(-90, 90, (C, 3, 3, 3)).astype(np.int8), "w"),
             nh.from_array(np.float32(0.004), "ws"), nh.from_array(np.int8(0), "wz"),
             nh.from_array(np.float32(0.05), "xs"), nh.from_array(np.uint8(128), "xz"),
             nh.from_array(np.float32(0.05), "rs"), nh.from_array(np.uint8(0), "rz"),
             nh.from_array(np.asarray(y_scale, np.float32), "ys"),
             nh.from_array(np.zeros(C, np.uint8) if per_channel else np.uint8(0), "yz"),
             nh.from_array(np.array([2, 3], np.int64), "axes"),
             nh.from_array(np.array([1, C], np.int64), "shape")]
    nodes = [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             h.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]),
             h.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"]),
             h.make_node("ReduceMean", ["rd", "axes"], ["m"], keepdims=1)]
    if quantize_first:
        nodes += [h.make_node("QuantizeLinear", ["m", "ys", "yz"], ["vq"], axis=1),
                  h.make_node("DequantizeLinear", ["vq", "ys", "yz"], ["v"], axis=1),
                  h.make_node("Reshape", ["v", "shape"], ["y"])]
    else:
        nodes += [h.make_node("Reshape", ["m", "shape"], ["v"], name=reshape_name),
                  h.make_node("QuantizeLinear", ["v", "ys", "yz"], ["vq"], axis=1),
                  h.make_node("DequantizeLinear", ["vq", "ys", "yz"], ["y"], axis=1)]
    graph = h.make_graph(nodes, "pool_head",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, C])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 6, 6)).astype(np.float32)}


def _moved_exactly(graph: Graph, feeds: list[dict[str, np.ndarray]]) -> int:
    """Runs the pipeline through quantize_before_reshape on ``graph``, checks the reference's
    outputs bit-identical before and after, and returns how many moves the pass made."""
    before = [evaluate(graph, f)["y"] for f in feeds]
    results = {r.name: r for r in run_pipeline(graph, PassContext(),
                                                until="quantize_before_reshape")}
    for f, want in zip(feeds, before, strict=True):
        np.testing.assert_array_equal(evaluate(graph, f)["y"], want)
    return results["quantize_before_reshape"].changed


@pytest.mark.parametrize("reshape_name", ["", "y"])
def test_quantize_moves_before_the_reshape_exactly(reshape_name: str) -> None:
    """Also with the Reshape named as a value written after it ("y"): onnxruntime's QOperator
    files name a Reshape as the value a DequantizeLinear writes (CAFormer-S18's
    ``/inner/stages/stages.2/Reshape_1``), the node rebuilt after the moved quantize then
    takes another name, and the pass carried its meta over by the old one (a KeyError that
    rejected the model)."""
    graph = import_graph(_pool_head(reshape_name=reshape_name))
    assert _moved_exactly(graph, [_feeds(s) for s in range(3)]) == 1
    compile_model(_pool_head(reshape_name=reshape_name))


def test_the_pool_compiles_as_with_the_quantize_first() -> None:
    """The same kernels as the TorchScript export's form: with VNNI one u8 → u8 pooling kernel
    (without VNNI the pool runs in float32 in both forms), the same outputs."""
    model = _pool_head()
    compiled = compile_model(model)
    kernels = compiled.inspect()["kernels"]
    first = compile_model(_pool_head(quantize_first=True))
    assert ([(k["primitive"], k["src_dtype"], k["dst_dtype"]) for k in kernels]
            == [(k["primitive"], k["src_dtype"], k["dst_dtype"])
                for k in first.inspect()["kernels"]])
    assert not [k for k in kernels if k["primitive"] == "reduction"]
    if effective_cpu_isa() in EXACT_INT8_ISAS:  # int8 kernels with VNNI / AMX
        pools = [k for k in kernels if k["primitive"] == "pooling"]
        assert len(pools) == 1 and pools[0]["src_dtype"] == pools[0]["dst_dtype"] == "u8"
    reference = compile_model(model, mode="reference")
    for seed in range(3):
        got = compiled.run(_feeds(seed))["y"]
        np.testing.assert_array_equal(got, first.run(_feeds(seed))["y"])
        assert step_diff(got, reference.run(_feeds(seed))["y"], S_Y).max_steps <= 1


def test_a_per_channel_quantize_stays_after_the_reshape() -> None:
    graph = import_graph(_pool_head(per_channel=True))
    results = {r.name: r for r in run_pipeline(graph, PassContext(),
                                                until="quantize_before_reshape")}
    assert results["quantize_before_reshape"].changed == 0
    assert any("per channel" in d.reason for d in results["quantize_before_reshape"].declined)


def test_quantize_moves_before_an_enlarging_nearest_resize_exactly() -> None:
    """An FPN's upsampled map quantized again into its Concat's scale: the quantize moves
    before the nearest Resize (each output element is a copy of one input element), where it
    meets the dequantize before the Resize; the reference's outputs are bit-identical."""
    from tests.compiler.test_in_place_concat import fpn_concat

    graph = import_graph(fpn_concat(requantize=True))
    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 8, 48, 40))
              .astype(np.float32) * 10} for s in range(3)]
    assert _moved_exactly(graph, feeds) == 1
    [resize] = [n for n in graph.topo_order() if n.op is Op.RESIZE]
    assert graph.producer(resize.inputs[0]).op is Op.FAKE_QUANTIZE


def _fpn_shared_source(per_channel: bool = False) -> onnx.ModelProto:
    """YOLOv8's FPN merge as quantize_static writes it, in small: an int8 map (conv, stride 2)
    read by another conv and by a nearest Resize x2 whose output is quantized again in the
    map's own scale, then concatenated with a full-size map and quantized in the Concat's
    scale (so propagate_dequantize requantizes each Concat input). The map has two readers,
    so the requantize into the Concat's scale cannot join its producer's kernel.
    ``per_channel``: the Resize's output quantized per channel instead, in scales of its own
    (a requantize of every channel)."""
    from tests.compiler.onnx_builders import init, model
    from tests.compiler.test_in_place_concat import _qdq

    rng = np.random.default_rng(23)
    nodes, inits = _qdq("x", "x", 0.02, 128)
    for i, stride in enumerate((2, 1)):
        w = rng.integers(-60, 60, size=(16, 8, 1, 1)).astype(np.int8)
        inits += [init(f"w{i}", w), init(f"w{i}_s", np.float32(0.01)),
                  init(f"w{i}_z", np.int8(0)),
                  init(f"b{i}", rng.normal(0, 1, 16).astype(np.float32))]
        nodes += [h.make_node("DequantizeLinear", [f"w{i}", f"w{i}_s", f"w{i}_z"], [f"w{i}_dq"]),
                  h.make_node("Conv", ["x_dq", f"w{i}_dq", f"b{i}"], [f"conv{i}"],
                              strides=[stride, stride])]
        q_nodes, q_inits = _qdq(f"c{i}", f"conv{i}", 0.05 + 0.02 * i, 120 + 4 * i)
        nodes += q_nodes
        inits += q_inits
    inits += [init("scales", np.array([1, 1, 2, 2], np.float32))]
    nodes.append(h.make_node("Resize", ["c0_dq", "", "scales"], ["up"], mode="nearest",
                             coordinate_transformation_mode="asymmetric", nearest_mode="floor"))
    if per_channel:
        inits += [init("u_s", rng.uniform(0.04, 0.06, 16).astype(np.float32)),
                  init("u_z", np.full(16, 121, np.uint8))]
        nodes += [h.make_node("QuantizeLinear", ["up", "u_s", "u_z"], ["u_q"], axis=1),
                  h.make_node("DequantizeLinear", ["u_q", "u_s", "u_z"], ["u_dq"], axis=1)]
    else:
        q_nodes, q_inits = _qdq("u", "up", 0.05, 120)  # the map's own scale again
        nodes += q_nodes
        inits += q_inits
    q_nodes, q_inits = _qdq("k", "cat", 0.09, 118)
    nodes += [h.make_node("Concat", ["u_dq", "c1_dq"], ["cat"], axis=1), *q_nodes]
    inits += q_inits
    for name, src, cin in (("y", "k_dq", 32), ("z", "c0_dq", 16)):
        w = rng.integers(-60, 60, size=(8, cin, 1, 1)).astype(np.int8)
        inits += [init(f"{name}w", w), init(f"{name}w_s", np.float32(0.01)),
                  init(f"{name}w_z", np.int8(0))]
        nodes += [h.make_node("DequantizeLinear", [f"{name}w", f"{name}w_s", f"{name}w_z"],
                              [f"{name}w_dq"]),
                  h.make_node("Conv", [src, f"{name}w_dq"], [name])]
    return model(nodes, {"x": ([1, 8, 24, 20], TensorProto.FLOAT)}, ["y", "z"], inits)


def _fpn_feeds() -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.default_rng(s).standard_normal((1, 8, 24, 20)).astype(np.float32)
             * 10} for s in range(3)]


def _before_and_after(m: onnx.ModelProto) -> tuple[Graph, list[dict[str, np.ndarray]], int]:
    """The graph after requantize_before_resize, the reference's outputs on the graph just
    before it, and how many requantizes it moved."""
    graph = import_graph(m)
    run_pipeline(graph, PassContext(), until="eliminate_requantize")
    before = [evaluate(graph, f) for f in _fpn_feeds()]
    changed = quantize_before_reshape.run_requantize(graph, PassContext())
    return graph, before, changed


def test_requantize_moves_before_an_enlarging_nearest_resize_exactly() -> None:
    """The Concat's requantize of the upsampled map (DQ → Q into the Concat's scale, made by
    propagate_dequantize) moves before the nearest Resize: the Resize reads the requantized
    small map; the reference's outputs are bit-identical before and after."""
    graph, before, changed = _before_and_after(_fpn_shared_source())
    assert changed == 1
    [resize] = [n for n in graph.topo_order() if n.op is Op.RESIZE]
    moved = graph.producer(resize.inputs[0])
    assert moved.op is Op.FAKE_QUANTIZE
    assert graph.producer(moved.inputs[0]).op is Op.DEQUANTIZE_LINEAR
    assert graph.info(resize.outputs[0]).quant.scale[0] == np.float32(0.09)
    for f, want in zip(_fpn_feeds(), before, strict=True):
        got = evaluate(graph, f)
        for name in ("y", "z"):
            np.testing.assert_array_equal(got[name], want[name])


def test_a_per_channel_requantize_moves_with_its_channels() -> None:
    """A Resize's output quantized per channel in scales of its own: that requantize moves
    before the Resize too (the Resize keeps the channels in place), bit-identical."""
    graph, before, changed = _before_and_after(_fpn_shared_source(per_channel=True))
    assert changed == 2  # the per-channel requantize, then the Concat's after it
    [resize] = [n for n in graph.topo_order() if n.op is Op.RESIZE]
    [concat] = [n for n, _ in graph.consumers(resize.outputs[0])]
    assert concat.op is Op.CONCAT and graph.producer(resize.inputs[0]).op is Op.FAKE_QUANTIZE
    for f, want in zip(_fpn_feeds(), before, strict=True):
        got = evaluate(graph, f)
        for name in ("y", "z"):
            np.testing.assert_array_equal(got[name], want[name])


def test_the_resize_moves_bytes_after_the_requantize() -> None:
    """Compiled: with the requantize first, the Resize is a copy with no post-ops (a reorder
    repeating its source into the Concat's region); without it the resampling kernel
    requantizes the enlarged map. Outputs identical."""
    from qfuse.ir.postops import ComposerOptions

    m = _fpn_shared_source()
    on = compile_model(m, threads=1)
    off = compile_model(m, threads=1,
                        composer=ComposerOptions().without("requantize_before_resize"))
    resize_on = [k for k in on.inspect()["kernels"] if k["name"].startswith("Resize")]
    resize_off = [k for k in off.inspect()["kernels"] if k["name"].startswith("Resize")]
    assert [k["post_ops"] for k in resize_on] == [[]]
    assert resize_off and resize_off[0]["post_ops"]
    for f in _fpn_feeds():
        a, b = on.run(f), off.run(f)
        for name in ("y", "z"):
            np.testing.assert_array_equal(a[name], b[name])


def test_a_per_channel_requantize_stays_after_a_resize_of_the_channels() -> None:
    """A nearest Resize that also doubles the channels, then a requantize per channel: its 8
    scales belong to the enlarged channels, so it stays after the Resize (a per-tensor one
    would move)."""
    from tests.compiler.onnx_builders import init, model
    from tests.compiler.test_in_place_concat import _qdq

    rng = np.random.default_rng(3)
    nodes, inits = _qdq("x", "x", 0.02, 128)
    inits += [init("scales", np.array([1, 2, 2, 2], np.float32)),
              init("u_s", rng.uniform(0.02, 0.03, 8).astype(np.float32)),
              init("u_z", np.full(8, 120, np.uint8))]
    nodes += [h.make_node("Resize", ["x_dq", "", "scales"], ["up"], mode="nearest",
                          coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
              h.make_node("QuantizeLinear", ["up", "u_s", "u_z"], ["u_q"], axis=1),
              h.make_node("DequantizeLinear", ["u_q", "u_s", "u_z"], ["u_dq"], axis=1),
              h.make_node("Relu", ["x_dq"], ["r"])]  # the Resize's source has another reader
    graph = import_graph(model(nodes, {"x": ([1, 4, 6, 5], TensorProto.FLOAT)},
                               ["u_dq", "r"], inits))
    run_pipeline(graph, PassContext(), until="eliminate_requantize")
    [resize] = [n for n in graph.topo_order() if n.op is Op.RESIZE]
    assert [n.op for n, _ in graph.consumers(resize.outputs[0])] == [Op.DEQUANTIZE_LINEAR]
    assert quantize_before_reshape.run_requantize(graph, PassContext()) == 0


def _normalized_keys() -> onnx.ModelProto:
    """XCiT's keys in quantize_static's form: k / ‖k‖ (a Div of two run-time tensors), then a
    Transpose, then the quantize the q·kᵀ MatMul reads."""
    inits = [nh.from_array(np.float32(0.05), "ks"), nh.from_array(np.uint8(128), "kz"),
             nh.from_array(np.float32(0.01), "ts"), nh.from_array(np.uint8(128), "tz"),
             nh.from_array(np.array([-1], np.int64), "axes"),
             nh.from_array(np.float32(1e-12), "eps")]
    nodes = [h.make_node("QuantizeLinear", ["k", "ks", "kz"], ["kq"]),
             h.make_node("DequantizeLinear", ["kq", "ks", "kz"], ["kd"]),
             h.make_node("ReduceL2", ["kd", "axes"], ["n"], keepdims=1),
             h.make_node("Clip", ["n", "eps"], ["nc"]),
             h.make_node("Div", ["kd", "nc"], ["u"]),
             h.make_node("Transpose", ["u"], ["t"], perm=[0, 1, 3, 2]),
             h.make_node("QuantizeLinear", ["t", "ts", "tz"], ["tq"]),
             h.make_node("DequantizeLinear", ["tq", "ts", "tz"], ["y"])]
    graph = h.make_graph(nodes, "keys",
                         [h.make_tensor_value_info("k", TensorProto.FLOAT, [1, 4, 8, 20])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 20, 8])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


def test_quantize_moves_before_a_transpose_exactly() -> None:
    """The Transpose then moves 8-bit values, and the Div's chain ends in the quantize: one
    kernel for the Div and its quantize. Bit-identical to the reference before the pass."""
    graph = import_graph(_normalized_keys())
    feeds = [{"k": np.random.default_rng(s).normal(0, 2, (1, 4, 8, 20)).astype(np.float32)}
             for s in range(3)]
    assert _moved_exactly(graph, feeds) == 1
    kernels = compile_model(_normalized_keys()).inspect()["kernels"]
    [div] = [k for k in kernels if "Div_4" in k["absorbed"]]
    assert "QuantizeLinear_6" in div["absorbed"], div["absorbed"]


def _window_partition() -> onnx.ModelProto:
    """Swin's window partition in onnxruntime's QOperator form: a float LayerNorm, then
    Reshape → Transpose → Reshape in float32, and only then the quantize before the int8
    MatMul."""
    rng = np.random.default_rng(7)
    inits = [nh.from_array(rng.standard_normal(C).astype(np.float32), "g"),
             nh.from_array(rng.standard_normal(C).astype(np.float32), "b"),
             nh.from_array(np.array([1, 2, 2, 2, 2, C], np.int64), "split"),
             nh.from_array(np.array([4, 4, C], np.int64), "windows"),
             nh.from_array(np.float32(0.03), "s"), nh.from_array(np.uint8(128), "z"),
             nh.from_array(rng.integers(-90, 90, (C, C)).astype(np.int8), "w"),
             nh.from_array(np.float32(0.01), "ws"), nh.from_array(np.int8(0), "wz")]
    nodes = [h.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
             h.make_node("Reshape", ["n", "split"], ["p"]),
             h.make_node("Transpose", ["p"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
             h.make_node("Reshape", ["t", "windows"], ["win"]),
             h.make_node("QuantizeLinear", ["win", "s", "z"], ["wq"]),
             h.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"]),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"]),
             h.make_node("MatMul", ["wd", "wf"], ["y"])]
    graph = h.make_graph(nodes, "windows",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, C])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4, C])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


def test_quantize_moves_before_every_data_movement_in_a_row() -> None:
    """The quantize moves before the three ops (one at a time it moved one), so the LayerNorm
    writes it and the window partition moves 8-bit values: exact."""
    model = _window_partition()
    graph = import_graph(model)
    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 16, C)).astype(np.float32)}
             for s in range(3)]
    assert _moved_exactly(graph, feeds) == 3
    [fq] = [n for n in graph.topo_order() if n.op is Op.FAKE_QUANTIZE]
    assert graph.producer(fq.inputs[0]).op is Op.LAYER_NORM
    kernels = compile_model(model).inspect()["kernels"]
    [norm] = [k for k in kernels if k["primitive"] == "layer_normalization"]
    assert norm["dst_dtype"] == "u8"
    assert not [k["name"] for k in kernels if k["src_dtype"] == "f32" and k["name"] != norm["name"]]


def test_under_a_dequantize_the_quantize_moves_one_op_only() -> None:
    """``DQ → Reshape → Transpose → Q``: nothing above could write the quantize (a requantize
    of the integers), so it moves before the Transpose only, as one op at a time did — further
    up it would stand between a Slice and the Transpose reading the Slice's source in place
    (PP-OCRv4 rec QOperator: one copy more)."""
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             h.make_node("Reshape", ["xd", "split"], ["p"]),
             h.make_node("Transpose", ["p"], ["t"], perm=[0, 2, 1, 3]),
             h.make_node("QuantizeLinear", ["t", "s2", "z"], ["tq"]),
             h.make_node("DequantizeLinear", ["tq", "s2", "z"], ["y"])]
    inits = [nh.from_array(np.float32(0.03), "s"), nh.from_array(np.float32(0.05), "s2"),
             nh.from_array(np.uint8(128), "z"),
             nh.from_array(np.array([1, 4, 2, C], np.int64), "split")]
    graph = h.make_graph(nodes, "requantize",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, C])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, C])],
                         inits)
    g = import_graph(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 8, C)).astype(np.float32)}
             for s in range(3)]
    assert _moved_exactly(g, feeds) == 1
    producers = [g.producer(n.inputs[0]) for n in g.topo_order() if n.op is Op.FAKE_QUANTIZE]
    assert [p.op for p in producers if p is not None] == [Op.RESHAPE]
