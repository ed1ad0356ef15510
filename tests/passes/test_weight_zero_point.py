"""weight_zero_point: a convolution whose weights leave s8 once their zero point is taken off
(quantize_static's ``weight_type=QUInt8, per_channel=False``: asymmetric u8 weights) becomes a
main and a box-sum int8 convolution, their integer sum, the scale and the bias
(passes/weight_zero_point.py).

Numerics: both convolutions write integers in float32 and the Add is their exact sum (every
partial sum here is below 2^24), so the rewritten graph computes ``f32(acc)·(sx·sw) + b`` with
``acc`` the exact integer accumulator: asserted bit for bit against numpy's int64
convolution. The graph before rounds each dequantized input to float32; against it the result
is within the bound that rounding gives (``_check_numerics``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from quant_helpers import F32, add, apply, const, dequantize, feeds, finish, int_input, reasons
from quant_helpers import reference

import qfuse
import qfuse.passes.weight_zero_point as W
from qfuse.compiler import pipeline
from qfuse.ir import Node, Op
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs
from qfuse.runtime.reference import IMPLS

SX, ZX, SW = 0.05, 117, 0.01
RNG = np.random.default_rng(11)

# name: (in channels, out channels, kernel, group, weight zero point(s), weight type)
CASES = {
    "one_box_sum": (64, 96, 3, 1, 37, np.uint8),  # 576 products per output: one box sum
    "one_box_sum_1x1": (256, 64, 1, 1, 90, np.uint8),  # strided: the channel sums' own window
    "box_sum_per_channel": (8, 16, 1, 1, 200, np.uint8),  # 8 products: one per channel
    "depthwise": (16, 16, 3, 16, 90, np.uint8),
    "grouped": (16, 32, 3, 4, 10, np.uint8),
    "all_non_negative": (32, 24, 3, 1, 0, np.uint8),  # offset 128: box weights 64, scale 2
    "s8_asymmetric": (32, 24, 3, 1, -60, np.int8),
    "per_channel": (24, 6, 3, 1, [0, 255, 37, 128, 200, 90], np.uint8),
}


def _weights(cin: int, cout: int, k: int, group: int, dtype: type) -> np.ndarray:
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    w = RNG.integers(lo, hi + 1, (cout, cin // group, k, k))
    w.flat[:2] = [lo, hi]  # the whole range: w − zw leaves s8 for every zero point above
    return w.astype(dtype)


def _graph(case: str, stride: int = 2, pad: int = 1):
    cin, cout, k, group, zw, dtype = CASES[case]
    g, xd = int_input((1, cin, 9, 10), SX, ZX)
    w = _weights(cin, cout, k, group, dtype)
    g.add_constant("wq", w)
    zw = np.asarray(zw, dtype)
    scale = np.full(zw.shape, SW, F32) if zw.size > 1 else F32(SW)
    wd = dequantize(g, "wq", "wd", scale, zw, axis=0).outputs[0]
    bias = RNG.normal(0, 1, cout).astype(F32)
    p = pad if k > 1 else 0
    attrs = ConvAttrs((k, k), (stride, stride), (p, p, p, p), (1, 1), group)
    add(g, Op.CONV, [xd, wd, const(g, "b", bias)], "conv", attrs)
    finish(g, "conv")
    return g, w, zw, bias, attrs


def _accumulate(x: np.ndarray, w: np.ndarray, zw: np.ndarray,
                attrs: ConvAttrs | ConvTransposeAttrs, magnitude: bool = False) -> np.ndarray:
    """The int64 accumulator ``Σ (x − zx)·(w − zw)`` (``magnitude``: of the absolute values)."""
    op = Op.CONV if isinstance(attrs, ConvAttrs) else Op.CONV_TRANSPOSE
    centred = w.astype(np.int64) - zw.astype(np.int64).reshape((-1, 1, 1, 1) if zw.size > 1
                                                               else ())
    xs = x.astype(np.int64) - ZX
    if magnitude:
        xs, centred = np.abs(xs), np.abs(centred)
    probe = Node("probe", op, attrs, ["x", "w"], ["y"])
    return IMPLS[op](probe, [xs, centred])[0].astype(np.int64)


def _check_numerics(g, before, w: np.ndarray, zw: np.ndarray, bias: np.ndarray,
                    attrs: ConvAttrs | ConvTransposeAttrs) -> None:
    """The rewritten graph computes ``f32(acc)·f32(sx·sw) + b`` bit for bit (acc exact, below
    2^24); the graph before (dequantized inputs rounded to float32, products summed in float64,
    rounded once) is within its rounding: each dequantized product carries 2u of relative
    error (u = 2^-24) and our scale product and multiply 2u more of ``Σ|terms|``, and each side
    rounds its result once: ``|got − want| ≤ u·(4·Σ|terms| + |got| + |want|)``."""
    for seed in range(3):
        x = feeds(g, seed)["x"]
        acc = _accumulate(x, w, zw, attrs)
        assert np.abs(acc).max() < 2**24
        got = reference(g, {"x": x})["conv"]
        np.testing.assert_array_equal(
            got, acc.astype(F32) * (F32(SX) * F32(SW)) + bias.reshape(1, -1, 1, 1))
        want = reference(before, {"x": x})["conv"]
        terms = _accumulate(x, w, zw, attrs, magnitude=True) * (float(F32(SX)) * float(F32(SW)))
        bound = 2.0**-24 * (4 * terms + np.abs(got) + np.abs(want))
        assert np.all(np.abs(got.astype(np.float64) - want) <= bound)


@pytest.mark.parametrize("case", list(CASES))
def test_two_int8_convolutions_compute_the_exact_accumulator(case: str) -> None:
    g, w, zw, bias, attrs = _graph(case)
    before = g.copy()
    result = apply(W, g)
    assert result.changed == 1, reasons(result)
    convs = {n.name.rsplit("/", 1)[-1]: n for n in g.topo_order() if n.op is Op.CONV}
    cout, group = w.shape[0], attrs.group
    narrow = group == 1 and zw.size == 1 and not W._full_box_sum(cout, w[0].size)
    assert narrow == case.startswith("one_box_sum")  # each case takes the path it is named for
    spread = narrow and w.shape[2:] != (1, 1)
    assert set(convs) == {"main", "box_sum"} | ({"channel_sum"} if spread else set())
    main_w = g.constant(g.producer(convs["main"].inputs[1]).inputs[0])
    box = convs["channel_sum" if spread else "box_sum"]
    box_w = g.constant(g.producer(box.inputs[1]).inputs[0])
    assert main_w.dtype == box_w.dtype == np.int8
    real = w.astype(np.int64) - zw.astype(np.int64).reshape((-1, 1, 1, 1) if zw.size > 1
                                                            else ())
    if zw.size == 1:  # u8 weights over [0, 255] less zw: offset 128 − zw, main w − 128
        base = 128 if w.dtype == np.uint8 else 0
        np.testing.assert_array_equal(main_w, w.astype(np.int64) - base)
    else:  # per channel: main = w − zw − o_c, o_c the offset nearest 0 that gives s8
        offsets = (real - main_w).reshape(len(real), -1)
        assert np.all(offsets == offsets[:, :1])  # one offset a channel
        for o, m in zip(offsets[:, 0], main_w):  # nearer 0 would leave s8: m at its bound
            if o > 0:
                assert m.max() == 127
            elif o < 0:
                assert m.min() == -128
    if spread:  # the channel sums (1x1), then a float32 box of the conv's window over them
        assert box_w.shape == (1, w.shape[1], 1, 1)
        ones = g.constant(convs["box_sum"].inputs[1])
        assert ones.dtype == F32 and ones.shape == (1, 1, *w.shape[2:]) and np.all(ones == 1)
        assert convs["box_sum"].attrs == attrs
    else:
        assert box_w.shape == ((1,) if narrow else (cout,)) + w.shape[1:]
    # both read the integers: x − zx (scale 1), one source for the two
    assert convs["main"].inputs[0] == box.inputs[0]
    _check_numerics(g, before, w, zw, bias, attrs)


@pytest.mark.parametrize("cin,cout,group,zw", [(128, 128, 1, 37), (8, 16, 1, 0), (16, 16, 4, 200)],
                         ids=["one_box_sum", "box_sum_per_channel", "grouped"])
def test_conv_transpose_splits_alike(cin: int, cout: int, group: int, zw: int) -> None:
    """ConvTranspose (stride 2, cropped border, output padding): the box sum is a second
    ConvTranspose with weights ``o``; exact against the int64 accumulator."""
    g, xd = int_input((1, cin, 5, 6), SX, ZX)
    w = _weights(cout // group, cin, 3, 1, np.uint8)  # [Cin, OC/g, k, k]
    g.add_constant("wq", w)
    wd = dequantize(g, "wq", "wd", F32(SW), np.uint8(zw)).outputs[0]
    bias = RNG.normal(0, 1, cout).astype(F32)
    attrs = ConvTransposeAttrs((3, 3), (2, 2), (1, 1, 0, 0), (1, 1), (1, 0), group)
    add(g, Op.CONV_TRANSPOSE, [xd, wd, const(g, "b", bias)], "conv", attrs)
    finish(g, "conv")
    before = g.copy()
    assert apply(W, g).changed == 1
    convs = {n.name.rsplit("/", 1)[-1]: n for n in g.topo_order()
             if n.op in (Op.CONV, Op.CONV_TRANSPOSE)}
    narrow = group == 1 and not W._full_box_sum(cout, cin * 9 // 4)
    assert narrow == (cout == 128)
    if narrow:  # channel sums, then a float32 ConvTranspose of ones over them
        assert convs["channel_sum"].op is Op.CONV and convs["box_sum"].attrs == attrs
        assert g.constant(convs["box_sum"].inputs[1]).shape == (1, 1, 3, 3)
    else:
        box = g.constant(g.producer(convs["box_sum"].inputs[1]).inputs[0])
        assert box.shape == w.shape, box.shape
    _check_numerics(g, before, w, np.asarray(zw), bias, attrs)


def test_weights_that_fit_s8_are_left_to_move_dequantize() -> None:
    g, xd = int_input((1, 8, 6, 6), SX, ZX)
    g.add_constant("wq", RNG.integers(28, 228, (4, 8, 3, 3)).astype(np.uint8))
    wd = dequantize(g, "wq", "wd", F32(SW), np.uint8(128)).outputs[0]
    add(g, Op.CONV, [xd, wd], "conv", ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))
    finish(g, "conv")
    result = apply(W, g)
    assert result.changed == 0 and not result.declined


def test_a_source_quantized_per_channel_is_declined_with_the_reason() -> None:
    g, xd = int_input((1, 4, 6, 6), np.array([0.1, 0.2, 0.3, 0.4], F32), [3, 3, 3, 3],
                      axis=1)
    g.add_constant("wq", _weights(4, 6, 3, 1, np.uint8))
    wd = dequantize(g, "wq", "wd", F32(SW), np.uint8(40)).outputs[0]
    add(g, Op.CONV, [xd, wd], "conv", ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))
    finish(g, "conv")
    result = apply(W, g)
    assert result.changed == 0
    assert "not dequantized per tensor" in reasons(result)[0]


def _onnx_model(case: str) -> onnx.ModelProto:
    """x → Q → DQ → Conv(DQ(u8 weights, zw), bias) → Relu → Q → DQ, as quantize_static
    writes it with ``weight_type=QUInt8, per_channel=False`` (``deconv``: a ConvTranspose of
    stride 1, its weights ``[Cin, OC, k, k]``)."""
    deconv = case == "deconv"
    cin, cout, k, group, zw, dtype = CASES["one_box_sum" if deconv else case]
    w = _weights(cout, cin, k, 1, dtype) if deconv else _weights(cin, cout, k, group, dtype)
    p = k // 2
    inits = [nh.from_array(w, "w"), nh.from_array(np.array(SW, F32), "ws"),
             nh.from_array(np.array(zw, dtype), "wz"),
             nh.from_array(RNG.normal(0, 0.5, cout).astype(F32), "b"),
             nh.from_array(np.array(SX, F32), "xs"), nh.from_array(np.array(ZX, np.uint8), "xz"),
             nh.from_array(np.array(0.05, F32), "ys"), nh.from_array(np.array(0, np.uint8), "yz")]
    nodes = [oh.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             oh.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             oh.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             oh.make_node("ConvTranspose" if deconv else "Conv", ["xd", "wd", "b"], ["c"],
                          pads=[p] * 4, group=group),
             oh.make_node("Relu", ["c"], ["r"]),
             oh.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
             oh.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = oh.make_graph(nodes, case,
                          [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 12, 12])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 12, 12])],
                          inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("case", ["one_box_sum", "box_sum_per_channel", "depthwise", "deconv"])
def test_compiled_convolutions_are_int8_and_agree_with_onnxruntime(case: str) -> None:
    """End to end: every convolution an int8 kernel (u8 source; without the pass the conv
    runs in float32), none on ``ref:``, the output within 1 LSB of onnxruntime's dequantized
    float convolution (its float products round near .5 ties either way)."""
    model = _onnx_model(case)
    kernels = qfuse.compile_model(model).inspect()["kernels"]
    kinds = ("convolution", "deconvolution")
    convs = [k for k in kernels if k["primitive"] in kinds]  # without VNNI: halves too
    parts = {k["node"].rsplit("/", 1)[-1] for k in convs}
    spread = {"channel_sum"} if case in ("one_box_sum", "deconv") else set()
    assert parts == {"main", "box_sum"} | spread, convs
    for kernel in convs:  # int8, but for the float32 box over the channel sums
        spread = kernel["node"].endswith("box_sum") and "channel_sum" in parts
        assert kernel["src_dtype"] == ("f32" if spread else "u8"), kernel
    assert not [k["name"] for k in kernels if "ref" in k["impl"]]
    saved = list(pipeline.PIPELINE)
    try:
        pipeline.PIPELINE[:] = [p for p in saved if p[0] != "weight_zero_point"]
        without = qfuse.compile_model(model).inspect()["kernels"]
    finally:
        pipeline.PIPELINE[:] = saved
    assert [k["src_dtype"] for k in without if k["primitive"] in kinds] == ["f32"]
    compiled = qfuse.compile_model(model)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = {"x": np.random.default_rng(seed).normal(0, 1, compiled.input_specs()["x"][0])
             .astype(F32)}
        steps = np.abs(compiled.run(x)["y"] - session.run(None, x)[0]) / F32(0.05)
        assert steps.max() <= 1.0 + 1e-3
        assert np.mean(steps > 0.5) < 0.01


def test_an_offset_of_128_is_64_with_scale_2() -> None:
    parts = W.split(np.array([[[[0, 255]]]]), 1)  # u8 weights 0 and 255, zero point 0
    assert parts.main.tolist() == [[[[-128, 127]]]]
    assert parts.box.tolist() == [[[[64, 64]]]] and parts.box_scales.tolist() == [2.0]
