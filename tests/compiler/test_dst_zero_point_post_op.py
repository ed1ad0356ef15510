"""An int8 depthwise convolution whose output keeps a zero point (quantize_static's activations
before a Swish or HardSwish, or with no activation) runs on oneDNN's brdgmm kernel with the
store's scale and zero point as post-ops (lower_compute._store_in_post_ops): brdgmm takes no
zero point, and jit_int8 with the attribute ran MobileOne-S0 QDQ's depthwise layers. The
same values: bit-identical to the attribute form."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.compiler.lower import lower_compute
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32


def _depthwise(channels: int, kernel: int, src_zero: int, dst_zero: int):
    rng = np.random.default_rng(channels + kernel)
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], name="dw", group=channels,
                              pads=[kernel // 2] * 4),
             *qdq_pair("y", "c", "y")]
    inits = [init("xs", F32(0.02)), init("xz", np.uint8(src_zero)),
             init("w", rng.integers(-127, 128, (channels, 1, kernel, kernel)).astype(np.int8)),
             init("ws", rng.uniform(0.002, 0.01, channels).astype(F32)),
             init("b", rng.normal(0, 0.3, channels).astype(F32)),
             init("ys", F32(0.03)), init("yz", np.uint8(dst_zero))]
    return model(nodes, {"x": ((1, channels, 20, 20), TensorProto.FLOAT)}, ["y"], inits,
                 opset=13)


def _conv(compiled) -> dict:
    [kernel] = [k for k in compiled.inspect()["kernels"] if k["node"] == "dw"]
    return kernel


@pytest.mark.parametrize(("channels", "kernel", "src_zero", "dst_zero"), [
    (48, 3, 0, 110), (24, 7, 0, 37), (64, 5, 0, 0), (32, 3, 128, 90)])
def test_the_store_as_post_ops_is_bit_exact(channels: int, kernel: int, src_zero: int,
                                            dst_zero: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    m = _depthwise(channels, kernel, src_zero, dst_zero)
    chosen = compile_model(m)
    with monkeypatch.context() as patch:
        patch.setattr(lower_compute, "_store_in_post_ops", lambda composed: composed)
        attribute = compile_model(m)
    conv, plain = _conv(chosen), _conv(attribute)
    moved = dst_zero != 0 and src_zero == 0 and plain["impl"].startswith("jit_int8") and (
        "avx512_core_vnni" in plain["impl"])
    if moved:  # brdgmm exists on this ISA (AVX-512 VNNI): taken, the zero point a post-op
        assert conv["impl"].startswith("brdgmm"), conv
        assert "dst zero point as a post-op" in conv.get("note", "")
        assert "DST" not in conv["zero_points_masks"] and "DST" in plain["zero_points_masks"]
        assert conv["rounding"] == plain["rounding"]
    else:
        assert conv["impl"] == plain["impl"]
    for seed in range(3):
        feeds = random_inputs(chosen, seed=seed)
        np.testing.assert_array_equal(chosen.run(feeds)["y"], attribute.run(feeds)["y"])
