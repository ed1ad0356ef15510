"""patch_conv: an int8 convolution whose kernel tiles an image of few channels (a vision
transformer's patch embedding) runs as a 1x1 convolution over the patches, one reorder before
it. Bit-identical to the direct convolution's plan (the same exact integer sums, the same
chain), within a rounding step of the reference (ties of the composed scale, as the direct
plan); other geometries stay direct."""

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
OFF = ComposerOptions().without("patch_conv")


def _patch_embedding(channels: int = 3, kernel: tuple[int, int] = (16, 16),
                     size: tuple[int, int] = (64, 48), pads: int = 0,
                     relu: bool = False) -> onnx.ModelProto:
    """x[1, C, H, W] → Q/DQ (u8) → Conv(DQ(w) per output channel, bias, kernel = stride)
    [→ Relu] → Q/DQ (s8)."""
    rng = np.random.default_rng(3)
    o = 24
    inits = [init("w", rng.integers(-127, 128, (o, channels, *kernel)).astype(np.int8)),
             init("ws", rng.uniform(0.0005, 0.002, o).astype(F32)),
             init("wz", np.zeros(o, np.int8)), init("b", rng.normal(0, 0.5, o).astype(F32)),
             init("xs", F32(0.02)), init("xz", np.uint8(128)),
             init("ys", F32(0.05)), init("yz", np.int8(0))]
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], kernel_shape=list(kernel),
                              strides=list(kernel), pads=[pads] * 4)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
    nodes += qdq_pair("y", "r" if relu else "c", "y")
    return model(nodes, {"x": ([1, channels, *size], TensorProto.FLOAT)}, ["y"], inits)


def _conv_kernel(compiled) -> dict:
    """The convolution kernel (the first of two where an int8 convolution runs split for
    exactness without VNNI; both have the same weights shape)."""
    convs = [k for k in compiled.inspect()["kernels"] if k["primitive"] == "convolution"]
    assert convs and len({k["weights_layout"].split(" strides")[0] for k in convs}) == 1, convs
    return convs[0]


@pytest.mark.parametrize("kernel,relu", [((16, 16), False), ((32, 32), True), ((8, 16), False)])
def test_a_patch_embedding_is_a_1x1_convolution_bit_identical(kernel: tuple[int, int],
                                                              relu: bool) -> None:
    m = _patch_embedding(kernel=kernel, size=(64, 96), relu=relu)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    conv = _conv_kernel(on)
    depth = 3 * kernel[0] * kernel[1]
    assert f"(24, {depth}, 1, 1)" in conv["weights_layout"], conv
    assert not conv["impl"].startswith("ref"), conv
    assert f"(24, 3, {kernel[0]}, {kernel[1]})" in _conv_kernel(off)["weights_layout"]
    reference = compile_model(m, mode="reference")
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1.5, (1, 3, 64, 96)).astype(F32)}
        got = on.run(feeds)["y"]
        assert np.array_equal(got.view(np.uint32), off.run(feeds)["y"].view(np.uint32))
        assert step_diff(got, reference.run(feeds)["y"], 0.05).max_steps <= 1


@pytest.mark.parametrize("case", ["small patches", "many channels", "padding", "not tiled"])
def test_other_geometries_stay_direct(case: str) -> None:
    m = {"small patches": lambda: _patch_embedding(kernel=(4, 4)),
         "many channels": lambda: _patch_embedding(channels=16),
         "padding": lambda: _patch_embedding(pads=1),
         "not tiled": lambda: _patch_embedding(size=(64, 40))}[case]()
    conv = _conv_kernel(compile_model(m))
    assert ", 1, 1)" not in conv["weights_layout"], conv
