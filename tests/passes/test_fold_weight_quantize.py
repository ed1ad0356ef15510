"""fold_weight_quantize: FakeQuantize on constant float weights → s8 constant + DQ.

Numerics: the s8 value is the FakeQuantize's level (same float32 expression), so the
dequantized weight is the same level; it differs from FQ(w) by float32 rounding only, asserted
as |DQ(w_q) - FQ(w)| <= 1e-4·So per weight. A float conv on either then differs by at most
1e-4·So·Σ|x| over the window (asserted on the outputs with that bound).
"""

from __future__ import annotations

import numpy as np
import pytest
from quant_helpers import F32, add, apply, fake_quantize, finish, new_graph, ops, reasons, reference

import qfuse.passes.decompose_fake_quantize as D
import qfuse.passes.fold_weight_quantize as W
import qfuse.passes.move_dequantize as M
from qfuse.ir import DType, Op
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs
from tests.compiler.lower_helpers import computes_int8_node

RNG = np.random.default_rng(11)


def _conv_graph(w: np.ndarray, il, ih, ol, oh, levels: int, op: Op = Op.CONV, group: int = 1):
    c_in = w.shape[0] if op is Op.CONV_TRANSPOSE else w.shape[1] * group
    g = new_graph((1, c_in, 5, 5))
    g.add_constant("w", w.astype(F32))
    fake_quantize(g, "w", "wq", il, ih, ol, oh, levels)
    if op is Op.CONV:
        attrs = ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), group)
    else:
        attrs = ConvTransposeAttrs((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), group)
    add(g, op, ["x", "wq"], "y", attrs)
    return finish(g, "y")


def _check(before, after, step: np.ndarray) -> None:
    x = RNG.standard_normal(before.info("x").shape).astype(F32)
    b = reference(before, {"x": x}, keep=True)
    a = reference(after, {"x": x}, keep=True)
    assert np.all(np.abs(a["wq"] - b["wq"]) <= 1e-4 * step)
    window = float(np.abs(x).sum())
    assert float(np.max(np.abs(a["y"] - b["y"]))) <= 1e-4 * float(step.max()) * window


def _dq(g):
    dq = g.producer("wq")
    assert dq.op is Op.DEQUANTIZE_LINEAR
    return dq, g.values[dq.inputs[0]]


@pytest.mark.parametrize("levels,low", [(255, -127), (256, -128)])
def test_per_channel_symmetric_conv_weights(levels, low):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(F32)
    amax = np.abs(w).max(axis=(1, 2, 3)).reshape(4, 1, 1, 1).astype(F32)
    step = amax / F32(127)
    lo, hi = F32(low) * step, F32(low + levels - 1) * step
    g = _conv_graph(w, lo, hi, lo, hi, levels)
    before = g.copy()
    result = apply(W, g)
    assert result.changed == 1 and not result.declined
    assert ops(g) == ["DequantizeLinear", "Conv"]
    dq, wq = _dq(g)
    assert wq.data.dtype == np.int8 and wq.info.dtype is DType.S8
    assert wq.info.quant.axis == 0 and wq.info.quant.zero_point == (0,) * 4
    assert dq.attrs.axis == 0 and np.all(g.constant(dq.inputs[2]) == 0)
    assert int(wq.data.min()) >= low and int(wq.data.max()) <= low + levels - 1
    np.testing.assert_allclose(g.constant(dq.inputs[1]), (hi - lo).ravel() / (levels - 1),
                               rtol=1e-6)
    _check(before, g, step.ravel().reshape(4, 1, 1, 1))


def test_per_tensor_and_conv_transpose_axis_1():
    w = RNG.standard_normal((4, 2, 3, 3)).astype(F32)  # [Cin, Cout/g, k, k], group 2
    step = np.array([0.02, 0.03], F32).reshape(1, 2, 1, 1)
    lo, hi = -127 * step, 127 * step
    g = _conv_graph(w, lo, hi, lo, hi, 255, Op.CONV_TRANSPOSE, group=2)
    before = g.copy()
    assert apply(W, g).changed == 1
    dq, wq = _dq(g)
    assert dq.attrs.axis == 1 and wq.info.quant.axis == 1 and len(wq.info.quant.scale) == 2
    _check(before, g, step)
    g2 = _conv_graph(w[:, :1], F32(-1), F32(1), F32(-1), F32(1), 255, Op.CONV_TRANSPOSE)
    assert apply(W, g2).changed == 1
    assert g2.values[_dq(g2)[0].inputs[0]].info.quant.axis is None


def test_matmul_weights_per_column():
    g = new_graph((2, 6))
    w = RNG.standard_normal((6, 5)).astype(F32)
    amax = np.abs(w).max(axis=0).astype(F32)
    g.add_constant("w", w)
    fake_quantize(g, "w", "wq", -amax, amax, -amax, amax, 255)
    add(g, Op.MATMUL, ["x", "wq"], "y")
    finish(g, "y")
    assert apply(W, g).changed == 1
    assert _dq(g)[0].attrs.axis == 1


@pytest.mark.parametrize("case,want", [
    ("asymmetric", "oneDNN has no weight zero points for conv"),
    ("wrong_axis", "not along the output-channel axis"),
    ("not_integral", "integer zero point"),
    ("levels", "does not fit 8 bits"),
])
def test_declined_with_reason(case, want):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(F32)
    lo, hi, levels = F32(-1.27), F32(1.27), 255
    if case == "asymmetric":
        lo, hi, levels = F32(-0.5), F32(2.05), 256
    if case == "wrong_axis":
        hi = np.array([1.27, 2.54, 1.27], F32).reshape(1, 3, 1, 1)
        lo = -hi
    if case == "not_integral":
        lo = F32(-1.2)
    if case == "levels":
        levels = 65536
    g = _conv_graph(w, lo, hi, lo, hi, levels)
    result = apply(W, g)
    assert result.changed == 0 and ops(g) == ["FakeQuantize", "Conv"]
    assert len(result.declined) == 1 and want in reasons(result)[0], reasons(result)


def test_activation_fake_quantize_is_not_touched():
    g = new_graph((1, 4))
    fake_quantize(g, "x", "y", F32(-1), F32(1), F32(-1), F32(1), 255)
    finish(g, "y")
    result = apply(W, g)
    assert result.changed == 0 and not result.declined


def test_openvino_style_model_becomes_int8():
    """FakeQuantize on activations and weights (NNCF export) → the same int8 conv as ONNX
    Runtime's QDQ models, through decomposition, weight folding and move_dequantize."""
    g = new_graph((1, 3, 6, 6))
    fake_quantize(g, "x", "xq", F32(0), F32(2.55), F32(0), F32(2.55), 256)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(F32)
    amax = np.abs(w).max(axis=(1, 2, 3)).reshape(4, 1, 1, 1).astype(F32)
    g.add_constant("w", w)
    fake_quantize(g, "w", "wq", -amax, amax, -amax, amax, 255)
    add(g, Op.CONV, ["xq", "wq"], "y", ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))
    finish(g, "y")
    before = g.copy()
    for module in (D, W, M):
        assert apply(module, g).changed == 1
    conv = g.node("y")
    assert conv.fused is not None and g.info(conv.inputs[0]).dtype is DType.U8
    assert g.info(conv.inputs[1]).dtype is DType.S8 and conv.fused.src_zero_point == 0
    x = np.abs(RNG.standard_normal((1, 3, 6, 6))).astype(F32)
    b, a = reference(before, {"x": x})["y"], reference(g, {"x": x})["y"]
    assert float(np.max(np.abs(a - b))) <= 1e-5 * float(np.max(np.abs(b)))


def test_requantized_shared_weights_become_int8_constants():
    """One weight initializer read by two Gemms (transB), the second through torch.onnx's
    Identity and its own Q/DQ — NNCF's quantizers on deduplicated weights: Q(DQ(w_q)) is a
    constant, folded to ONNX's levels saturate(rint(DQ(w_q)/s2)) and transposed with the Gemm's
    transB; both MatMuls run int8, within one output step of the reference."""
    import onnx
    from onnx import TensorProto, helper

    from qfuse.compiler.api import compile_model
    from qfuse.ir.postops import ComposerOptions
    from qfuse.runtime.numerics import step_diff
    from tests.compiler.onnx_builders import init, model, qdq_pair

    rng = np.random.default_rng(2)
    w_q = rng.integers(-127, 128, (8, 16)).astype(np.int8)
    ws = rng.uniform(0.002, 0.004, 8).astype(F32)
    ws2 = (ws * F32(1.37)).astype(F32)
    inits = [init("w", w_q), init("ws", ws), init("wz", np.zeros(8, np.int8)),
             init("ws2", ws2), init("wz2", np.zeros(8, np.int8)),
             init("xs", F32(0.02)), init("xz", np.uint8(128)),
             init("as", F32(0.05)), init("az", np.uint8(120)),
             init("bs", F32(0.06)), init("bz", np.uint8(131))]
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Gemm", ["xd", "wd"], ["a0"], transB=1),
             helper.make_node("Identity", ["wd"], ["wd2"]),
             helper.make_node("QuantizeLinear", ["wd2", "ws2", "wz2"], ["wq2"], axis=0),
             helper.make_node("DequantizeLinear", ["wq2", "ws2", "wz2"], ["wd2d"], axis=0),
             helper.make_node("Gemm", ["xd", "wd2d"], ["b0"], transB=1),
             *qdq_pair("a", "a0", "a"), *qdq_pair("b", "b0", "b")]
    m = model(nodes, {"x": ([4, 16], TensorProto.FLOAT)}, ["a", "b"], inits)
    onnx.checker.check_model(m)
    # the MatMuls kept (on AVX2, vector_matmul_as_conv would make them 1x1 convolutions)
    compiled = compile_model(m, composer=ComposerOptions().without("vector_matmul_as_conv"))
    matmuls = [k for k in compiled.inspect()["kernels"] if k["primitive"] == "matmul"]
    assert matmuls and all(computes_int8_node(k) for k in matmuls), matmuls
    want = np.clip(np.rint(w_q.astype(F32) * ws[:, None] / ws2[:, None]), -128, 127).T
    graph = compiled.compiled_graph
    weights = [graph.constant(n.inputs[1]) for n in graph.topo_order() if n.op is Op.MATMUL]
    assert any(w is not None and np.array_equal(w, want) for w in weights)
    reference = compile_model(m, mode="reference")
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1, (4, 16)).astype(F32)}
        got, ref = compiled.run(feeds), reference.run(feeds)
        for name, step in (("a", 0.05), ("b", 0.06)):
            assert step_diff(got[name], ref[name], step).max_steps <= 1
