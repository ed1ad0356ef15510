"""The DnnlPostOpsComposer: golden mappings, each optimization's precondition, and random
chains composed vs uncomposed.

Tolerances: the composer folds constants (a·b computed once, in float64, stored as float32),
so a value that lands within float32 rounding of a .5 tie can round the other way: at most
1 LSB on the integer output, and only on elements whose exact value is near a tie (checked
element by element with an independent float64 evaluation; power-of-two scales make exact
ties common, so no fixed share of identical elements is promised). A chain with an inner
quantization (round inside the chain) can flip that inner round too; the flip is then carried
to the output scaled by (inner step / output step), which the generator keeps ≤ 1, so the
bound there is 2 LSB (inner flip + final flip).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qfuse.ir.chain import Act, Activation, ChainOp, PRelu, Quantize, Residual, Scale, Shift
from qfuse.ir.postops import OPTIMIZATIONS, Binary, ComposerOptions, Eltwise, Sum
from qfuse.ir.types import DType
from qfuse.passes.composer import ComposeError, compose
from qfuse.runtime.reference.chain import apply_chain, apply_composed

C = 8


def q_item(scale: float, zp: int, dtype: DType) -> Quantize:
    """The quantize-only FakeQuantize a QuantizeLinear(scale, zp) stands for."""
    lo, hi = dtype.range
    return Quantize((scale * (lo - zp),), (scale * (hi - zp),), (float(lo),), (float(hi),),
                    256, dtype)


def qdq_conv_chain(dtype: DType = DType.U8) -> list[ChainOp]:
    s_w = np.linspace(0.01, 0.02, C)
    return [Scale.of(0.05 * s_w), Shift.of(np.linspace(-1, 1, C)),
            Activation(Act.RELU), q_item(0.1, 3 if dtype == DType.U8 else -2, dtype)]


def test_golden_qdq_conv_relu() -> None:
    out = compose(qdq_conv_chain(), channels=C, dst_dtype=DType.U8)
    assert out.post_ops == [Eltwise("relu")]
    assert out.wei_scales.shape == (C,) and out.bias is not None
    assert out.dst_zero_point == 3
    assert out.dst_scale == pytest.approx(0.1, rel=1e-6)
    for name in ("mul_to_weight_scales", "add_to_bias", "quantize_clip_after_round",
                 "fold_output_shift", "drop_round_clip", "dst_zero_point", "dst_scale"):
        assert name in out.fired


def test_golden_s8_output_zero_point() -> None:
    out = compose(qdq_conv_chain(DType.S8), channels=C, dst_dtype=DType.S8)
    assert out.post_ops == [Eltwise("relu")] and out.dst_zero_point == -2


def test_residual_becomes_sum_with_its_quantization() -> None:
    chain = [Scale.of(np.full(C, 0.01)), Residual(1, 0.2, 5, DType.U8), Activation(Act.RELU),
             q_item(0.3, 0, DType.U8)]
    out = compose(chain, channels=C, dst_dtype=DType.U8)
    assert out.post_ops == [Sum(0.2, 5, DType.U8, 1), Eltwise("relu")]
    assert out.dst_scale == pytest.approx(0.3, rel=1e-6)


def test_sum_scale_folds_a_per_tensor_multiply_after_the_sum() -> None:
    chain = [Scale.of(np.full(C, 0.01)), Residual(1, 0.2, 0, DType.U8), Scale.of(0.5),
             Activation(Act.TANH)]
    out = compose(chain, channels=C, dst_dtype=DType.F32)
    assert out.post_ops == [Sum(pytest.approx(0.1), 0, DType.U8, 1), Eltwise("tanh")]
    assert "sum_scale" in out.fired


def test_relu_mul_swap_needs_positive_scales() -> None:
    pos = [Activation(Act.RELU), Scale.of(np.full(C, 2.0))]
    out = compose(pos, channels=C, dst_dtype=DType.F32)
    assert "relu_mul_swap" in out.fired and out.post_ops == [Eltwise("relu")]
    neg = [Activation(Act.RELU), Scale.of(np.r_[np.full(C - 1, 2.0), -1.0])]
    out = compose(neg, channels=C, dst_dtype=DType.F32)
    assert "relu_mul_swap" not in out.fired
    assert isinstance(out.post_ops[-1], Binary) and out.post_ops[-1].alg == "mul"


def test_per_channel_ops_become_binary_and_per_tensor_eltwise() -> None:
    chain = [Activation(Act.TANH), Scale.of(np.arange(1, C + 1)), Shift.of(0.5)]
    out = compose(chain, channels=C, dst_dtype=DType.F32)
    assert [type(p).__name__ for p in out.post_ops] == ["Eltwise", "Binary", "Eltwise"]
    assert out.post_ops[2] == Eltwise("linear", 1.0, 0.5)


def test_per_channel_fake_quantize_crop_becomes_per_tensor() -> None:
    il = tuple(np.linspace(-1, -0.5, C))
    ih = tuple(np.linspace(0.5, 1, C))
    fq = Quantize(il, ih, (0.0,), (255.0,), 256, DType.U8)
    out = compose([Activation(Act.TANH), fq], channels=C, dst_dtype=DType.U8)
    assert "quantize_clip_after_round" in out.fired
    assert not any(isinstance(p, Binary) and p.alg in ("max", "min") for p in out.post_ops)
    off = compose([Activation(Act.TANH), fq], channels=C, dst_dtype=DType.U8,
                  options=ComposerOptions().without("quantize_clip_after_round"))
    assert any(isinstance(p, Binary) and p.alg == "max" for p in off.post_ops)


def test_skip_identity() -> None:
    out = compose([Activation(Act.TANH), Scale.of(1.0), Shift.of(0.0)], channels=C,
                  dst_dtype=DType.F32)
    assert out.post_ops == [Eltwise("tanh")] and out.fired.count("skip_identity") == 2


def test_two_residuals_are_refused() -> None:
    chain = [Residual(1), Activation(Act.RELU), Residual(2)]
    with pytest.raises(ComposeError, match="one sum"):
        compose(chain, channels=C, dst_dtype=DType.F32)


def test_wrong_channel_count_is_refused() -> None:
    with pytest.raises(ComposeError, match="3 values for 8 channels"):
        compose([Scale.of([1.0, 2.0, 3.0])], channels=C, dst_dtype=DType.F32)


def test_options_reject_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown"):
        ComposerOptions().with_("make_it_fast")


# ------------------------------------------------------------------ random chains
def f32s(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False).map(lambda v: float(np.float32(v)))


def _values(draw: st.DrawFn, lo: float, hi: float, positive: bool = False) -> tuple:
    per_channel = draw(st.booleans())
    n = C if per_channel else 1
    vals = draw(st.lists(f32s(lo, hi), min_size=n, max_size=n))
    if positive:
        vals = [abs(v) + 1e-3 for v in vals]
    return tuple(vals)


@st.composite
def chains(draw: st.DrawFn, inner_quantize: bool) -> tuple[list[ChainOp], DType]:
    s_w = draw(st.lists(f32s(1e-3, 2e-2), min_size=C, max_size=C))
    chain: list[ChainOp] = [Scale.of(np.float32(0.02) * np.asarray(s_w, np.float32)),
                            Shift.of(draw(st.lists(f32s(-2, 2), min_size=C,
                                                   max_size=C)))]
    used_residual = False
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["mul", "add", "act", "prelu", "residual"]))
        if kind == "mul":
            chain.append(Scale(_values(draw, -3, 3)))
        elif kind == "add":
            chain.append(Shift(_values(draw, -2, 2)))
        elif kind == "act":
            act = draw(st.sampled_from([Act.RELU, Act.CLIP, Act.SIGMOID, Act.TANH,
                                        Act.HARD_SWISH]))
            params = {Act.CLIP: (0.0, 6.0), Act.HARD_SWISH: (1 / 6, 0.5)}.get(act, (0.0, 0.0))
            if act == Act.RELU and draw(st.booleans()):
                params = (0.1, 0.0)
            chain.append(Activation(act, *params))
        elif kind == "prelu":
            chain.append(PRelu(_values(draw, 0.01, 0.5, positive=True)))
        elif not used_residual:
            used_residual = True
            chain.append(Residual(1, draw(f32s(0.01, 0.1)),
                                  draw(st.integers(0, 255)), DType.U8))
    if inner_quantize:
        s_in = draw(f32s(0.02, 0.05))
        zp_in = draw(st.integers(0, 20))
        chain += [q_item(s_in, zp_in, DType.U8), Shift.of(-zp_in), Scale.of(s_in)]
        if not used_residual:
            chain.append(Residual(1, 0.03, 128, DType.U8))
    dtype = draw(st.sampled_from([DType.U8, DType.S8, DType.F32]))
    if dtype != DType.F32:
        chain.append(q_item(draw(f32s(0.05, 0.2)), draw(st.integers(-5, 5))
                            + (128 if dtype == DType.U8 else 0), dtype))
    return chain, dtype


def _near_ties(chain: list[ChainOp], acc: np.ndarray, res: dict[int, np.ndarray],
               tol: float = 1e-3) -> np.ndarray:
    """Elements whose exact (float64) evaluation puts some rounding step within ``tol`` levels
    of a .5 tie: there float32 rounding of folded constants may pick either side. An
    independent float64 evaluator of the chain's meaning, written for this test."""
    x = acc.astype(np.float64)
    near = np.zeros(acc.shape, bool)

    def pc(values: tuple[float, ...]) -> np.ndarray:
        v = np.asarray(values, np.float64)
        return v.reshape(1, -1, 1, 1) if v.size > 1 else v.reshape(())

    for item in chain:
        if isinstance(item, Scale):
            x = x * pc(item.values)
        elif isinstance(item, Shift):
            x = x + pc(item.values)
        elif isinstance(item, PRelu):
            x = np.where(x >= 0, x, x * pc(item.slopes))
        elif isinstance(item, Residual):
            x = x + item.scale * (res[item.port].astype(np.float64) - item.zero_point)
        elif isinstance(item, Activation):
            a, b = item.alpha, item.beta
            if item.act is Act.RELU:
                x = np.where(x > 0, x, x * a)
            elif item.act is Act.CLIP:
                x = np.clip(x, a, b)
            elif item.act is Act.SIGMOID:
                x = 1 / (1 + np.exp(-x))
            elif item.act is Act.TANH:
                x = np.tanh(x)
            else:
                assert item.act is Act.HARD_SWISH
                x = x * np.clip(x * a + b, 0, 1)
        elif isinstance(item, Quantize):
            il, ih, ol, oh = (pc(v) for v in (item.input_low, item.input_high,
                                              item.output_low, item.output_high))
            level = (np.clip(x, il, ih) - il) / (ih - il) * (item.levels - 1)
            near |= np.abs(level - np.floor(level) - 0.5) < tol
            x = np.rint(level) / (item.levels - 1) * (oh - ol) + ol
    return near


def _check(chain: list[ChainOp], dtype: DType, options: ComposerOptions, bound: int) -> None:
    rng = np.random.default_rng(0)
    acc = rng.integers(-20000, 20000, size=(4, C, 6, 6)).astype(np.int32)
    res = {1: rng.integers(0, 256, size=acc.shape).astype(np.uint8)}
    ref = apply_chain(acc, chain, res, channel_axis=1, dst_dtype=dtype)
    composed = compose(chain, channels=C, dst_dtype=dtype, options=options)
    got = apply_composed(acc, composed, res, channel_axis=1)
    if dtype.is_integer:
        diff = np.abs(got.astype(np.int32) - ref.astype(np.int32))
        assert diff.max() <= bound, (composed, diff.max())
        assert not np.any((diff != 0) & ~_near_ties(chain, acc, res)), composed
    else:
        # float32 reassociation of folded constants; an inner rounding may flip at a near-tie
        off = np.abs(got - ref) > 1e-4 * np.abs(ref) + 1e-4 * np.abs(ref).max() + 1e-6
        assert not np.any(off & ~_near_ties(chain, acc, res)), composed


@settings(max_examples=150, deadline=None)
@given(chains(inner_quantize=False))
def test_random_chains_compose_equivalently(case: tuple[list[ChainOp], DType]) -> None:
    _check(*case, ComposerOptions(), bound=1)


@settings(max_examples=60, deadline=None)
@given(chains(inner_quantize=True))
def test_random_chains_with_inner_quantize(case: tuple[list[ChainOp], DType]) -> None:
    _check(*case, ComposerOptions(), bound=2)


@pytest.mark.parametrize("name", OPTIMIZATIONS)
@settings(max_examples=20, deadline=None)
@given(case=chains(inner_quantize=False))
def test_each_optimization_can_be_switched_off(name: str, case) -> None:
    chain, dtype = case
    options = ComposerOptions().without(name)
    assert name not in compose(chain, channels=C, dst_dtype=dtype, options=options).fired
    _check(chain, dtype, options, bound=1)


def _affine_after_bias(scale: object) -> list[ChainOp]:
    """conv dequantize · w + b, then an affine block ·v + c (PP-LCNetV3's after a conv)."""
    return [Scale.of(np.linspace(0.0005, 0.002, C)), Shift.of(np.linspace(-2, 2, C)),
            Scale.of(scale), Shift.of(1.9782163)]


def _f32_mismatches(chain: list[ChainOp], options: ComposerOptions) -> int:
    acc = np.random.default_rng(0).integers(-20000, 20000, size=(4, C, 6, 6)).astype(np.int32)
    ref = apply_chain(acc, chain, {}, channel_axis=1, dst_dtype=DType.F32)
    got = apply_composed(acc, compose(chain, channels=C, dst_dtype=DType.F32, options=options),
                         {}, channel_axis=1)
    return int(np.count_nonzero(ref != got))


def test_per_tensor_multiply_after_the_bias_stays_after_it() -> None:
    chain = _affine_after_bias(0.5936148)
    out = compose(chain, channels=C, dst_dtype=DType.F32)
    assert out.fired.count("mul_to_weight_scales") == 1  # the dequantize's scale only
    assert np.array_equal(out.bias, np.linspace(-2, 2, C).astype(np.float32))
    assert out.post_ops == [Eltwise("linear", pytest.approx(0.5936148),
                                    pytest.approx(1.9782163))]
    folded = compose(chain, channels=C, dst_dtype=DType.F32,
                     options=ComposerOptions().with_("scale_past_bias"))
    assert folded.post_ops == [] and folded.fired.count("mul_to_weight_scales") == 2
    # in the model's order: one float32 rounding per op, bit for bit (without the multiply-add
    # merge); with it, closer to that order than folded across the bias
    unmerged = ComposerOptions().without("fold_into_linear")
    assert _f32_mismatches(chain, unmerged) == 0
    assert 0 < _f32_mismatches(chain, ComposerOptions()) < _f32_mismatches(
        chain, ComposerOptions().with_("scale_past_bias"))


def test_per_channel_multiply_after_the_bias_still_folds() -> None:
    out = compose(_affine_after_bias(np.linspace(0.5, 1.5, C)), channels=C,
                  dst_dtype=DType.F32)
    assert out.fired.count("mul_to_weight_scales") == 2
    assert not any(isinstance(p, Binary) and p.alg == "mul" for p in out.post_ops)
