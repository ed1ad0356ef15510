"""Quantization types beyond 8 bits and onnxruntime's contrib Q/DQ ops
(compiler/onnx_import/convert_quant.py: SIXTEEN_BIT, WIDENED_4BIT; context.py: CONTRIB_QDQ).

- quantize_static's QInt16 / QUInt16 activations: a 16-bit QuantizeLinear read only by its
  DequantizeLinear is the float fake quantization ``(saturate(rint(x/s) + zp) − zp)·s``, fused
  into the float kernels around it, bit-exact with onnxruntime; one with another reader stays
  an onnxruntime island.
- QInt4 / QUInt4 weights: read as 8-bit integers, so the convolution runs int8, bit-identical
  to the same model with the weights stored as INT8.
- com.microsoft QuantizeLinear / DequantizeLinear (what quantize_static writes for those types
  before opset 21) are the ONNX ops: the same plan and outputs as the default-domain model.
- 8-bit pairs whose scale is above MAX_SCALE (quantize_static's FLT_MAX/255 for masked
  attention scores) are the same float fake quantization, in the QDQ and QOperator forms.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from onnx_builders import init, model, run_ort

MS = "com.microsoft"
NP = {TensorProto.INT16: np.int16, TensorProto.UINT16: np.uint16}


def _impls(compiled) -> list[str]:
    return [k["impl"] for k in compiled.inspect()["kernels"]]


def _elementwise_16bit(qtype: int, zp: int, scale: float, domain: str = "",
                       extra_reader: bool = False) -> onnx.ModelProto:
    """x → Q16 → DQ16 → Relu → Q16 → DQ16 → y (and DQ16 → Sigmoid → z)."""
    np_type = NP[qtype]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], domain=domain),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], domain=domain),
        helper.make_node("Relu", ["xd"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s2", "z"], ["rq"], domain=domain),
        helper.make_node("DequantizeLinear", ["rq", "s2", "z"], ["y"], domain=domain),
    ]
    outputs = ["y"]
    if extra_reader:  # the integers read by something else than a DequantizeLinear
        nodes.append(helper.make_node("Cast", ["xq"], ["c"], to=TensorProto.FLOAT))
        outputs.append("c")
    inits = [init("s", scale, np.float32), init("s2", scale * 0.5, np.float32),
             init("z", zp, np_type)]
    return model(nodes, {"x": ([2, 8, 5, 6], TensorProto.FLOAT)}, outputs, inits, opset=21,
                 extra_opsets={MS: 1} if domain else None)


def _inputs(scale: float) -> np.ndarray:
    """Values on exact ties of the first quantizer, between them, and far outside its range."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32) * 60000 * scale
    ties = (np.arange(x.size // 3) - x.size // 6 + np.float32(0.5)) * np.float32(scale)
    x.ravel()[: ties.size] = ties
    x.ravel()[-4:] = [1e9, -1e9, 0.0, -0.0]
    return x


@pytest.mark.parametrize("qtype,zp", [(TensorProto.INT16, 0), (TensorProto.INT16, -1234),
                                      (TensorProto.UINT16, 32768), (TensorProto.UINT16, 7)])
@pytest.mark.parametrize("domain", ["", MS])
def test_16bit_pairs_are_fused_float_kernels_bit_exact(qtype: int, zp: int, domain: str) -> None:
    scale = 0.0123
    m = _elementwise_16bit(qtype, zp, scale, domain)
    x = _inputs(scale)
    want = run_ort(m, {"x": x}, optimized=False)[0]
    compiled = compile_model(m)
    got = compiled.run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)
    impls = _impls(compiled)
    assert "numpy" not in impls and not any(i.startswith("ref") for i in impls), impls
    # the input's pair; the Relu with the second pair as its post-ops
    assert len(impls) == 2, impls


def test_16bit_quantize_with_another_reader_stays_an_island() -> None:
    scale = 0.0123
    m = _elementwise_16bit(TensorProto.INT16, 5, scale, extra_reader=True)
    x = _inputs(scale)
    want = run_ort(m, {"x": x}, optimized=False)
    compiled = compile_model(m)
    got = compiled.run({"x": x})
    np.testing.assert_array_equal(got["y"], want[0])
    np.testing.assert_array_equal(got["c"], want[1])
    notes = [k.get("note") or "" for k in compiled.inspect()["kernels"]]
    assert any("16-bit quantization (INT16) is read by" in n for n in notes), notes


def _conv(weight_type: int, domain: str = "", act16: bool = False) -> onnx.ModelProto:
    """Q → DQ → Conv(DQ(w)) → Q → DQ, activations u8 (or int16), weights of ``weight_type``."""
    rng = np.random.default_rng(1)
    w = rng.integers(-8, 8, (6, 4, 3, 3)) if weight_type in (TensorProto.INT4,
                                                            TensorProto.INT8) \
        else rng.integers(0, 16, (6, 4, 3, 3))
    w_tensor = helper.make_tensor("w", weight_type, w.shape, w.ravel().tolist())
    w_zp_values = [0] * 6 if weight_type in (TensorProto.INT4, TensorProto.INT8) else [8] * 6
    w_zp = helper.make_tensor("wz", weight_type, [6], w_zp_values)
    a_np = np.int16 if act16 else np.uint8
    a_zp = 0 if act16 else 128
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], domain=domain),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], domain=domain),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0, domain=domain),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["yq"], domain=domain),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], domain=domain),
    ]
    inits = [init("xs", 0.02 if not act16 else 0.0001, np.float32), init("xz", a_zp, a_np),
             w_tensor, init("ws", np.linspace(0.01, 0.03, 6), np.float32), w_zp,
             init("b", np.linspace(-0.5, 0.5, 6), np.float32),
             init("ys", 0.05 if not act16 else 0.0005, np.float32), init("yz", a_zp, a_np)]
    return model(nodes, {"x": ([1, 4, 10, 12], TensorProto.FLOAT)}, ["y"], inits, opset=21,
                 extra_opsets={MS: 1} if domain else None)


@pytest.mark.parametrize("four,eight", [(TensorProto.INT4, TensorProto.INT8),
                                        (TensorProto.UINT4, TensorProto.UINT8)])
@pytest.mark.parametrize("domain", ["", MS])
def test_4bit_weights_run_as_int8(four: int, eight: int, domain: str) -> None:
    x = np.random.default_rng(2).standard_normal((1, 4, 10, 12)).astype(np.float32)
    as4 = compile_model(_conv(four, domain))
    as8 = compile_model(_conv(eight))
    np.testing.assert_array_equal(as4.run({"x": x})["y"], as8.run({"x": x})["y"])
    impls = _impls(as4)
    assert impls == _impls(as8), impls
    assert not any(i == "numpy" or i.startswith("ref") for i in impls), impls
    kinds = [k["primitive"] for k in as4.inspect()["kernels"]]
    assert "convolution" in kinds


def test_contrib_qdq_is_the_onnx_op() -> None:
    x = np.random.default_rng(3).standard_normal((1, 4, 10, 12)).astype(np.float32)
    contrib = compile_model(_conv(TensorProto.INT8, MS))
    standard = compile_model(_conv(TensorProto.INT8))
    np.testing.assert_array_equal(contrib.run({"x": x})["y"], standard.run({"x": x})["y"])
    assert _impls(contrib) == _impls(standard)


def test_16bit_activations_conv_runs_in_float_without_numpy() -> None:
    """A16W8: the convolution computes in float32 (no 16-bit integer kernels) with the
    activations' fake quantization as its post-ops; against onnxruntime's float convolution
    (another summation order) within one 16-bit step of the output."""
    m = _conv(TensorProto.INT8, act16=True)
    x = np.random.default_rng(4).standard_normal((1, 4, 10, 12)).astype(np.float32)
    compiled = compile_model(m)
    got = compiled.run({"x": x})["y"]
    want = run_ort(m, {"x": x}, optimized=False)[0]
    assert np.max(np.abs(got - want)) <= 0.0005 * 1.0001  # ys: one output step
    assert np.mean(got == want) > 0.99
    impls = _impls(compiled)
    assert "numpy" not in impls and not any(i.startswith("ref") for i in impls), impls
    conv = next(k for k in compiled.inspect()["kernels"] if k["primitive"] == "convolution")
    assert {"QuantizeLinear_4", "DequantizeLinear_5"} <= set(conv["absorbed"])


@pytest.mark.parametrize("same", [True, False])
def test_repeated_16bit_pair_after_a_reshape_is_dropped(same: bool) -> None:
    """quantize_static quantizes a Gemm's output and again the Reshape after it with the same
    parameters: the second pair is the identity on the first's values (exact), so it goes
    (passes/eliminate_requantize.py); with other parameters both stay."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Reshape", ["xd", "shape"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s2", "z"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "s2", "z"], ["rd"]),
        helper.make_node("Relu", ["rd"], ["y"]),
    ]
    inits = [init("s", 0.0123, np.float32), init("s2", 0.0123 if same else 0.0321, np.float32),
             init("z", 17, np.int16), init("shape", [2, 240], np.int64)]
    m = model(nodes, {"x": ([2, 8, 5, 6], TensorProto.FLOAT)}, ["y"], inits, opset=21)
    x = _inputs(0.0123)
    compiled = compile_model(m)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"],
                                  run_ort(m, {"x": x}, optimized=False)[0])
    absorbed = [a for k in compiled.inspect()["kernels"] for a in k["absorbed"]]
    assert ("QuantizeLinear_3" in absorbed) is not same, absorbed


# ------------------------------------------------------------------ scales above MAX_SCALE
LOWEST = np.finfo(np.float32).min  # Hugging Face's additive attention mask value
HUGE = np.float32(np.finfo(np.float32).max / np.float32(255))  # quantize_static's for it


def _masked_scores(then: str, extra_reader: bool = False) -> onnx.ModelProto:
    """scores + mask → Q(FLT_MAX/255, 255) → DQ → ``then`` → Q(1/255) → DQ → y: the masked
    attention scores of a BERT-style encoder quantized by quantize_static (the mask holds
    float32's lowest value, so the scores get a scale of FLT_MAX/255)."""
    nodes = [
        helper.make_node("Add", ["x", "mask"], ["a"]),
        helper.make_node("QuantizeLinear", ["a", "hs", "hz"], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "hs", "hz"], ["ad"]),
        helper.make_node(then, ["ad"], ["t"], **({"axis": -1} if then == "Softmax" else {})),
        helper.make_node("QuantizeLinear", ["t", "ts", "tz"], ["tq"]),
        helper.make_node("DequantizeLinear", ["tq", "ts", "tz"], ["y"]),
    ]
    outputs = ["y"]
    if extra_reader:
        nodes.append(helper.make_node("Cast", ["aq"], ["c"], to=TensorProto.FLOAT))
        outputs.append("c")
    mask = np.where(np.arange(8) < 5, 0.0, LOWEST).astype(np.float32).reshape(1, 1, 1, 8)
    inits = [init("mask", mask, np.float32), init("hs", HUGE, np.float32),
             init("hz", 255, np.uint8), init("ts", 1 / 255, np.float32),
             init("tz", 0, np.uint8)]
    return model(nodes, {"x": ([1, 2, 8, 8], TensorProto.FLOAT)}, outputs, inits)


def _scores() -> np.ndarray:
    """Ordinary scores, values near the huge scale's ties and past its range."""
    x = np.random.default_rng(1).standard_normal((1, 2, 8, 8)).astype(np.float32) * 4
    x.ravel()[:6] = np.float32(HUGE) * np.float32([-0.5, -1.5, -2.5, -254.5, 0.5, 1e-3])
    x.ravel()[6:8] = [LOWEST, -LOWEST]
    return x


def test_huge_scale_pair_runs_in_float_bit_exact() -> None:
    """A Q/DQ pair whose scale is above MAX_SCALE (the int8 kernels' products of scales
    would overflow) is computed in float32 as ONNX writes it, fused after the Add: bit-exact
    with onnxruntime, no island, no numpy kernel (it was an onnxruntime island)."""
    m = _masked_scores("Relu")
    x = _scores()
    want = run_ort(m, {"x": x}, optimized=False)[0]
    compiled = compile_model(m)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], want)
    assert not compiled.inspect()["islands"]
    impls = _impls(compiled)
    assert "numpy" not in impls and not any(i.startswith("ref") for i in impls), impls


def test_huge_scale_masked_softmax_within_one_step() -> None:
    """The masked softmax of a quantize_static encoder: the pair in float32, then oneDNN's
    softmax with its u8 output; within one output step of onnxruntime (the exponentials'
    rounding), masked positions exactly 0."""
    m = _masked_scores("Softmax")
    x = np.random.default_rng(2).standard_normal((1, 2, 8, 8)).astype(np.float32) * 4
    want = run_ort(m, {"x": x}, optimized=False)[0]
    compiled = compile_model(m)
    got = compiled.run({"x": x})["y"]
    assert np.abs(got - want).max() <= np.float32(1 / 255) * 1.0001
    np.testing.assert_array_equal(got[..., 5:], np.zeros_like(got[..., 5:]))
    assert not compiled.inspect()["islands"]


def test_huge_scale_quantize_with_another_reader_stays_an_island() -> None:
    m = _masked_scores("Relu", extra_reader=True)
    x = _scores()
    want = run_ort(m, {"x": x}, optimized=False)
    compiled = compile_model(m)
    got = compiled.run({"x": x})
    np.testing.assert_array_equal(got["y"], want[0])
    np.testing.assert_array_equal(got["c"], want[1])
    islands = compiled.inspect()["islands"]
    assert any("where qfuse's int8 kernels overflow float32, and the QuantizeLinear is read "
               "by 'Cast" in i["reason"] for i in islands), islands


def test_huge_scale_pair_read_by_qoperator_ops_runs_in_float() -> None:
    """quantize_static's QOperator form of the masked scores: QLinearAdd(scores, mask) with
    the huge output scale, read by QLinearSoftmax. The QOperator ops read those integers
    through DequantizeLinear nodes of the same parameters (context.DEQUANTIZED_PORTS), so the
    pair runs in float32 as in the QDQ form; within one output step of onnxruntime's table
    softmax, masked positions 0, no island."""
    mask = np.where(np.arange(8) < 5, 255, 0).astype(np.uint8).reshape(1, 1, 1, 8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("QLinearAdd", ["xq", "xs", "xz", "mq", "ms", "mz", "hs", "hz"], ["a"],
                         domain=MS),
        helper.make_node("QLinearSoftmax", ["a", "hs", "hz", "ts", "tz"], ["t"], domain=MS,
                         axis=-1, opset=13),
        helper.make_node("DequantizeLinear", ["t", "ts", "tz"], ["y"]),
    ]
    inits = [init("xs", 0.05, np.float32), init("xz", 128, np.uint8),
             init("mq", mask, np.uint8), init("ms", HUGE, np.float32),
             init("mz", 255, np.uint8), init("hs", HUGE, np.float32), init("hz", 255, np.uint8),
             init("ts", 1 / 256, np.float32), init("tz", 0, np.uint8)]
    m = model(nodes, {"x": ([1, 2, 8, 8], TensorProto.FLOAT)}, ["y"], inits,
              extra_opsets={MS: 1})
    x = np.random.default_rng(3).standard_normal((1, 2, 8, 8)).astype(np.float32) * 4
    want = run_ort(m, {"x": x})[0]
    compiled = compile_model(m)
    got = compiled.run({"x": x})["y"]
    assert np.abs(got - want).max() <= np.float32(1 / 256) * 1.0001
    np.testing.assert_array_equal(got[..., 5:], np.zeros_like(got[..., 5:]))
    assert not compiled.inspect()["islands"]
