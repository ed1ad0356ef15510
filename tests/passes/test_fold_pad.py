"""fold_pad: a constant Pad in front of a convolution becomes its padding (float32, and int8
when the padded integer is the dequantize's zero point). The int8 rewrite is exact (the same
integer sums): bit-identical outputs with the pass off; the float32 one is the same sum of
products, compared within float32 rounding."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.compiler.lower import Options, lower
from qfuse.compiler.modes import run_passes
from qfuse.compiler.onnx_import import import_model
from qfuse.passes.base import PassContext
from qfuse.runtime.executor import Executor
from tests.compiler.onnx_builders import init, model

F32 = np.float32
# (begin, end) per spatial axis: TensorFlow's "SAME" for stride 2 pads 0 before, 1 after
SAME_STRIDE2 = [0, 0, 0, 0, 0, 0, 1, 1]


def _pads(pads: list[int]) -> onnx.TensorProto:
    return init("pads", np.array(pads, np.int64))


def _float_pad_conv(pads: list[int], mode: str = "constant", value: float = 0.0,
                    group: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    c = 8
    inits = [_pads(pads), init("v", F32(value)),
             init("w", rng.normal(0, 0.3, (c, c // group, 3, 3)).astype(F32))]
    pad_inputs = ["x", "pads", "v"] if mode == "constant" else ["x", "pads"]
    nodes = [helper.make_node("Pad", pad_inputs, ["p"], mode=mode),
             helper.make_node("Conv", ["p", "w"], ["y"], strides=[2, 2], group=group)]
    return model(nodes, {"x": ([1, c, 9, 9], TensorProto.FLOAT)}, ["y"], inits)


def _nncf_depthwise(zero_point: int, pad_value: float) -> onnx.ModelProto:
    """NNCF's depthwise input: a per-channel dequantize (one scale per channel) → Pad → Conv
    with per-channel int8 weights → Q/DQ: as ``Conv2dStaticSamePadding`` quantized by NNCF."""
    rng = np.random.default_rng(2)
    c = 16
    inits = [_pads([0, 0, 1, 1, 0, 0, 2, 2]), init("v", F32(pad_value)),
             init("xs", rng.uniform(0.01, 0.03, c).astype(F32)),
             init("xz", np.full(c, zero_point, np.uint8)),
             init("w", rng.integers(-127, 128, (c, 1, 3, 3)).astype(np.int8)),
             init("ws", rng.uniform(0.005, 0.01, c).astype(F32)), init("wz", np.zeros(c, np.int8)),
             init("b", rng.normal(0, 0.2, c).astype(F32)),
             init("ys", F32(0.05)), init("yz", np.uint8(128))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], axis=1),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], axis=1),
             helper.make_node("Pad", ["xd", "pads", "v"], ["p"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["p", "wd", "b"], ["c"], group=c),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    return model(nodes, {"x": ([1, c, 12, 12], TensorProto.FLOAT)}, ["y"], inits)


def _without_pass(m: onnx.ModelProto) -> Executor:
    graph = import_model(m)
    run_passes(graph, "fused", PassContext(disabled_passes=frozenset({"fold_pad"})))
    return Executor(lower(graph, Options(mode="fused")))


def _ops(compiled: object) -> list[str]:
    return [k["op"] for k in compiled.inspect()["kernels"]]  # type: ignore[attr-defined]


@pytest.mark.parametrize("group", [1, 8])
def test_a_float_zero_pad_becomes_the_convolution_padding(group: int) -> None:
    m = _float_pad_conv(SAME_STRIDE2, group=group)
    on = compile_model(m)
    assert "Pad" not in _ops(on) and not any(k["impl"] == "numpy"
                                               for k in on.inspect()["kernels"])
    assert on.inspect()["passes"]["fold_pad"] == 1
    off = _without_pass(m)
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1, (1, 8, 9, 9)).astype(F32)}
        np.testing.assert_allclose(on.run(feeds)["y"], off.run(feeds)["y"], rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize(("pads", "mode", "value", "reason"), [
    ([0, 0, 1, 1, 0, 0, 1, 1], "reflect", 0.0, "mode 'reflect'"),
    ([0, 0, 1, 1, 0, 0, 1, 1], "constant", 1.0, "pad value 1.0"),
    ([0, 1, 0, 0, 0, 0, 0, 0], "constant", 0.0, "batch or channel"),
    ([0, 0, -1, 0, 0, 0, 1, 1], "constant", 0.0, "crops"),
], ids=["reflect", "value", "channel", "crop"])
def test_a_pad_the_convolution_cannot_take_stays_with_the_reason(
        pads: list[int], mode: str, value: float, reason: str) -> None:
    m = _float_pad_conv(pads, mode, value)
    if "channel" in reason:  # the conv then reads 9 channels
        m.graph.initializer[2].CopyFrom(init("w", np.ones((8, 9, 3, 3), F32)))
    on = compile_model(m)
    assert "Pad" in _ops(on)
    assert on.inspect()["passes"]["fold_pad"] == 0
    graph = import_model(m)
    result, = [r for r in run_passes(graph, "fused") if r.name == "fold_pad"]
    assert [reason in d.reason for d in result.declined] == [True], result.declined


@pytest.mark.parametrize("zero_point", [0, 128])
def test_nncf_padded_depthwise_input_runs_int8_bit_identical(zero_point: int) -> None:
    """The per-channel dequantize moves after the Pad (its 0 is one zero point), the Pad
    folds into the depthwise convolution, which then runs int8: no Pad kernel, no float32
    convolution; bit-identical to the plan without the pass (there the Pad runs on the
    integers in numpy, then the same int8 convolution without padding)."""
    m = _nncf_depthwise(zero_point, 0.0)
    on, off = compile_model(m), _without_pass(m)
    kernels = on.inspect()["kernels"]
    assert "Pad" not in _ops(on), kernels
    conv, = [k for k in kernels if k["primitive"] == "convolution"]
    assert conv["src_dtype"] == "u8", conv
    for seed in range(4):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1.5, (1, 16, 12, 12)).astype(F32)}
        got = on.run(feeds)["y"]
        assert np.array_equal(got.view(np.uint32), off.run(feeds)["y"].view(np.uint32))


def test_a_pad_value_that_is_not_zero_stays() -> None:
    on = compile_model(_nncf_depthwise(0, 0.5))
    assert "Pad" in _ops(on)


def _requantized_causal_pad(same: bool) -> onnx.ModelProto:
    """quantize_static's causal Conv1d (a TCN's ``F.pad(x, (2·d, 0))`` before a dilated
    convolution): DQ → Pad → Q → DQ → Conv, the Pad's output quantized again with its input's
    parameters (``same``) or others."""
    rng = np.random.default_rng(3)
    c = 8
    ps, pz = (F32(0.02), np.uint8(120)) if same else (F32(0.03), np.uint8(120))
    inits = [init("pads", np.array([0, 0, 4, 0, 0, 0], np.int64)), init("xs", F32(0.02)),
             init("xz", np.uint8(120)), init("ps", ps), init("pz", pz),
             init("w", rng.integers(-127, 128, (c, c, 3)).astype(np.int8)),
             init("ws", rng.uniform(0.005, 0.01, c).astype(F32)), init("wz", np.zeros(c, np.int8)),
             init("ys", F32(0.05)), init("yz", np.uint8(128))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("Pad", ["xd", "pads"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "ps", "pz"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "ps", "pz"], ["pd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["pd", "wd"], ["c"], dilations=[2]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    return model(nodes, {"x": ([1, c, 40], TensorProto.FLOAT)}, ["y"], inits)


@pytest.mark.parametrize("same", [True, False], ids=["identity requantize", "requantize"])
def test_a_pad_folds_through_a_requantize_that_is_the_identity(same: bool) -> None:
    """The Pad's integers quantized again with the same parameters (the identity on every
    integer, removed only later by eliminate_requantize): the Pad folds into the convolution
    through it, no Pad kernel, bit-identical to the plan without the pass. With other
    parameters the requantize is real and the Pad stays."""
    m = _requantized_causal_pad(same)
    on, off = compile_model(m), _without_pass(m)
    assert ("Pad" in _ops(on)) is not same, on.inspect()["kernels"]
    assert on.inspect()["passes"]["fold_pad"] == int(same)
    for seed in range(4):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1.5, (1, 8, 40)).astype(F32)}
        got = on.run(feeds)["y"]
        assert np.array_equal(got.view(np.uint32), off.run(feeds)["y"].view(np.uint32))
