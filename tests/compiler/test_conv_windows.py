"""compiler/lower/conv_windows.py: an int8 convolution of few input channels and a long
overlapping kernel (an STFT as a Conv1d) runs as a 1x1 convolution over a block-wise copy of
its windows. Bit-identical to the direct convolution (the same integer sums and chain), within
a rounding step of the reference; small ones, padded ones and many channels stay direct."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.compiler.lower import conv_windows
from qfuse.ir.postops import ComposerOptions
from qfuse.runtime.numerics import step_diff
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32
OFF = ComposerOptions().without("conv_windows")


def _windows_conv(spatial: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
                  channels: int = 1, out: int = 128, signed: bool = False,
                  pads: int = 0) -> onnx.ModelProto:
    """x[1, C, spatial…] → Q/DQ (u8 with zero point 128, or s8) → Conv(DQ(w) per output
    channel, bias) → Q/DQ (u8)."""
    rng = np.random.default_rng(4)
    xz = (np.int8(0) if signed else np.uint8(128))
    inits = [init("w", rng.integers(-127, 128, (out, channels, *kernel)).astype(np.int8)),
             init("ws", rng.uniform(0.0002, 0.001, out).astype(F32)),
             init("wz", np.zeros(out, np.int8)), init("b", rng.normal(0, 0.5, out).astype(F32)),
             init("xs", F32(0.02)), init("xz", xz), init("ys", F32(0.05)),
             init("yz", np.uint8(128))]
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], kernel_shape=list(kernel),
                              strides=list(strides), pads=[pads] * (2 * len(kernel))),
             *qdq_pair("y", "c", "y")]
    return model(nodes, {"x": ([1, channels, *spatial], TensorProto.FLOAT)}, ["y"], inits)


def _kernels(compiled) -> list[dict]:
    return compiled.inspect()["kernels"]


def _conv(kernels: list[dict]) -> dict:
    """The convolution kernel (without VNNI an int8 convolution may run split in two for
    exactness, its low half named ':lo'): the one named as its node."""
    (conv,) = [k for k in kernels if k["primitive"] == "convolution"
               and k["name"] == k["node"]]
    return conv


@pytest.mark.parametrize("case", ["stft", "stft s8", "two channels 2-D"])
def test_a_long_overlapping_kernel_runs_over_its_windows_bit_identical(
        case: str, monkeypatch) -> None:
    if case == "two channels 2-D":  # built as 1-D is, taken only in 1-D (it measured slower)
        monkeypatch.setattr(conv_windows, "ONE_D", (1, 2))
    _windows_bit_identical(case)


def _windows_bit_identical(case: str) -> None:
    m, shape, blocks = {
        "stft": (lambda: _windows_conv((16000,), (256,), (80,)), (1, 1, 16000), 4),
        "stft s8": (lambda: _windows_conv((16000,), (256,), (80,), signed=True),
                    (1, 1, 16000), 4),
        "two channels 2-D": (lambda: _windows_conv((128, 128), (16, 16), (8, 8), channels=2,
                                                   out=64), (1, 2, 128, 128), 4),
    }[case]
    m = m()
    on, off = compile_model(m), compile_model(m, composer=OFF)
    kernels = _kernels(on)
    copies = [k for k in kernels if "windows with strides" in k.get("note", "")]
    assert len(copies) == blocks and all(k["impl"].startswith("jit") for k in copies), kernels
    conv = _conv(kernels)
    assert "1x1" in conv["impl"], conv  # brgconv_1x1 (AVX-512), jit_uni_int8_1x1 (AVX2)
    assert "1x1" not in _conv(_kernels(off))["impl"]
    reference = compile_model(m, mode="reference")
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1.5, shape).astype(F32)}
        got = on.run(feeds)["y"]
        assert np.array_equal(got.view(np.uint32), off.run(feeds)["y"].view(np.uint32))
        assert step_diff(got, reference.run(feeds)["y"], 0.05).max_steps <= 1


@pytest.mark.parametrize("case", ["few multiply-adds", "padding", "many channels",
                                  "no overlap", "2-D"])
def test_other_convolutions_stay_direct(case: str) -> None:
    m = {"few multiply-adds": lambda: _windows_conv((4000,), (256,), (80,), out=16),
         "padding": lambda: _windows_conv((16000,), (256,), (80,), pads=8),
         "many channels": lambda: _windows_conv((4000,), (64,), (16,), channels=8),
         "no overlap": lambda: _windows_conv((16000,), (80,), (80,)),
         "2-D": lambda: _windows_conv((128, 128), (16, 16), (8, 8), channels=2, out=64)}[case]()
    kernels = _kernels(compile_model(m))
    assert not [k for k in kernels if "windows with strides" in k.get("note", "")], kernels
