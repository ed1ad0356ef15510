"""passes/integer_requantize.py: post-ops after an integer point shortened only where every
integer they can see gives the same result.

A chain of quantize_static's requantizations (PP-OCRv4 rec QDQ's convolution, its learnable
affine ``·w + b``, each step with a Q/DQ pair) loses its repeated requantization and its
divisions after the first, with results bit-identical to the unshortened chain in oneDNN's
model (apply_composed) and on oneDNN itself, NaN and infinities included; a merge that would
move one value is refused; random rows of requantizations (hypothesis) keep every bit; a
whole QDQ model compiles to the same outputs with shorter post-ops.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import qfuse
from qfuse.ir.chain import ChainOp, Quantize, Scale, Shift
from qfuse.ir.postops import (
    Binary,
    Composed,
    ComposerOptions,
    Eltwise,
    PostOp,
    TensorBinary,
)
from qfuse.ir.types import DType, OnnxQuantize, QuantParams
from qfuse.compiler.lower.attrs import build_attr
from qfuse.compiler.lower.layouts import const_memory
from qfuse.passes import integer_requantize
from qfuse.passes.composer import compose
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    FormatTag,
    Memory,
    MemoryDesc,
    binary,
)
from qfuse.runtime.reference.chain import apply_composed
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32
S1, S2, BETA = 0.0401896, 0.0383186, -0.450772


def _div(s: float) -> Binary:
    return Binary("div", np.array([s], F32))


def _requantizations() -> list[PostOp]:
    """q₁ = Q(x; s₁) ·s₁, again Q(·; s₁), then ·s₁ + β, Q(·; s₂) ·s₂ (zero points shifted
    into the clips, as clip_shift leaves them)."""
    return [_div(S1), Eltwise("round"), Eltwise("clip", -155, 100), Eltwise("linear", S1, 0),
            _div(S1), Eltwise("round"), Eltwise("clip", -155, 100), Eltwise("linear", S1, BETA),
            _div(S2), Eltwise("round"), Eltwise("clip", -167, 88), Eltwise("linear", S2, 0)]


def _accumulators() -> np.ndarray:
    """Every level of the first quantization, either side of each tie, and far outside."""
    k = np.arange(-160, 106, dtype=np.float64)
    centre = np.rint((k + 0.5) * S1 / 0.001)
    acc = (centre[:, None] + np.arange(-3, 4)[None, :]).ravel()
    wide = np.random.default_rng(0).integers(-2**23, 2**23, 4000)
    return np.concatenate([acc, wide]).astype(np.int32).reshape(1, 1, -1, 1)


def _composed(post_ops: list[PostOp], dst: DType) -> Composed:
    return Composed(1, dst, wei_scales=np.array([0.001], F32), post_ops=post_ops)


def test_requantizations_shorten_to_the_same_bits() -> None:
    for dst in (DType.F32, DType.U8):
        post_ops = _requantizations()
        if dst is DType.U8:  # a store in ONNX form: the last dequantize becomes the zero point
            post_ops = post_ops[:-1]
        before = _composed(list(post_ops), dst)
        after = dataclasses.replace(before, post_ops=list(post_ops))
        assert integer_requantize.simplify(after)
        divides = [p for p in after.post_ops if isinstance(p, Binary) and p.alg == "div"]
        assert len(divides) == 1 and len(after.post_ops) <= len(post_ops) - 5, after.post_ops
        acc = _accumulators()
        want = apply_composed(acc, before, {}, channel_axis=1)
        got = apply_composed(acc, after, {}, channel_axis=1)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
        assert after.rounding() == before.rounding()


def test_an_added_constant_between_quantizations_of_one_scale_loses_its_round() -> None:
    """Dequantize, add a constant, quantize again with the same scale (PP-OCRv4 det QDQ's
    depthwise convolution and its affine): ``linear(1, 0.718) round`` on an integer is
    ``linear(1, 1)`` (whose merge with the next ``·s`` as ``linear(s, s)`` would round twice
    in oneDNN's reference kernels: refused), ``linear(1, -0.047) round`` is no operation at
    all; an offset at a half (0.5: the round goes to even) keeps its round."""
    for offset, saved in ((0.717929, 1), (-0.0467732, 2), (0.5, 0)):
        post_ops = [_div(0.744758), Eltwise("round"), Eltwise("clip", -133, 122),
                    Eltwise("linear", 1, offset), Eltwise("round"), Eltwise("linear", 0.702433, 0)]
        before = _composed(list(post_ops), DType.F32)
        after = dataclasses.replace(before, post_ops=list(post_ops))
        integer_requantize.simplify(after)
        rounds = [p for p in after.post_ops if isinstance(p, Eltwise) and p.alg == "round"]
        assert len(rounds) == (1 if saved else 2), after.post_ops
        assert len(after.post_ops) == len(post_ops) - saved, after.post_ops
        acc = _accumulators()
        want = apply_composed(acc, before, {}, channel_axis=1)
        got = apply_composed(acc, after, {}, channel_axis=1)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _merge_changes_a_value() -> tuple[float, float]:
    """A dequantize scale a and a next scale s whose ·a then ÷s rounds differently from
    ·(a/s) for some integer in −128…127, within the next clip (found by search; most pairs
    agree)."""
    rng = np.random.default_rng(1)
    k = np.arange(-128, 128, dtype=F32)
    for _ in range(20000):
        a, s = F32(rng.uniform(0.001, 0.1)), F32(rng.uniform(0.001, 0.1))
        two = np.clip(np.rint(((k * a).astype(F32) / s).astype(F32)), -128, 127)
        one = np.clip(np.rint((k.astype(np.float64) * np.float64(F32(np.float64(a) / s)))
                              .astype(F32)), -128, 127)
        if not np.array_equal(two, one):
            return float(a), float(s)
    raise AssertionError("no scale pair found whose merge changes a value")


def test_a_merge_that_moves_a_value_is_refused() -> None:
    a, s = _merge_changes_a_value()
    post_ops = [_div(a), Eltwise("round"), Eltwise("clip", -128, 127), Eltwise("linear", a, 0),
                _div(s), Eltwise("round"), Eltwise("clip", -128, 127), Eltwise("linear", s, 0)]
    composed = _composed(list(post_ops), DType.F32)
    integer_requantize.simplify(composed)
    assert any(isinstance(p, Binary) and p.alg == "div" and np.float32(p.values[0]) == F32(s)
               for p in composed.post_ops), composed.post_ops
    acc = _accumulators()
    want = apply_composed(acc, _composed(post_ops, DType.F32), {}, channel_axis=1)
    assert np.array_equal(apply_composed(acc, composed, {}, channel_axis=1).view(np.uint32),
                          want.view(np.uint32))


def test_a_stretch_reading_a_tensor_is_not_checked_past_it() -> None:
    """After a post-op reading a run-time tensor (the gate's second read of x) nothing is an
    integer until the next round and clip: the division there stays."""
    post_ops = [Eltwise("round"), Eltwise("clip", 0, 255), Eltwise("linear", S1, 0),
                TensorBinary("mul", 0), _div(S2), Eltwise("round")]
    composed = Composed(2, DType.U8, post_ops=list(post_ops))
    assert not integer_requantize.simplify(composed)
    assert composed.post_ops == post_ops


def test_per_channel_constants_merge_too() -> None:
    """A layer scale γ (one value per channel) between a dequantize and the next quantize,
    as ConvNeXt's MatMuls carry it: ·s₁, ·γ, ÷s₂ is one multiply by s₁·γ/s₂ per channel where
    every (integer, channel) gives the same bits — checked on all of them."""
    gamma = np.random.default_rng(4).uniform(0.05, 3.0, 48).astype(F32)
    post_ops = [_div(S1), Eltwise("round"), Eltwise("clip", -128, 127),
                Eltwise("linear", S1, 0), Binary("mul", gamma), _div(S2), Eltwise("round")]
    before = Composed(48, DType.U8, wei_scales=np.array([0.001], F32), post_ops=post_ops,
                      dst_zero_point=3)
    after = dataclasses.replace(before, post_ops=list(post_ops))
    assert integer_requantize.simplify(after)
    assert len(after.post_ops) < len(post_ops), after.post_ops
    acc = np.repeat(_accumulators(), 48, axis=1)
    want = apply_composed(acc, before, {}, channel_axis=1)
    assert np.array_equal(apply_composed(acc, after, {}, channel_axis=1), want)


def _onnx_q(scale: float, zp: int) -> Quantize:
    return Quantize((scale * (0 - zp),), (scale * (255 - zp),), (0.0,), (255.0,), 256, DType.U8,
                    scale=scale, onnx=OnnxQuantize(DType.U8, QuantParams.make(scale, zp)))


@st.composite
def requantizing_chains(draw: st.DrawFn) -> tuple[list[ChainOp], DType, int]:
    """A convolution's dequantize and bias, then one to four Q/DQ pairs with an affine step
    (or a per-channel scale, a layer scale γ, or a repeat of the same pair) between them,
    ending dequantized (f32) or quantized (u8); one or four channels."""
    channels = draw(st.sampled_from([1, 4]))
    scales = st.floats(0.004, 0.1)
    chain: list[ChainOp] = [Scale.of(np.float32(draw(st.floats(2e-4, 2e-3)))),
                            Shift.of(np.float32(draw(st.floats(-2, 2))))]
    for _ in range(draw(st.integers(1, 4))):
        s, zp = float(np.float32(draw(scales))), draw(st.integers(0, 255))
        chain += [_onnx_q(s, zp), Shift.of(-zp), Scale.of(s)]
        step = draw(st.sampled_from(["none", "mul", "add", "affine", "again", "gamma"]))
        if step == "gamma":
            gamma = draw(st.lists(st.floats(0.05, 3), min_size=channels, max_size=channels))
            chain.append(Scale.of(np.asarray(gamma, np.float32)))
        if step in ("mul", "affine"):
            chain.append(Scale.of(np.float32(draw(st.floats(0.25, 4)))))
        if step in ("add", "affine"):
            chain.append(Shift.of(np.float32(draw(st.floats(-3, 3)))))
        if step == "again":
            chain += [_onnx_q(s, zp), Shift.of(-zp), Scale.of(s)]
    if draw(st.booleans()):
        s_out = float(np.float32(draw(scales)))
        return chain + [_onnx_q(s_out, draw(st.integers(0, 255)))], DType.U8, channels
    return chain, DType.F32, channels


@settings(max_examples=150, deadline=None)
@given(requantizing_chains())
def test_random_requantizing_chains_keep_every_bit(
        case: tuple[list[ChainOp], DType, int]) -> None:
    """Whatever the composer makes of a row of requantizations, the shortened post-ops give the
    same bits on accumulators over the first level's ties and far outside."""
    chain, dtype, channels = case
    before = compose(chain, channels=channels, dst_dtype=dtype)
    after = dataclasses.replace(before, post_ops=list(before.post_ops))
    integer_requantize.simplify(after)
    acc = np.concatenate([np.arange(-2**16, 2**16, 7),
                          np.random.default_rng(0).integers(-2**23, 2**23, 20000)])
    acc = np.repeat(acc.astype(np.int32).reshape(1, 1, -1, 1), channels, axis=1)
    want = apply_composed(acc, before, {}, channel_axis=1)
    got = apply_composed(acc, after, {}, channel_axis=1)
    view = np.uint8 if dtype is DType.U8 else np.uint32
    assert np.array_equal(got.view(view), want.view(view)), (before.post_ops, after.post_ops)
    assert after.rounding() == before.rounding()


def _onednn(post_ops: list[PostOp], x: np.ndarray) -> np.ndarray:
    """A jit binary ``x·1`` on oneDNN with ``post_ops`` as the lowering builds them
    (attrs.build_attr), float32 out."""
    md = MemoryDesc.from_tag((1, x.size), DataType.f32, FormatTag.ab)
    one = MemoryDesc.from_tag((1, 1), DataType.f32, FormatTag.ab)
    built = build_attr(Composed(1, DType.F32, post_ops=post_ops), ndims=2, channel_axis=1,
                       wei_mask=0, dst_type=DataType.f32)
    pd = binary(Alg.binary_mul, md, one, md, attr=built.attr)
    src, dst = Memory(md), Memory(md)
    src._buffer.view(np.float32)[:] = x
    pd.create().bind({Arg.SRC_0: src, Arg.SRC_1: const_memory(np.ones((1, 1), F32)),
                      Arg.DST: dst, **built.fixed}).execute()
    assert pd.impl_name.startswith("jit"), pd.impl_name
    return dst._buffer.view(np.float32)[:x.size].copy()


def test_onednn_computes_the_shortened_post_ops_bit_for_bit() -> None:
    """On oneDNN itself, over values reaching every level, ties, −0, NaN and ±inf (its clip
    takes NaN to the low bound, so the stretch after it sees integers only)."""
    post_ops = _requantizations()
    composed = _composed(list(post_ops), DType.F32)
    assert integer_requantize.simplify(composed)
    k = np.arange(-160, 106, dtype=F32)
    x = np.concatenate([(k + F32(0.5)) * F32(S1), k * F32(S1), np.linspace(-9, 9, 5001, dtype=F32),
                        np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30], F32)])
    want = _onednn(post_ops, x)
    got = _onednn(composed.post_ops, x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _affine_hardswish_model() -> onnx.ModelProto:
    """PP-OCRv4 rec's block as quantize_static writes it: an int8 conv, its learnable affine
    ``·w + b`` and HardSwish written out ``x·clip(x + 3, 0, 6)/6``, a Q/DQ pair after each op."""
    inits = [init("w_q", np.random.default_rng(2).integers(-127, 128, (16, 8, 3, 3)), np.int8),
             init("w_s", F32(0.01)), init("w_z", np.int8(0)), init("aff_w", F32(0.8763)),
             init("aff_b", F32(-0.2231)), init("three", F32(3)), init("six", F32(6))]

    def qdq(src: str, dst: str, scale: float, zp: int) -> list[onnx.NodeProto]:
        inits.extend([init(f"{dst}s", F32(scale)), init(f"{dst}z", np.uint8(zp))])
        return qdq_pair(dst, src, dst)

    nodes = [*qdq("x", "xd", 0.02, 128),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             *qdq("c", "cd", S1, 155),
             helper.make_node("Mul", ["cd", "aff_w"], ["m"]), *qdq("m", "md", S1, 155),
             helper.make_node("Add", ["md", "aff_b"], ["a"]), *qdq("a", "ad", S2, 167),
             helper.make_node("Add", ["ad", "three"], ["t"]), *qdq("t", "td", 6 / 255, 0),
             helper.make_node("Mul", ["ad", "td"], ["p"]), *qdq("p", "pd", 0.0166, 23),
             helper.make_node("Div", ["pd", "six"], ["h"]), *qdq("h", "y", 0.0087, 23)]
    return model(nodes, {"x": ([1, 8, 10, 12], TensorProto.FLOAT)}, ["y"], inits, opset=13)


def test_a_quantize_static_block_compiles_to_the_same_outputs_with_fewer_post_ops() -> None:
    block = _affine_hardswish_model()
    on = qfuse.compile_model(block)
    off = qfuse.compile_model(block, composer=ComposerOptions().without("integer_requantize"))
    rng = np.random.default_rng(3)
    for spread in (1.0, 3.0):
        x = (rng.standard_normal((1, 8, 10, 12)) * spread).astype(F32)
        assert np.array_equal(on.run({"x": x})["y"], off.run({"x": x})["y"])

    def post_ops(compiled: qfuse.CompiledModel) -> int:
        return sum(len(k.get("post_ops", [])) for k in compiled.inspect()["kernels"])

    shortened = [k for k in on.inspect()["kernels"]
                 if "integer_requantize" in k.get("optimizations", [])]
    assert shortened, on.inspect()["kernels"]
    assert post_ops(on) < post_ops(off)
