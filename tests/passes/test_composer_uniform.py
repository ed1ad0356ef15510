"""uniform_values: a per-channel operand holding one float32 value everywhere is applied as
that one value (an eltwise, a scalar binary, the store's clip and zero point) without moving
any rounding: every composed chain here is compared bit for bit with the chain op by op and
with the composer that keeps the operand per channel."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.compiler.lower.attrs import post_op_operand
from qfuse.ir.chain import Act, Activation, ChainOp, Quantize, Scale, Shift
from qfuse.ir.postops import Binary, ComposerOptions, Eltwise
from qfuse.ir.types import DType, OnnxQuantize, QuantParams
from qfuse.passes.composer import compose
from qfuse.runtime.reference.chain import apply_chain, apply_composed

C = 8
OFF = ComposerOptions().without("uniform_values")


def per_channel_q(scales: np.ndarray, zps: np.ndarray) -> Quantize:
    """ONNX QuantizeLinear to u8, per channel (axis 1)."""
    params = QuantParams.make(scales, zps, axis=1)
    return Quantize(tuple(scales * (0 - zps)), tuple(scales * (255 - zps)), (0.0,), (255.0,),
                    256, DType.U8, onnx=OnnxQuantize(DType.U8, params))


def conv_hardswish_q(scales: np.ndarray, zps: np.ndarray) -> list[ChainOp]:
    """conv dequantize · w + b, HardSwish, then a per-channel quantize (NNCF's quantizer of a
    depthwise input, its s8 zero points 0 moved to u8: +128 in every channel)."""
    return [Scale.of(np.linspace(3e-4, 2e-3, C)), Shift.of(np.linspace(-4, 5, C)),
            Activation(Act.HARD_SWISH, 1 / 6, 0.5), per_channel_q(scales, zps)]


ACC = np.random.default_rng(1).integers(-30000, 30000, (2, C, 16, 16)).astype(np.int32)


def _outputs(chain: list[ChainOp], dtype: DType, options: ComposerOptions) -> np.ndarray:
    out = compose(chain, channels=C, dst_dtype=dtype, options=options)
    return apply_composed(ACC, out, {}, channel_axis=1)


def _reference(chain: list[ChainOp], dtype: DType) -> np.ndarray:
    return apply_chain(ACC, chain, {}, channel_axis=1, dst_dtype=dtype)


def test_uniform_zero_point_goes_to_the_store() -> None:
    chain = conv_hardswish_q(np.linspace(0.005, 0.28, C), np.full(C, 128))
    on, off = (compose(chain, channels=C, dst_dtype=DType.U8, options=o)
               for o in (ComposerOptions(), OFF))
    assert on.dst_zero_point == 128 and "uniform_values" in on.fired
    assert not any(isinstance(p, Binary) and p.alg in ("add", "max", "min")
                   for p in on.post_ops)
    assert [type(p).__name__ for p in on.post_ops] == ["Eltwise", "Binary", "Eltwise"]
    assert len(off.post_ops) == len(on.post_ops) + 2  # + binary add 128, + clip
    assert off.dst_zero_point == 0 and "uniform_values" not in off.fired
    got = _outputs(chain, DType.U8, ComposerOptions())
    assert np.array_equal(got, _outputs(chain, DType.U8, OFF))
    assert np.array_equal(got, _reference(chain, DType.U8))
    assert len(np.unique(got)) > 100  # the chain spans the range, ties included


def test_uniform_divisor_is_one_scalar() -> None:
    """The divisor of a per-channel quantize with one scale stays a binary_div (ONNX's x/s),
    whose operand the lowering makes one scalar (attrs.post_op_operand)."""
    chain = conv_hardswish_q(np.full(C, 0.0396706), np.arange(120, 120 + C))
    on = compose(chain, channels=C, dst_dtype=DType.U8)
    div = next(p for p in on.post_ops if isinstance(p, Binary) and p.alg == "div")
    operand = post_op_operand(div.values, 4, 1, C)
    assert operand.shape == (1, 1, 1, 1) and operand.item() == np.float32(0.0396706)
    assert np.array_equal(_outputs(chain, DType.U8, ComposerOptions()),
                          _outputs(chain, DType.U8, OFF))


def test_uniform_multiply_and_add_stay_two_roundings() -> None:
    """After a post-op, ·v and +c become eltwise linears, each rounding once as before:
    not merged into one linear(v, c) as per-tensor ones are (fold_into_linear)."""
    chain = [Activation(Act.TANH), Scale.of(np.full(C, 0.7)), Shift.of(np.full(C, 0.3))]
    on = compose(chain, channels=C, dst_dtype=DType.F32)
    assert on.post_ops == [Eltwise("tanh"), Eltwise("linear", pytest.approx(0.7), 0.0),
                           Eltwise("linear", 1.0, pytest.approx(0.3))]
    assert on.fired.count("uniform_values") == 2
    per_tensor = compose([Activation(Act.TANH), Scale.of(0.7), Shift.of(0.3)], channels=C,
                         dst_dtype=DType.F32)
    assert len(per_tensor.post_ops) == 2  # the merge the uniform operands do not get
    got = _outputs(chain, DType.F32, ComposerOptions())
    assert np.array_equal(got, _outputs(chain, DType.F32, OFF))
    assert np.array_equal(got, _reference(chain, DType.F32))


def test_folds_still_see_per_channel_operands() -> None:
    """A uniform multiply after the bias folds into the weight scales as a per-channel one
    does (a per-tensor one stays after the bias): the same roundings as without the option."""
    chain = [Scale.of(np.linspace(5e-4, 2e-3, C)), Shift.of(np.linspace(-2, 2, C)),
             Scale.of(np.full(C, 0.5936148)), Shift.of(np.full(C, 1.9782163))]
    on = compose(chain, channels=C, dst_dtype=DType.F32)
    off = compose(chain, channels=C, dst_dtype=DType.F32, options=OFF)
    assert on.fired.count("mul_to_weight_scales") == 2
    assert np.array_equal(on.wei_scales, off.wei_scales)
    assert np.array_equal(on.bias, off.bias)


def test_signed_zeros_are_not_one_value() -> None:
    values = np.zeros(C, np.float32)
    values[3] = -0.0
    out = compose([Activation(Act.TANH), Shift.of(values + 0.0), Shift.of(values)],
                  channels=C, dst_dtype=DType.F32, options=ComposerOptions().without(
                      "skip_identity"))
    assert out.post_ops[1] == Eltwise("linear", 1.0, 0.0)
    assert isinstance(out.post_ops[2], Binary) and out.post_ops[2].alg == "add"
