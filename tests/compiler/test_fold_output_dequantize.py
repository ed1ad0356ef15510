"""A graph output's DequantizeLinear written by the kernel before it (passes/fuse_post_ops.py,
composer option ``fold_output_dequantize``): bit-exact against the plan with the standalone
dequantize, including zero points where a folded linear(s, -zp·s) would not be (83 of the 256
values of s = 0.0123, zp = 37 differ between f32(q - zp)·s and fma(s, q, f32(-zp·s)))."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model

OFF = ComposerOptions().without("fold_output_dequantize")


def _conv_output(scale: float, zp: int, activation: str | None,
                 channels: int = 1) -> onnx.ModelProto:
    """x → Q → DQ → Conv (int8 weights) [→ activation] → Q → DQ → graph output. One output
    channel (a detector's map): the kernel's layout is then the row-major one the user reads."""
    rng = np.random.default_rng(11)
    w = rng.integers(-50, 50, size=(channels, 3, 3, 3)).astype(np.int8)
    inits = [init("xs", np.float32(0.02)), init("xz", np.uint8(128)), init("w", w),
             init("ws", np.float32(0.01)), init("wz", np.int8(0)),
             init("b", rng.normal(0, 0.3, channels).astype(np.float32)),
             init("ys", np.float32(scale)), init("yz", np.uint8(zp))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1])]
    last = "c"
    if activation:
        nodes.append(helper.make_node(activation, ["c"], ["a"]))
        last = "a"
    nodes += [helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    return model(nodes, {"x": ([1, 3, 24, 24], TensorProto.FLOAT)}, ["y"], inits)


@pytest.mark.parametrize("scale,zp,activation", [(0.0123, 37, None), (0.0123, 0, "Relu"),
                                                 (0.0041, 10, "Sigmoid")])
def test_output_dequantize_in_the_kernel_is_bit_exact(scale: float, zp: int,
                                                      activation: str | None) -> None:
    m = _conv_output(scale, zp, activation)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert len(on.plan.kernels) == len(off.plan.kernels) - 1
    last = on.plan.kernels[-1]
    assert on.plan.slots[last.writes[0]].md.dtype.name == "f32"
    assert not any(k.kind == "reorder" and "DequantizeLinear" in k.name for k in on.plan.kernels)
    assert not [d for d in on.inspect()["not_fused"] if d["node"].startswith("y")]
    seen = set()
    for seed in range(6):
        feeds = random_inputs(on, seed=seed)
        feeds["x"] *= 3  # saturate at both ends too
        want, got = off.run(feeds)["y"], on.run(feeds)["y"]
        assert got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bits, signs of 0
        seen.update(np.unique(got).tolist())
    assert len(seen) > 150  # many values of q - zp exercised


def test_channels_last_output_is_exact_and_costs_the_layout_reorder() -> None:
    """Six channels: the int8 convolution writes channels-last, so a reorder to the user's
    row-major layout takes the standalone dequantize's place (same kernel count)."""
    m = _conv_output(0.0123, 37, None, channels=6)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert len(on.plan.kernels) == len(off.plan.kernels)
    assert on.plan.kernels[-1].info.role == "io"
    feeds = random_inputs(on, seed=3)
    assert np.array_equal(on.run(feeds)["y"].view(np.uint32), off.run(feeds)["y"].view(np.uint32))


def test_switched_off_it_stays_standalone_and_says_why() -> None:
    off = compile_model(_conv_output(0.0123, 37, None), composer=OFF)
    reasons = {d["node"]: d["reason"] for d in off.inspect()["not_fused"]}
    assert "graph output" in reasons["y_DequantizeLinear"] if "y_DequantizeLinear" in reasons \
        else any("graph output" in r for r in reasons.values())
