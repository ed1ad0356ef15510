"""Depthwise inputs quantized per channel with one zero point (compiler/quantize/placement.py
``_depthwise_inputs``, methods.channel_scales): which tensors qualify, the scales against a
channel-by-channel search of the formula, and the compiled model against exact QDQ (op by op,
in LSB) with the kernels of per-tensor placement."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.api import compile_model
from qfuse.compiler.op_check import check_op_by_op, format_text
from qfuse.compiler.quantize import quantize
from qfuse.compiler.quantize.api import calibrate, run
from qfuse.compiler.quantize.methods import channel_scales, choose_qparams
from qfuse.compiler.quantize.placement import place
from qfuse.examples import zoo

RNG = np.random.default_rng(0)


def _w(cout: int, cin: int, k: int = 3) -> np.ndarray:
    return (RNG.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)


def _model(extra_reader: bool = False) -> onnx.ModelProto:
    """Conv → HardSwish → depthwise Conv → Relu → Conv; with ``extra_reader`` the HardSwish
    output is also read by a pointwise Conv (the two results added)."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h1"]),
             helper.make_node("Conv", ["h1", "wd", "bd"], ["cd"], pads=[1, 1, 1, 1], group=8,
                              name="dw"),
             helper.make_node("Relu", ["cd"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y0" if extra_reader else "y"])]
    inits = {"w1": _w(8, 3), "b1": RNG.standard_normal(8) * 0.5, "wd": _w(8, 1),
             "bd": RNG.standard_normal(8) * 0.1, "w2": _w(4, 8, 1), "b2": np.zeros(4)}
    if extra_reader:
        nodes += [helper.make_node("Conv", ["h1", "w3", "b2"], ["p"]),
                  helper.make_node("Add", ["y0", "p"], ["y"])]
        inits["w3"] = _w(4, 8, 1)
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 12, 12])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.checker.check_model(model)
    return model


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    # channels of very different spread, so per-channel scales differ
    spread = np.array([0.2, 1.0, 4.0], np.float32).reshape(1, 3, 1, 1)
    return [{"x": (rng.standard_normal((1, 3, 12, 12)) * spread).astype(np.float32)}
            for _ in range(n)]


# ------------------------------------------------------------------------------ placement
def test_only_tensors_read_by_depthwise_convs_alone_are_per_channel() -> None:
    assert place(_model()).channel_axis == {"h1": 1}
    assert place(_model(extra_reader=True)).channel_axis == {}  # a pointwise reader too
    assert place(_model(), per_channel=False).channel_axis == {}
    assert place(_model(), exclude={"dw"}).channel_axis == {}
    # the graph input read by a depthwise conv stays per tensor
    m = _model()
    m.graph.node[2].input[0] = "x"
    next(a for a in m.graph.node[2].attribute if a.name == "group").i = 3
    m.graph.initializer[2].CopyFrom(numpy_helper.from_array(_w(3, 1), "wd"))
    onnx.checker.check_model(m)
    assert place(m).channel_axis == {}


# ------------------------------------------------------------------------------ the scales
def _smallest_covering_scale(lo_c: float, hi_c: float, zp: int, qmin: int, qmax: int,
                             fallback: float) -> float:
    """By search, not by formula: the smallest float32 s whose grid at ``zp`` holds both
    ends of [min(lo_c, 0), max(hi_c, 0)] without clipping (q = round(v / s) + zp)."""
    lo_c, hi_c = min(lo_c, 0.0), max(hi_c, 0.0)
    if lo_c == hi_c == 0.0:
        return fallback

    a, b = 1e-12, 1e6  # bisection on the clipping boundary
    for _ in range(200):
        mid = (a + b) / 2
        a, b = (a, mid) if _covers(mid, lo_c, hi_c, zp, qmin, qmax) else (mid, b)
    return b


def _covers(s: float, lo_c: float, hi_c: float, zp: int, qmin: int, qmax: int) -> bool:
    """Both ends of [lo_c, hi_c] land inside [qmin, qmax] at scale s (ONNX QuantizeLinear:
    round half to even, then the zero point)."""
    return (np.rint(np.float32(hi_c) / np.float32(s)) + zp <= qmax and
            np.rint(np.float32(lo_c) / np.float32(s)) + zp >= qmin)


@pytest.mark.parametrize("qmin,qmax", [(0, 255), (-128, 127)])
def test_channel_scales_are_the_smallest_that_cover_each_channel(qmin: int, qmax: int) -> None:
    rng = np.random.default_rng(3)
    ch_lo = np.minimum(rng.standard_normal(16) * 0.3, rng.uniform(0, 0.2, 16))
    ch_hi = np.abs(rng.standard_normal(16)) * rng.choice([0.1, 1.0, 8.0], 16)
    ch_lo[3] = ch_hi[3] = 0.0  # an all-zero channel
    ch_lo[5], ch_hi[5] = 0.2, 0.9  # a channel that never reaches 0
    lo, hi = float(ch_lo.min()), float(ch_hi.max())
    scale, zp = choose_qparams(lo, hi, qmin, qmax)
    got = channel_scales(ch_lo, ch_hi, lo, hi, scale, zp, qmin, qmax)
    assert got.dtype == np.float32 and got.shape == (16,)
    steps = min(n for n in (qmax - zp, zp - qmin) if n > 0)
    for c in range(16):
        if c == 3:
            continue  # all zero: the tensor's scale
        want = _smallest_covering_scale(ch_lo[c], ch_hi[c], zp, qmin, qmax, scale)
        # on the grid (an end exactly on qmax or qmin), and at most half a step coarser than
        # the smallest scale that keeps both ends on the grid
        assert _covers(got[c] * (1 + 1e-6), ch_lo[c], ch_hi[c], zp, qmin, qmax), c
        assert want * (1 - 1e-6) <= got[c] <= want * (1 + 0.5 / steps) * (1 + 1e-6), \
            (c, want, got[c])
    assert got[3] == np.float32(scale)
    assert np.count_nonzero(got < np.float32(scale)) >= 12  # finer than per tensor


def test_channel_ranges_are_clipped_to_the_methods_range() -> None:
    got = channel_scales(np.array([-4.0, -0.1]), np.array([10.0, 0.5]), -1.0, 2.0,
                         3.0 / 255, 85, 0, 255)
    assert got[0] == np.float32(max(2.0 / 170, 1.0 / 85))
    assert got[1] == np.float32(max(0.5 / 170, 0.1 / 85))


# ------------------------------------------------------------------------------ end to end
def test_written_quantizer_has_channel_scales_and_one_zero_point() -> None:
    fm = _model()
    stats = calibrate(fm, _feeds(6, seed=1))
    q = run(fm, None, statistics=stats).model
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    qnode = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "h1")
    assert [a.i for a in qnode.attribute if a.name == "axis"] == [1]
    scale, zp = inits[qnode.input[1]], inits[qnode.input[2]]
    assert scale.shape == zp.shape == (8,) and len(set(zp.tolist())) == 1
    # the channel ranges seen in calibration: every channel's values stay on its grid
    rng = stats.channels["h1"]
    assert np.all(np.rint(rng.max / scale) + zp.astype(np.int64) <= 255)
    assert np.all(np.rint(rng.min / scale) + zp.astype(np.int64) >= 0)
    assert len(np.unique(scale)) > 1
    fq = run(fm, None, statistics=stats, format="fakequantize").model
    node = next(n for n in fq.graph.node if n.op_type == "FakeQuantize" and n.input[0] == "h1")
    low = {t.name: numpy_helper.to_array(t) for t in fq.graph.initializer}[node.input[1]]
    assert low.shape == (8, 1, 1)
    np.testing.assert_allclose(low.ravel(), scale * (0.0 - zp), rtol=1e-6)


@pytest.mark.parametrize("fmt", ["qdq", "fakequantize"])
def test_per_channel_depthwise_input_compiles_in_the_kernels_of_per_tensor(fmt: str) -> None:
    fm, calib = _model(), _feeds(6, seed=1)
    per_channel = compile_model(quantize(fm, calib, format=fmt))
    stats = calibrate(fm, calib)
    stats.channels.clear()  # the same placement with the tensor's one scale on h1
    plain = compile_model(run(fm, None, statistics=stats, format=fmt).model)
    assert len(per_channel.inspect()["kernels"]) == len(plain.inspect()["kernels"])
    assert per_channel.inspect()["not_fused"] == plain.inspect()["not_fused"]
    assert not [d for d in per_channel.inspect()["not_fused"]
                if d["reason"] == "no pass matched"]


def test_per_channel_depthwise_input_within_one_lsb_of_exact_qdq() -> None:
    q = quantize(_model(), _feeds(6, seed=1))
    compiled = compile_model(q)
    for feeds in _feeds(3, seed=7):
        check = check_op_by_op(q, feeds, compiled=compiled)
        assert check.ints and check.max_lsb <= 1, format_text(check)


def test_mobilenetv2_depthwise_inputs_per_channel_within_one_lsb() -> None:
    fm = zoo.float_model("mobilenetv2")
    calib = zoo.sample_inputs(fm, 4, seed=0)
    stats = calibrate(fm, calib)
    assert stats.channels  # the example's depthwise convs
    q = run(fm, None, statistics=stats).model
    per_axis = [n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.attribute]
    assert len(per_axis) == len(stats.channels)
    compiled = compile_model(q)
    assert not [d for d in compiled.inspect()["not_fused"] if d["reason"] == "no pass matched"]
    for feeds in zoo.sample_inputs(fm, 2, seed=21):
        check = check_op_by_op(q, feeds, compiled=compiled)
        assert check.max_lsb <= 1, format_text(check)
