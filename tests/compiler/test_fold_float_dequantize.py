"""A DequantizeLinear whose readers all compute in float32 written by the kernel before it
(passes/fuse_post_ops.py, composer option ``fold_float_dequantize``): quantize_static's SiLU
``conv → Q → DQ → x; x·Q(sigmoid(x))`` and HardSwish ``x·Q(relu6(x + 3))/6`` read x twice, in
float. The convolution then writes f32 ``(q - zp)·s`` itself (one kernel less, no u8 tensor
dequantized by a reorder): bit-exact against the plan with the standalone dequantize. Where a
reader could take the 8-bit source instead (a residual Add of two run-time tensors, a
convolution), the dequantize stays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model, qdq_pair

OFF = ComposerOptions().without("fold_float_dequantize")


def _conv_gate(gate: str) -> onnx.ModelProto:
    """x → Q/DQ → Conv (weights up to ±120: split on CPUs without VNNI) → Q/DQ → c, then a
    gate reading c twice, → Q/DQ → y. ``squeeze_excitation``: c read by a float
    GlobalAveragePool, the Mul by its gate and the Add. ``self_residual``: c + sigmoid(c), the Add's other
    operand computed from c (a squeeze-excitation's x + x·gate); ``residual``: besides the
    Sigmoid, c is read by an Add of c and a second input r (a run-time tensor not computed
    from c), not a gate."""
    rng = np.random.default_rng(5)
    w = rng.integers(-120, 121, size=(16, 8, 3, 3)).astype(np.int8)
    inits = [init("xs", np.float32(0.02)), init("xz", np.uint8(128)), init("w", w),
             init("ws", rng.uniform(0.001, 0.004, 16).astype(np.float32)),
             init("wz", np.zeros(16, np.int8)),
             init("b", rng.normal(0, 0.3, 16).astype(np.float32)),
             init("cs", np.float32(0.0371)), init("cz", np.uint8(97)),
             init("gs", np.float32(1 / 255)), init("gz", np.uint8(0)),
             init("ys", np.float32(0.0213)), init("yz", np.uint8(11)),
             init("three", np.float32(3)), init("zero", np.float32(0)), init("six", np.float32(6))]
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["conv"], pads=[1, 1, 1, 1]),
             *qdq_pair("c", "conv", "c")]
    if gate == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["sig"]), *qdq_pair("g", "sig", "g"),
                  helper.make_node("Mul", ["c", "g"], ["m"])]
    elif gate == "hardswish":
        nodes += [helper.make_node("Add", ["c", "three"], ["a"]),
                  helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
                  *qdq_pair("g", "r", "g"), helper.make_node("Mul", ["c", "g"], ["m6"]),
                  helper.make_node("Div", ["m6", "six"], ["m"])]
    elif gate == "squeeze_excitation":  # PP-OCRv4 det's RSE: c·sigmoid(mean(c)) + c
        nodes += [helper.make_node("GlobalAveragePool", ["c"], ["p"]),
                  helper.make_node("Sigmoid", ["p"], ["sig"]),
                  helper.make_node("Mul", ["c", "sig"], ["cg"]),
                  helper.make_node("Add", ["cg", "c"], ["m"])]
    elif gate == "self_residual":
        nodes += [helper.make_node("Sigmoid", ["c"], ["sig"]),
                  helper.make_node("Add", ["c", "sig"], ["m"])]
    else:  # residual
        nodes += [helper.make_node("Sigmoid", ["c"], ["sig"]),
                  helper.make_node("Add", ["c", "r"], ["cr"]),
                  helper.make_node("Add", ["cr", "sig"], ["m"])]
    nodes += qdq_pair("y", "m", "y")
    inputs = {"x": ([1, 8, 20, 20], TensorProto.FLOAT)}
    if gate == "residual":
        inputs["r"] = ([1, 16, 20, 20], TensorProto.FLOAT)
    return model(nodes, inputs, ["y"], inits)


def _dequantize_kernels(compiled: object) -> list[str]:
    return [k.name for k in compiled.plan.kernels  # type: ignore[attr-defined]
            if k.kind == "reorder" and any(a.startswith("DequantizeLinear")
                                           for a in k.info.absorbed)]


@pytest.mark.parametrize("gate", ["silu", "hardswish", "self_residual", "squeeze_excitation"])
def test_the_convolution_writes_the_dequantized_values_bit_exact(gate: str) -> None:
    m = _conv_gate(gate)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert len(on.plan.kernels) == len(off.plan.kernels) - 1
    assert _dequantize_kernels(off) and not _dequantize_kernels(on)
    conv = next(k for k in on.plan.kernels if k.kind == "convolution" and not
                k.name.endswith(":lo"))
    assert on.plan.slots[conv.writes[0]].md.dtype.name == "f32"
    for seed in range(4):
        feeds = random_inputs(on, seed=seed)
        feeds["x"] *= 2  # saturate the conv's quantize at both ends too
        want, got = off.run(feeds)["y"], on.run(feeds)["y"]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_reader_that_is_not_a_float_elementwise_op_keeps_the_dequantize() -> None:
    """c + r, r a run-time tensor not computed from c: another node's chain could sum c's
    8-bit source as a residual; the dequantize stays a kernel of its own."""
    on = compile_model(_conv_gate("residual"))
    assert _dequantize_kernels(on)


def _se_block() -> onnx.ModelProto:
    """quantize_static's squeeze-excitation: c → GlobalAveragePool → Q/DQ → 1x1 Conv →
    HardSigmoid → Q/DQ → gate [1, 16, 1, 1]; Mul(c, gate) → Q/DQ → y."""
    rng = np.random.default_rng(9)
    inits = [init("xs", np.float32(0.02)), init("xz", np.uint8(128)),
             init("w", rng.integers(-120, 121, size=(16, 8, 3, 3)).astype(np.int8)),
             init("w2", rng.integers(-120, 121, size=(16, 16, 1, 1)).astype(np.int8)),
             init("ws", np.float32(0.003)), init("wz", np.int8(0)),
             init("cs", np.float32(0.0371)), init("cz", np.uint8(0)),
             init("ps", np.float32(0.011)), init("pz", np.uint8(0)),
             init("gs", np.float32(1 / 255)), init("gz", np.uint8(0)),
             init("ys", np.float32(0.0213)), init("yz", np.uint8(0))]
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("DequantizeLinear", ["w2", "ws", "wz"], ["w2d"]),
             helper.make_node("Conv", ["xd", "wd"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["r"]), *qdq_pair("c", "r", "c"),
             helper.make_node("GlobalAveragePool", ["c"], ["pool"]),
             *qdq_pair("p", "pool", "p"),
             helper.make_node("Conv", ["p", "w2d"], ["fc"]),
             helper.make_node("HardSigmoid", ["fc"], ["hs"], alpha=1 / 6),
             *qdq_pair("g", "hs", "g"),
             helper.make_node("Mul", ["c", "g"], ["m"]), *qdq_pair("y", "m", "y")]
    return model(nodes, {"x": ([1, 8, 20, 20], TensorProto.FLOAT)}, ["y"], inits)


def test_a_squeeze_excitation_gate_is_written_in_float32_by_its_convolution() -> None:
    """The gate's DequantizeLinear, read only by the Mul that broadcasts it over c, goes into
    the 1x1 convolution computing the gate (an f32 [1, C, 1, 1] dst): one kernel less per
    squeeze-excitation block (EfficientNet-V2-S QDQ 368 → 338 kernels), bit-exact."""
    m = _se_block()
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert len(on.plan.kernels) == len(off.plan.kernels) - 1
    assert len(_dequantize_kernels(on)) == len(_dequantize_kernels(off)) - 1
    kernels = on.inspect()["kernels"]
    mul = next(i for i, k in enumerate(kernels) if k["op"] == "Mul")
    assert kernels[mul - 1]["op"] == "Conv" and kernels[mul - 1]["dst_dtype"] == "f32"
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        assert np.array_equal(on.run(feeds)["y"], off.run(feeds)["y"])
