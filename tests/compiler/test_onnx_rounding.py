"""ONNX's rounding, q = saturate(rint(x / s) + zp), in every mode, bit-exact with onnxruntime.

The repro (issue 13): x -> QuantizeLinear(2/255, 128) -> DequantizeLinear on the image
normalisation (p/255 - 0.5)/0.5, p = 0..255 — what onnxruntime's MinMax calibration picks for
it. oneDNN's reorder, rint(x·(1/s) + zp), was one step off on 189 of the 768 values; the
compiled quantize is now a binary division with round and zero point post-ops
(compiler/lower/lower_quant.py). Then a sweep over scales, zero points (odd and even, u8 and
s8) and inputs on and within an ulp of ties, for a quantize and a requantize (Q -> DQ -> Q),
and the conv kernels' dst store (round post-op, then the dst zero point) against the chain's
meaning.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse import compile_model
from qfuse.ir.chain import LEVEL_FORM, ONNX_FORM
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model, run_ort

F32 = np.float32
MODES = ("fused", "unfused", "reference")


def _qdq(scales: list[float], zps: list[int], dtype: int,
         shape: tuple[int, ...]) -> onnx.ModelProto:
    """x -> (Q -> DQ) per (scale, zero point), chained: one quantize, then requantizes."""
    nodes, inits, value = [], [], "x"
    np_type = np.uint8 if dtype == TensorProto.UINT8 else np.int8
    for i, (s, z) in enumerate(zip(scales, zps, strict=True)):
        inits += [init(f"s{i}", np.array(s, F32)), init(f"z{i}", np.array(z, np_type))]
        out = "y" if i == len(scales) - 1 else f"d{i}"
        nodes += [helper.make_node("QuantizeLinear", [value, f"s{i}", f"z{i}"], [f"q{i}"]),
                  helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [out])]
        value = out
    return model(nodes, {"x": (shape, TensorProto.FLOAT)}, ["y"], inits, opset=13)


def _image_inputs(in_float64: bool) -> np.ndarray:
    """(p/255 - 0.5)/0.5 for p = 0..255, three channels: in float32 arithmetic, or in float64
    and then rounded to float32 (the issue's 141 of 768; float32 arithmetic gives 189)."""
    p = np.arange(256, dtype=np.float64 if in_float64 else F32)
    x = (p / 255 - 0.5) / 0.5 if in_float64 else (p / F32(255) - F32(0.5)) / F32(0.5)
    return np.stack([x, x, x]).reshape(1, 3, 16, 16).astype(F32)


def _near_ties(rng: np.random.Generator, scale: F32, lo: int, hi: int, n: int) -> np.ndarray:
    """Exact ties (m + 1/2)·s, their float32 neighbours, and random values, in range ± 3."""
    m = rng.integers(lo - 3, hi + 3, n).astype(F32)
    ties = ((m + F32(0.5)) * scale).astype(F32)
    up = np.nextafter(ties, F32(np.inf))
    down = np.nextafter(ties, F32(-np.inf))
    spread = (rng.uniform(lo - 3, hi + 3, n) * scale).astype(F32)
    return np.concatenate([ties, up, down, spread]).astype(F32)


def _check_every_mode(m: onnx.ModelProto, x: np.ndarray) -> dict[str, int]:
    """Elements where each mode differs from onnxruntime as written (ORT_DISABLE_ALL); for a
    single Q/DQ pair its optimised session agrees (its optimiser rewrites a DQ -> Q requantize
    into other arithmetic, so not there)."""
    feeds = {"x": x}
    plain = run_ort(m, feeds, optimized=False)[0]
    if sum(n.op_type == "QuantizeLinear" for n in m.graph.node) == 1:
        np.testing.assert_array_equal(run_ort(m, feeds)[0], plain)
    return {mode: int(np.sum(compile_model(m, mode=mode).run(feeds)["y"] != plain))
            for mode in MODES}


@pytest.mark.parametrize("in_float64", [False, True])
def test_image_normalisation_repro_is_bit_exact_in_every_mode(in_float64: bool) -> None:
    m = _qdq([float(F32(2 / 255))], [128], TensorProto.UINT8, (1, 3, 16, 16))
    x = _image_inputs(in_float64)
    assert _check_every_mode(m, x) == {mode: 0 for mode in MODES}
    # the level form the reorder computed is not ONNX's on these inputs (the repro)
    s = F32(2 / 255)
    level = np.clip(np.rint(x * (F32(1) / s) + F32(128)), 0, 255)
    onnx_q = np.clip(np.rint(x / s) + F32(128), 0, 255)
    assert int(np.sum(level != onnx_q)) > 100


def test_the_quantize_kernel_states_its_rounding() -> None:
    m = _qdq([float(F32(2 / 255))], [128], TensorProto.UINT8, (1, 3, 16, 16))
    kernels = compile_model(m).inspect()["kernels"]
    quantize = [k for k in kernels if k["primitive"] == "binary"]
    assert len(quantize) == 1 and quantize[0]["rounding"] == ONNX_FORM
    assert quantize[0]["post_ops"] == ["eltwise_round", "eltwise_linear"]


SWEEP = [  # (scales of the chained Q/DQ pairs, zero points, type)
    ([2 / 255], [128], TensorProto.UINT8),
    ([1 / 255], [0], TensorProto.UINT8),
    ([0.0173], [131], TensorProto.UINT8),
    ([0.05], [1], TensorProto.UINT8),
    ([1 / 127.5], [127], TensorProto.UINT8),
    ([0.0078125], [3], TensorProto.UINT8),
    ([0.0371], [-7], TensorProto.INT8),
    ([0.11], [0], TensorProto.INT8),
    ([0.02, 0.03], [128, 120], TensorProto.UINT8),    # a requantize
    ([0.031, 0.0155], [7, 101], TensorProto.UINT8),   # ratio 2: ties after the division
    ([0.02, 0.02 * 1.5], [-3, 5], TensorProto.INT8),
]


@pytest.mark.parametrize("scales,zps,dtype", SWEEP)
def test_sweep_scales_zero_points_near_ties(scales, zps, dtype) -> None:
    rng = np.random.default_rng(len(scales) * 1000 + zps[0] + 300)
    lo, hi = (0, 255) if dtype == TensorProto.UINT8 else (-128, 127)
    s = F32(scales[0])
    x = _near_ties(rng, s, lo - zps[0], hi - zps[0], 1024).reshape(1, 4, 32, 32)
    assert _check_every_mode(_qdq(scales, zps, dtype, x.shape), x) == {m: 0 for m in MODES}


def _conv(zp: int) -> onnx.ModelProto:
    rng = np.random.default_rng(zp)
    w = rng.integers(-60, 61, (8, 4, 3, 3)).astype(np.int8)
    ws = (rng.uniform(0.5, 1.5, 8) * 1e-2).astype(F32)
    b = rng.integers(-500, 500, 8).astype(np.int32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    inits = [init("sx", np.array(0.02, F32)), init("zx", np.array(120, np.uint8)),
             init("sy", np.array(0.05, F32)), init("zy", np.array(zp, np.uint8)),
             init("w", w), init("ws", ws), init("b", b), init("bs", (F32(0.02) * ws).astype(F32))]
    return model(nodes, {"x": ((1, 4, 12, 12), TensorProto.FLOAT)}, ["y"], inits, opset=13)


@pytest.mark.parametrize("zp", [131, 128, 0])
def test_conv_store_rounds_before_the_zero_point(zp: int) -> None:
    """binary_div by s, round post-op, then the dst zero point: the chain's meaning
    round(x/s) + zp (the conv's float32 value itself may differ from the reference's float
    conv by an ulp: at most one step, on near-ties only). Without onnx_divide: ·(1/s)."""
    m = _conv(zp)
    # the int8 store is the subject: the output's dequantize stays its own kernel (with
    # fold_output_dequantize the conv writes f32; test_fold_output_dequantize.py)
    int8_store = ComposerOptions().without("fold_output_dequantize")
    fused = compile_model(m, composer=int8_store)
    conv = [k for k in fused.inspect()["kernels"] if k["primitive"] == "convolution"][-1]
    assert conv["rounding"] == (ONNX_FORM if zp else "round(x/s)")
    assert ("eltwise_round" in conv["post_ops"]) == bool(zp)
    assert "binary_div" in conv["post_ops"]
    mul = compile_model(m, composer=int8_store.without("onnx_divide"))
    mul_conv = [k for k in mul.inspect()["kernels"] if k["primitive"] == "convolution"][-1]
    assert mul_conv["rounding"] == ("round(x·(1/s))+zp" if zp else "round(x·(1/s))")
    old = compile_model(m, composer=int8_store.with_("zero_point_before_round"))
    old_conv = [k for k in old.inspect()["kernels"] if k["primitive"] == "convolution"][-1]
    assert old_conv["rounding"] == (LEVEL_FORM.replace("x/s", "x·(1/s)") if zp else
                                    "round(x·(1/s))")
    reference = compile_model(m, mode="reference")
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = (rng.standard_normal((1, 4, 12, 12)) * 2).astype(F32)
        want = reference.run({"x": x})["y"]
        for got in (fused.run({"x": x})["y"], compile_model(m, mode="unfused").run({"x": x})["y"]):
            steps = np.abs(got - want) / F32(0.05)
            assert steps.max() <= 1.0001 and np.mean(steps < 0.5) >= 0.995
