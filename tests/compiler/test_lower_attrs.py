"""compiler/lower/attrs.py: the binary post-op operand's shape.

A constant operand that is one float32 value — given once, or per channel with every value
the same bit pattern — is oneDNN's scalar broadcast (a one-element tensor): the same products,
and a 1x1-image convolution with a per-channel operand runs on ``ref:any`` where the scalar one
runs jit (NNCF's squeeze-excitation FC, SSDLite's extra blocks). A weight scale or bias of
one value written as post-ops (a gate's ``x + 3`` folded into its bias) is one eltwise linear,
not a binary post-op."""

from __future__ import annotations

import numpy as np

from qfuse.compiler.lower.attrs import post_op_operand, scale_bias_post_ops
from qfuse.ir.postops import Binary, Composed, Eltwise
from qfuse.ir.types import DType

F32 = np.float32


def test_one_value_is_a_scalar() -> None:
    assert post_op_operand(np.array([0.5], F32), 4, 1, 8).shape == (1, 1, 1, 1)


def test_equal_per_channel_values_are_a_scalar() -> None:
    got = post_op_operand(np.full(128, 3.1875e6, F32), 4, 1, 128)
    assert got.shape == (1, 1, 1, 1) and got.item() == F32(3.1875e6)


def test_different_values_stay_per_channel() -> None:
    values = np.linspace(1, 2, 8).astype(F32)
    got = post_op_operand(values, 4, 1, 8)
    assert got.shape == (1, 8, 1, 1)
    np.testing.assert_array_equal(got.ravel(), values)


def test_signed_zeros_are_not_one_value() -> None:
    """0.0 and -0.0 compare equal but multiply to different signs: not merged."""
    got = post_op_operand(np.array([0.0, -0.0, 0.0], F32), 3, 1, 3)
    assert got.shape == (1, 3, 1)


def test_one_valued_bias_and_scales_are_eltwise_linear() -> None:
    ops = scale_bias_post_ops(Composed(16, DType.F32, wei_scales=np.full(16, 0.25, F32),
                                       bias=np.full(16, 3.0000009, F32)))
    assert ops == [Eltwise("linear", 0.25, 0.0), Eltwise("linear", 1.0, float(F32(3.0000009)))]
    bias = np.linspace(-1, 1, 16).astype(F32)
    ops = scale_bias_post_ops(Composed(16, DType.F32, bias=bias))
    assert len(ops) == 1 and isinstance(ops[0], Binary) and ops[0].alg == "add"
    signed = scale_bias_post_ops(Composed(2, DType.F32, bias=np.array([0.0, -0.0], F32)))
    assert isinstance(signed[0], Binary)
