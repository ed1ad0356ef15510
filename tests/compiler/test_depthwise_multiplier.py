"""A depthwise convolution with a channel multiplier (one input and M > 1 output channels a
group: FastViT's downsampling, TensorFlow's ``depth_multiplier``), which oneDNN runs on
ref:any in int8 and on a GEMM in f32, runs as a depthwise convolution over its source with
each channel repeated M times: jit kernels, the same integer accumulators."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import init, model, qdq_pair

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.compiler.lower import lower_compute

F = np.float32
NOTE = "depthwise convolution over the source's channels repeated"


def _multiplier(channels: int, reps: int, kernel: int, stride: int, *, zero: int = 128,
                spatial: int = 2):
    """x → QDQ → Conv(group = channels, channels·reps outputs) → QDQ, u8 (zero 128) or s8
    (zero 0) activations; ``spatial``: 1 for a Conv1d."""
    rng = np.random.default_rng(channels + reps)
    xtype = np.uint8 if zero else np.int8
    side = (kernel,) * spatial
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], name="mconv", group=channels,
                              pads=[kernel // 2] * (2 * spatial), strides=[stride] * spatial),
             *qdq_pair("c", "c", "y")]
    cout = channels * reps
    inits = [init("xs", np.array(0.02, F)), init("xz", np.array(zero, xtype)),
             init("w", rng.integers(-127, 128, (cout, 1, *side)).astype(np.int8)),
             init("ws", rng.uniform(0.005, 0.01, cout).astype(F)),
             init("wz", np.zeros(cout, np.int8)),
             init("b", rng.normal(0, 0.1, cout).astype(F)),
             init("cs", np.array(0.05, F)), init("cz", np.array(zero and 120, xtype))]
    shape = (1, channels, *(13,) * spatial)
    return model(nodes, {"x": (shape, TensorProto.FLOAT)}, ["y"], inits, opset=13)


def _convs(compiled) -> list[dict]:
    return [k for k in compiled.inspect()["kernels"] if k["node"] == "mconv"]


def _grouped(m, mode: str, monkeypatch: pytest.MonkeyPatch):
    """``m`` compiled with the grouped convolution as oneDNN has it (the form declined)."""
    with monkeypatch.context() as patch:
        patch.setattr(lower_compute, "_depthwise_if_faster", lambda *a: False)
        return compile_model(m, mode=mode)


@pytest.mark.parametrize(("channels", "reps", "kernel", "stride", "zero", "spatial"), [
    (48, 2, 7, 2, 128, 2), (16, 3, 3, 1, 128, 2), (24, 2, 1, 1, 0, 2), (32, 4, 5, 2, 128, 1)])
def test_a_channel_multiplier_runs_depthwise_on_jit_and_bit_exact(
        channels: int, reps: int, kernel: int, stride: int, zero: int, spatial: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Taken on every ISA: faster than the grouped one on ref:any (AVX2) and on brgconv
    (AVX-512 VNNI)."""
    m = _multiplier(channels, reps, kernel, stride, zero=zero, spatial=spatial)
    grouped = {mode: _grouped(m, mode, monkeypatch) for mode in ("fused", "unfused")}
    for mode in ("fused", "unfused"):
        assert not any(NOTE in k.get("note", "") for k in _convs(grouped[mode]))
    depthwise = {mode: compile_model(m, mode=mode) for mode in ("fused", "unfused")}
    convs = _convs(depthwise["fused"])
    assert convs and all(not k["impl"].startswith("ref") for k in convs), convs
    assert any(NOTE in k.get("note", "") for k in convs), convs
    repeats = [k for k in depthwise["fused"].inspect()["kernels"]
               if "repeated" in k.get("note", "") and k["node"] != "mconv"]
    assert len(repeats) == 1 and repeats[0]["impl"].startswith("jit"), repeats
    feeds = random_inputs(depthwise["fused"])
    got = depthwise["fused"].run(feeds)["y"]
    want = compile_model(m, mode="reference").run(feeds)["y"]
    assert np.abs(got - want).max() <= 0.05 + 1e-6  # ≤ 1 step, as any fused conv
    for mode in ("fused", "unfused"):  # the grouped convolution as oneDNN has it: the same
        np.testing.assert_array_equal(depthwise[mode].run(feeds)["y"],
                                      grouped[mode].run(feeds)["y"])


def test_a_float_channel_multiplier_runs_depthwise() -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.2, (64, 1, 3, 3)).astype(F)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="mconv", group=32,
                                pads=[1, 1, 1, 1])],
              {"x": ((1, 32, 14, 14), TensorProto.FLOAT)}, ["y"], [init("w", w)], opset=13)
    compiled = compile_model(m)
    convs = _convs(compiled)
    assert convs and any(NOTE in k.get("note", "") for k in convs), convs
    assert not any("gemm" in k["impl"] or k["impl"].startswith("ref") for k in convs), convs
    feeds = random_inputs(compiled)
    want = compile_model(m, mode="reference").run(feeds)["y"]
    np.testing.assert_allclose(compiled.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)


def test_the_repeated_source_is_shared_by_its_readers() -> None:
    """Two multiplier convolutions of one source (FastViT's 7x7 and 3x3 branches) read one
    repeated copy."""
    rng = np.random.default_rng(2)
    nodes = [*qdq_pair("x", "x", "xd")]
    inits = [init("xs", np.array(0.02, F)), init("xz", np.array(128, np.uint8)),
             init("cs", np.array(0.05, F)), init("cz", np.array(120, np.uint8))]
    for i, k in enumerate((7, 3)):
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}"], [f"wd{i}"], axis=0),
                  helper.make_node("Conv", ["xd", f"wd{i}"], [f"c{i}"], name=f"mconv{i}",
                                   group=16, pads=[k // 2] * 4, strides=[2, 2])]
        inits += [init(f"w{i}", rng.integers(-127, 128, (32, 1, k, k)).astype(np.int8)),
                  init(f"ws{i}", rng.uniform(0.005, 0.01, 32).astype(F))]
    nodes += [helper.make_node("Add", ["c0", "c1"], ["s"]), *qdq_pair("c", "s", "y")]
    m = model(nodes, {"x": ((1, 16, 20, 20), TensorProto.FLOAT)}, ["y"], inits, opset=13)
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    assert sum("repeated 2 times" in k.get("note", "") and not (k["node"] or "").startswith("mconv")
               for k in kernels) == 1, kernels
    feeds = random_inputs(compiled)
    want = compile_model(m, mode="reference").run(feeds)["y"]
    assert np.abs(compiled.run(feeds)["y"] - want).max() <= 0.05 + 1e-6
