"""wide_conv: an int8 convolution over a one-pixel-wide image (a 1-D convolution written as a
2-D one along the height, as jax2tf exports it) runs over the image seen one pixel high.
Bit-identical to the tall plan (the same integer sums, the same chain), within a rounding step
of the reference; other geometries stay as they are."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.ir.postops import ComposerOptions
from qfuse.runtime.numerics import step_diff
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32
OFF = ComposerOptions().without("wide_conv")


def _tall_conv(*, width: int = 1, kernel: tuple[int, int] = (5, 1),
               pads: tuple[int, int, int, int] = (2, 0, 2, 0), strides: tuple[int, int] = (1, 1),
               group: int = 1, residual: bool = False, channels: int = 32,
               height: int = 300) -> onnx.ModelProto:
    """x[1, C, H, W] → Q/DQ (u8) → Conv(DQ(w) per output channel, bias) [+ DQ(r), the residual
    r a second input quantized s8] → Relu → Q/DQ (u8)."""
    rng = np.random.default_rng(5)
    o = channels
    inits = [init("w", rng.integers(-127, 128, (o, channels // group, *kernel)).astype(np.int8)),
             init("ws", rng.uniform(0.0005, 0.002, o).astype(F32)),
             init("wz", np.zeros(o, np.int8)), init("b", rng.normal(0, 0.5, o).astype(F32)),
             init("xs", F32(0.02)), init("xz", np.uint8(128)),
             init("rs", F32(0.03)), init("rz", np.int8(0)),
             init("ys", F32(0.05)), init("yz", np.uint8(0))]
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], kernel_shape=list(kernel),
                              strides=list(strides), pads=list(pads), group=group)]
    inputs = {"x": ([1, channels, height, width], TensorProto.FLOAT)}
    last = "c"
    if residual:
        out_h = (height + pads[0] + pads[2] - kernel[0]) // strides[0] + 1
        inputs["r"] = ([1, o, out_h, 1], TensorProto.FLOAT)
        nodes += [*qdq_pair("r", "r", "rd"), helper.make_node("Add", ["c", "rd"], ["s"])]
        last = "s"
    nodes += [helper.make_node("Relu", [last], ["a"]), *qdq_pair("y", "a", "y")]
    return model(nodes, inputs, ["y"], inits)


def _conv(compiled) -> dict:
    """The convolution kernel (without VNNI an int8 convolution may run split in two for
    exactness, its low half named ':lo'): the one named as its node."""
    convs = [k for k in compiled.inspect()["kernels"] if k["primitive"] == "convolution"
             and k["name"] == k["node"]]
    assert len(convs) == 1, convs
    return convs[0]


def _feeds(m: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.normal(0, 2, [d.dim_value for d in i.type.tensor_type.shape.dim]
                               ).astype(F32) for i in m.graph.input}


@pytest.mark.parametrize("case", ["plain", "strided", "depthwise", "residual"])
def test_a_one_pixel_wide_conv_runs_one_pixel_high_bit_identical(case: str) -> None:
    kwargs = {"plain": {}, "strided": {"strides": (2, 1), "kernel": (3, 1),
                                       "pads": (1, 0, 1, 0)},
              "depthwise": {"group": 32}, "residual": {"residual": True}}[case]
    m = _tall_conv(**kwargs)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    conv = _conv(on)
    assert "(1, 32, 1, 300)" in conv["src_layouts"][0], conv
    assert "(1, 32, 300, 1)" in _conv(off)["src_layouts"][0], _conv(off)
    assert ", 1, 5)" in conv["weights_layout"] or ", 1, 3)" in conv["weights_layout"], conv
    assert not conv["impl"].startswith("ref"), conv
    assert len(on.inspect()["kernels"]) == len(off.inspect()["kernels"])
    reference = compile_model(m, mode="reference")
    for seed in range(3):
        feeds = _feeds(m, seed)
        got = on.run(feeds)["y"]
        assert np.array_equal(got.view(np.uint32), off.run(feeds)["y"].view(np.uint32))
        assert step_diff(got, reference.run(feeds)["y"], 0.05).max_steps <= 1


@pytest.mark.parametrize("case", ["two pixels wide", "kernel width 3", "1x1 kernel"])
def test_other_geometries_stay(case: str) -> None:
    m = {"two pixels wide": lambda: _tall_conv(width=2),
         "kernel width 3": lambda: _tall_conv(width=3, kernel=(5, 3)),
         "1x1 kernel": lambda: _tall_conv(kernel=(1, 1), pads=(0, 0, 0, 0))}[case]()
    conv = _conv(compile_model(m))
    assert ", 1, 300)" not in conv["src_layouts"][0], conv
