"""compiler/lower/fold_stride.py: a strided int8 convolution of fewer than 4 input channels
runs over its source seen with the stride folded into the channels (stride 1, s·C channels,
zero taps where the kernel does not fill a fold). Bit-identical to the convolution as given
(the same integer sums and chain), within a rounding step of the reference; what the form
cannot express stays as given."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.compiler.lower.fold_stride import Fold
from qfuse.compiler.lower.no_vnni import isa_is_exact
from qfuse.ir.postops import ComposerOptions
from qfuse.runtime.numerics import step_diff
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32
OFF = ComposerOptions().without("fold_stride")
NOTE = "folded into the channels"


def _strided_conv(length: int, k: int, s: int, channels: int = 1, out: int = 32,
                  pads: tuple[int, int] = (0, 0), signed: bool = False, dilation: int = 1,
                  height_one: bool = False) -> onnx.ModelProto:
    """x[1, C, L] (or [1, C, 1, L]) → Q/DQ (u8 with zero point 128, or s8) → Conv(DQ(w) per
    output channel, bias; kernel k, stride s) → Q/DQ (u8)."""
    rng = np.random.default_rng(5)
    h = [1] if height_one else []  # the height of one row: every height parameter 1 (or 0)
    inits = [init("w", rng.integers(-127, 128, (out, channels, *h, k)).astype(np.int8)),
             init("ws", rng.uniform(0.0005, 0.002, out).astype(F32)),
             init("wz", np.zeros(out, np.int8)), init("b", rng.normal(0, 0.5, out).astype(F32)),
             init("xs", F32(0.02)), init("xz", np.int8(0) if signed else np.uint8(128)),
             init("ys", F32(0.05)), init("yz", np.uint8(128))]
    no_pad = [0] * len(h)
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], kernel_shape=[*h, k],
                              strides=[*h, s], dilations=[*h, dilation],
                              pads=[*no_pad, pads[0], *no_pad, pads[1]]),
             *qdq_pair("y", "c", "y")]
    return model(nodes, {"x": ([1, channels, *h, length], TensorProto.FLOAT)}, ["y"], inits)


def _conv(compiled) -> dict:
    (conv,) = [k for k in compiled.inspect()["kernels"] if k["primitive"] == "convolution"
               and k["name"] == k["node"]]
    return conv


CASES = {
    "audio front end": dict(length=16000, k=80, s=4),  # M5: 1 → 64, k 80, s 4
    "s8 source": dict(length=4000, k=10, s=5, signed=True),  # wav2vec2's first layer
    "padded, kernel not a multiple": dict(length=3000, k=5, s=2, channels=2, pads=(2, 2)),
    "padding not a multiple": dict(length=3000, k=7, s=3, channels=3, pads=(1, 2)),
    "tail no window reads": dict(length=576, k=256, s=128, out=64),  # silero-vad's STFT
    "[N, C, 1, L]": dict(length=4000, k=8, s=4, height_one=True),
}


@pytest.mark.parametrize("case", CASES)
def test_a_strided_conv_of_few_channels_runs_folded_bit_identical(case: str) -> None:
    m = _strided_conv(**CASES[case])
    on, off = compile_model(m), compile_model(m, composer=OFF)
    conv = _conv(on)
    assert NOTE in conv.get("note", ""), conv
    assert NOTE not in _conv(off).get("note", "")
    channels, s = CASES[case].get("channels", 1), CASES[case]["s"]
    assert f"{channels} → {channels * s} input channels" in conv["note"]
    if isa_is_exact():  # else exact_int8 may copy the even input channels (no_vnni.py)
        assert not [k for k in on.inspect()["kernels"] if k["primitive"] == "reorder"
                    and k["role"] == "op"], "the folded source is a view: no copy"
    reference = compile_model(m, mode="reference")
    shape = [1, channels, *((1,) if CASES[case].get("height_one") else ()),
             CASES[case]["length"]]
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1.2, shape).astype(F32)}
        got = on.run(feeds)["y"]
        assert np.array_equal(got, off.run(feeds)["y"])
        assert step_diff(got, reference.run(feeds)["y"], 0.05).max_steps <= 1


@pytest.mark.parametrize("case", ["four channels", "stride 1", "dilation", "tail read",
                                  "windows without zero taps lose"])
def test_what_the_fold_cannot_take_stays_as_given(case: str) -> None:
    m = {"four channels": lambda: _strided_conv(4000, 8, 4, channels=4),
         "stride 1": lambda: _strided_conv(4000, 8, 1),
         "dilation": lambda: _strided_conv(4000, 3, 2, dilation=2),
         # 3199 samples, k 3, s 2: the last window reads sample 3198, past 2·1599 folds
         "tail read": lambda: _strided_conv(3199, 3, 2),
         # an STFT whose kernel is no multiple of its stride: conv_windows' copy measured
         # faster than a folded kernel with zero taps
         "windows without zero taps lose": lambda: _strided_conv(16000, 256, 80, out=128),
         }[case]()
    compiled = compile_model(m)
    assert NOTE not in _conv(compiled).get("note", "")
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"x": np.random.default_rng(0).normal(0, 1.2, shape).astype(F32)}
    reference = compile_model(m, mode="reference")
    assert step_diff(compiled.run(feeds)["y"], reference.run(feeds)["y"], 0.05).max_steps <= 1


def test_fold_weights_put_tap_a_s_plus_b_of_channel_c_at_channel_b_c() -> None:
    """W'[o, b·C + c, a] = W[o, c, a·s + b − r], zero outside the kernel."""
    fold = Fold(stride=3, kernel=4, lead=2, taps=2, length=10, pad_left=1, pad_right=0)
    w = np.arange(1, 1 + 2 * 2 * 4, dtype=np.int8).reshape(2, 2, 4)
    got = fold.weights(w)
    assert got.shape == (2, 6, 2)
    for o, c, a, b in np.ndindex(2, 2, 2, 3):
        j = a * 3 + b - 2
        assert got[o, b * 2 + c, a] == (w[o, c, j] if 0 <= j < 4 else 0)
    assert fold.zero_taps == 2
