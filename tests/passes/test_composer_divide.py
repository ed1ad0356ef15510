"""The composer's ONNX division (``onnx_divide``) and ``clip_shift``, bit-exact on near-ties.

A quantization written as ONNX Q/DQ means ``saturate(rint(x / s) + zp)``, a float32 division
(runtime/reference/chain.apply_chain). With ``onnx_divide`` the composed attributes divide too
(a binary_div post-op), so oneDNN's model of them (apply_composed) equals the meaning bit for
bit wherever the value before the division is computed the same way — here a conv chain
``acc·w + b`` with the dequantization scale as the weight scale, swept over accumulators on,
and one either side of, every tie ``(k + 1/2)·s``, for scales whose ties are exact in float32
(integers, powers of two) and for arbitrary ones. ``clip_shift`` keeps an inner Q → DQ's
``(q − zp)·s`` one float32 rounding, so a chain with an inner quantization is bit-exact too.
Without the two options (``x·f32(1/s)``, folded) the same sweep differs: the test can fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.ir.chain import Act, Activation, ChainOp, Quantize, Scale, Shift
from qfuse.ir.postops import Binary, ComposerOptions
from qfuse.ir.types import DType, OnnxQuantize, QuantParams
from qfuse.passes.composer import compose
from qfuse.runtime.reference.chain import apply_chain, apply_composed

F32 = np.float32
C = 4
SCALES = [6.0, 0.25, 2.0 / 255, 0.1, 0.0396706, 3.0e-3, 0.8125]


def onnx_q(scale: float, zp: int, dtype: DType = DType.U8) -> Quantize:
    lo, hi = dtype.range
    return Quantize((scale * (lo - zp),), (scale * (hi - zp),), (float(lo),), (float(hi),),
                    256, dtype, scale=scale,
                    onnx=OnnxQuantize(dtype, QuantParams.make(scale, zp)))


def _accumulators(w: F32, s: F32, zp: int) -> np.ndarray:
    """acc with acc·w on, just below and just above the ties (k + 1/2)·s of every level."""
    k = np.arange(-zp - 2, 256 - zp + 2, dtype=np.float64)
    centre = np.rint((k + 0.5) * float(s) / float(w))
    acc = (centre[:, None] + np.arange(-2, 3)[None, :]).ravel()
    acc = acc[np.abs(acc) < 2**24]
    n = -(-acc.size // C) * C
    return np.resize(acc, n).astype(np.int32).reshape(1, C, -1, 1)


def _sweep(chain_of, options: ComposerOptions) -> tuple[int, int]:
    """(elements differing from the meaning, elements) over SCALES and zero points."""
    differ = total = 0
    for s in SCALES:
        for zp in (0, 128, 131):
            for w in (F32(1.0), F32(s) / F32(64), F32(0.0123)):
                chain = chain_of(float(w), s, zp)
                acc = _accumulators(F32(w), F32(s), zp)
                want = apply_chain(acc, chain, {}, channel_axis=1, dst_dtype=DType.U8)
                composed = compose(chain, channels=C, dst_dtype=DType.U8, options=options)
                got = apply_composed(acc, composed, {}, channel_axis=1)
                differ += int(np.count_nonzero(got != want))
                total += got.size
    return differ, total


def _conv(w: float, s: float, zp: int) -> list[ChainOp]:
    return [Scale.of(w), Shift.of(0.0), onnx_q(s, zp)]


def _inner(w: float, s: float, zp: int) -> list[ChainOp]:
    """conv → Q(s, zp) → DQ → ReLU → Q(s/2, 7): an inner quantization kept in the kernel."""
    return [Scale.of(w), onnx_q(s, zp), Shift.of(-zp), Scale.of(s), Activation(Act.RELU),
            onnx_q(s / 2, 7)]


@pytest.mark.parametrize("chain_of", [_conv, _inner], ids=["conv", "inner_quantize"])
def test_division_is_bit_exact_on_near_ties(chain_of) -> None:
    differ, total = _sweep(chain_of, ComposerOptions())
    assert total > 10_000 and differ == 0
    before, _ = _sweep(chain_of, ComposerOptions().without("onnx_divide", "clip_shift"))
    assert before > 0


def test_golden_division_and_clip_shift() -> None:
    out = compose(_inner(0.01, 0.04, 103), channels=C, dst_dtype=DType.U8)
    assert out.post_ops[0] == Binary("div", np.array([0.04], F32))
    assert [type(p).__name__ for p in out.post_ops] == [
        "Binary", "Eltwise", "Eltwise", "Eltwise", "Eltwise", "Binary", "Eltwise"]
    clip, dq = out.post_ops[2], out.post_ops[3]
    assert (clip.alg, clip.alpha, clip.beta) == ("clip", -103.0, 152.0)
    assert (dq.alg, dq.alpha, dq.beta) == ("linear", float(F32(0.04)), 0.0)
    assert out.dst_zero_point == 7 and out.rounding() == "round(x/s)+zp"
    assert {"onnx_divide", "clip_shift"} <= set(out.fired)
    old = compose(_inner(0.01, 0.04, 103), channels=C, dst_dtype=DType.U8,
                  options=ComposerOptions().without("onnx_divide", "clip_shift"))
    assert old.rounding() == "round(x·(1/s))+zp"
