"""Add, LeakyRelu and PRelu in each framework's integer arithmetic.

Add, ``S_y (y - Z_y) = S_a (a - Z_a) + S_b (b - Z_b)``:

- tflite (kernels/add.cc ``Prepare`` + reference_ops ``AddElementwise``), 8-bit path::

      twice = 2·max(S_a, S_b);  left_shift = 20
      (m_a, e_a) = QuantizeMultiplier(S_a / twice)         double; e_a <= 0
      (m_b, e_b) = QuantizeMultiplier(S_b / twice)
      (m_y, e_y) = QuantizeMultiplier(twice / (2**20·S_y))
      a' = MBQM((a - Z_a)·2**20, m_a, e_a);  b' likewise  (MBQM = RoundingDivideByPOT(SRDHM))
      y  = clamp(MBQM(a' + b', m_y, e_y) + Z_y, act_min, act_max)

- caffe2: the same arithmetic — caffe2/operators/quantized/int8_add_op.h is TFLite's kernel
  (SNPS-Caffe QUANTIZED_OP.md pairs Caffe2 with its own EltwiseSum; both are this code).
- onnxruntime: QLinearAdd on x86 runs MLAS's AVX2 kernel (qladd_avx2.cpp), float32 with FMA::

      r_a = f32(S_a / S_y);  r_b = f32(S_b / S_y)
      fixed = f32(Z_y) - f32(r_a·Z_a + r_b·Z_b)            (each step float32)
      v = fma(a, r_a, fma(b, r_b, fixed));  y = saturate(rint(v))
  (a scalar input is folded into ``fixed`` with a separate multiply and add). Broadcasts other
  than scalar / same shape run MLAS per span and are not emulated (float path).
- onednn: a binary add with source scales, then the dst formula
  ``x = f32(S_a)·f32(a - Z_a) + f32(S_b)·f32(b - Z_b)``, post-ops, ``rint(x·f32(1/S_y) + Z_y)``.
- tpu-mlir (TPU-MLIR quantization chapter): asymmetric ``requant(dequant a + dequant b)`` (= ONNX float
  semantics); symmetric (all zero points 0) ``(a·m_a + b·m_b)_{i16} >> r`` with 8-bit
  multipliers (``runtime.numerics.add_int16``).

LeakyRelu:

- tflite (activations.cc ``LeakyReluPrepare``, reference_ops ``QuantizeLeakyRelu``)::

      m_id = QuantizeMultiplier(f32(S_x / S_y));  m_al = QuantizeMultiplier(f32(S_x·alpha / S_y))
      d = x - Z_x;  y = Z_y + MBQM(d, d >= 0 ? m_id : m_al)
  (the ratios are float32 products widened to double, as the source writes them).
- tpu-mlir (TPU-MLIR quantization chapter), precondition ``S_x == S_y``: ``y = d + Z_y`` for d >= 0, else
  ``(m·d) >> r + Z_y`` with an 8-bit ``m / 2**r ~ alpha``.

PRelu (slope a quantized constant ``DQ(alpha_q)``):

- tflite (``PreluPrepare``, reference_ops ``BroadcastPrelu4DSlow``), alpha per tensor::

      m_1 = QuantizeMultiplier(f32(S_x / S_y));  m_2 = QuantizeMultiplier(f32(S_x·S_al / S_y))
      y = Z_y + (d >= 0 ? MBQM(d, m_1) : MBQM(d·(alpha_q - Z_al), m_2))
- tpu-mlir (TPU-MLIR quantization chapter), ``S_x == S_y`` and ``Z_al == 0``: ``(q_alpha[c]·m·d) >> r + Z_y`` with one
  8-bit ``m / 2**r ~ S_al``.
"""

from __future__ import annotations

import numpy as np

from qfuse.ir.types import DType
from qfuse.runtime.emulate.kernel import (
    Prepared,
    Reader,
    activation_bounds,
    clamp_out,
    float_activation,
    ort_keeps_activation,
)
from qfuse.runtime.emulate.patterns import Decline, Match
from qfuse.runtime.numerics import (
    add_float,
    add_int16,
    add_multipliers,
    leaky_relu_int,
    multiply_by_quantized_multiplier,
    prelu_int,
    quantize_multiplier,
    saturate,
    tpu_multiplier_rshift,
)

__all__ = [
    "add_onednn",
    "add_onnxruntime",
    "add_tflite",
    "add_tpu_mlir",
    "fma_f32",
    "leaky_relu_tflite",
    "leaky_relu_tpu_mlir",
    "prelu_tflite",
    "prelu_tpu_mlir",
]

F32 = np.float32
_EIGHT_BIT = (DType.U8, DType.S8)


def _per_tensor_8bit(m: Match) -> Decline | None:
    for o in m.operands:
        if not o.per_tensor:
            return Decline(f"'{o.value}' is quantized per axis")
        if o.dtype not in _EIGHT_BIT:
            return Decline(f"'{o.value}' is {o.dtype.name}, not an 8-bit integer")
    return None


def _qm(real: float) -> tuple[int, int]:
    q, shift = quantize_multiplier(np.float64(real))
    return int(q), int(shift)


def _mbqm(x: np.ndarray, qm: tuple[int, int]) -> np.ndarray:
    """TFLite MultiplyByQuantizedMultiplier, two roundings (the default build)."""
    return multiply_by_quantized_multiplier(x, qm[0], qm[1])


# ---------------------------------------------------------------------------------------- Add
def add_tflite(m: Match) -> Prepared | Decline:
    bad = _per_tensor_8bit(m)
    if bad:
        return bad
    a, b = m.operands
    twice = 2.0 * float(max(a.s, b.s))
    qa, qb = _qm(float(a.s) / twice), _qm(float(b.s) / twice)
    qy = _qm(twice / float(F32(2**20) * m.out.scale))
    if max(qa[1], qb[1], qy[1]) > 0:
        return Decline("a multiplier of TFLite's add is >= 1 (QuantizeMultiplierSmallerThanOne)")
    bounds = activation_bounds(m, half_away=True)

    def run(read: Reader) -> np.ndarray:
        sa = _mbqm((read(a.value).astype(np.int64) - a.zp) << 20, qa)
        sb = _mbqm((read(b.value).astype(np.int64) - b.zp) << 20, qb)
        return clamp_out(_mbqm(sa + sb, qy) + m.out.zero_point, m, bounds)

    return Prepared("gemmlowp add (left shift 20, three multipliers)", run)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a·b + c`` rounded once (an FMA), exactly.

    ``a·b`` of two float32 is exact in float64; the float64 sum ``s`` may round, and its error
    ``e`` (TwoSum) decides the float32 rounding when ``s`` lands exactly between two float32.
    """
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = np.asarray(c, np.float64)
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    r = s.astype(F32)
    r64 = r.astype(np.float64)
    toward = np.nextafter(r, np.where(s > r64, F32(np.inf), F32(-np.inf))).astype(np.float64)
    tie = (s != r64) & (np.abs(s - r64) == np.abs(toward - r64) / 2) & (e != 0)
    away = tie & ((e > 0) == (s > r64))
    return np.where(away, toward, r64).astype(F32)


def add_onnxruntime(m: Match) -> Prepared | Decline:
    bad = _per_tensor_8bit(m) or ort_keeps_activation(m)
    if bad:
        return bad
    a, b = m.operands
    scalar_a, scalar_b = int(np.prod(a.shape)) == 1, int(np.prod(b.shape)) == 1
    if a.shape != b.shape and not (scalar_a or scalar_b):
        return Decline("QLinearAdd broadcasting other than scalar / same shape is not emulated")
    if a.dtype != b.dtype or a.dtype != m.out.dtype:
        return Decline("QLinearAdd needs inputs and output of one 8-bit type")
    r_a, r_b = F32(a.s / m.out.scale), F32(b.s / m.out.scale)
    fixed = F32(F32(m.out.zero_point) - F32(F32(r_a * F32(a.zp)) + F32(r_b * F32(b.zp))))
    bounds = activation_bounds(m)

    def run(read: Reader) -> np.ndarray:
        va, vb = read(a.value).astype(F32), read(b.value).astype(F32)
        base = np.full((), fixed, F32)
        if scalar_a:
            base, va = F32(base + F32(va.reshape(()) * r_a)), None
        elif scalar_b and not scalar_a:
            base, vb = F32(base + F32(vb.reshape(()) * r_b)), None
        v = base if vb is None else fma_f32(vb, np.full_like(vb, r_b), base)
        if va is not None:
            v = fma_f32(va, np.full_like(va, r_a), v)
        shape = np.broadcast_shapes(a.shape, b.shape)
        return clamp_out(np.broadcast_to(saturate(np.rint(v), np.int32), shape), m, bounds)

    return Prepared("MLAS QLinearAdd AVX2 (float32 ratios, FMA, rint)", run)


def add_onednn(m: Match) -> Prepared | Decline:
    bad = _per_tensor_8bit(m)
    if bad:
        return bad
    a, b = m.operands
    post_op = float_activation(m)
    inv = F32(1) / m.out.scale

    def run(read: Reader) -> np.ndarray:
        x = (a.s * (read(a.value).astype(np.int64) - a.zp).astype(F32)
             + b.s * (read(b.value).astype(np.int64) - b.zp).astype(F32)).astype(F32)
        if post_op is not None:
            x = post_op(x)
        y = np.rint((x * inv).astype(F32) + F32(m.out.zero_point))
        return saturate(y, m.out.dtype.np, nan=0 if m.out.dtype is DType.U8 else 127)

    return Prepared("onednn binary add (f32 src scales, dst rint(x/s + zp))", run)


def add_tpu_mlir(m: Match) -> Prepared | Decline:
    bad = _per_tensor_8bit(m)
    if bad:
        return bad
    a, b = m.operands
    bounds = activation_bounds(m)
    symmetric = a.zp == b.zp == m.out.zero_point == 0 and m.out.dtype is DType.S8
    if symmetric:
        try:
            ma, mb, r = add_multipliers(float(a.s), float(b.s), float(m.out.scale), bits=8)
        except ValueError as exc:
            return Decline(str(exc))

        def run_sym(read: Reader) -> np.ndarray:
            y = add_int16(read(a.value), read(b.value), ma, mb, r, np.int32)
            return clamp_out(y, m, bounds)

        return Prepared(f"tpu-mlir symmetric int16 add (m_a={ma}, m_b={mb}, r={r})", run_sym)

    def run(read: Reader) -> np.ndarray:
        y = add_float(read(a.value), a.s, a.zp, read(b.value), b.s, b.zp, m.out.scale,
                      m.out.zero_point, m.out.dtype.np)
        return clamp_out(y, m, bounds)

    return Prepared("tpu-mlir asymmetric requant(dequant a + dequant b)", run)


# ---------------------------------------------------------------------------------- LeakyRelu
def leaky_relu_tflite(m: Match) -> Prepared | Decline:
    bad = _per_tensor_8bit(m)
    if bad:
        return bad
    (x,) = m.operands
    alpha = F32(m.op.attrs.alpha)
    q_id = _qm(float(F32(x.s / m.out.scale)))
    q_al = _qm(float(F32(F32(x.s * alpha) / m.out.scale)))
    bounds = m.out.range

    def run(read: Reader) -> np.ndarray:
        d = read(x.value).astype(np.int64) - x.zp
        y = np.where(d >= 0, _mbqm(d, q_id), _mbqm(d, q_al)) + m.out.zero_point
        return clamp_out(y, m, bounds)

    return Prepared("tflite QuantizeLeakyRelu (identity and alpha multipliers)", run)


def _same_scale(m: Match) -> Decline | None:
    x = m.operands[0]
    if x.s != m.out.scale:
        return Decline(f"TPU-MLIR's integer form needs S_x == S_y (got {x.s:.6g} and "
                       f"{m.out.scale:.6g})")
    return None


def leaky_relu_tpu_mlir(m: Match) -> Prepared | Decline:
    bad = _per_tensor_8bit(m) or _same_scale(m)
    if bad:
        return bad
    (x,) = m.operands
    mult, r = tpu_multiplier_rshift(m.op.attrs.alpha, bits=8, method="search")
    mult, r = int(mult), int(r)

    def run(read: Reader) -> np.ndarray:
        return leaky_relu_int(read(x.value), x.zp, m.out.zero_point, mult, r,
                              m.out.dtype.np)

    return Prepared(f"tpu-mlir leaky relu (m={mult}, r={r})", run)


# -------------------------------------------------------------------------------------- PRelu
def prelu_tflite(m: Match) -> Prepared | Decline:
    bad = _per_tensor_8bit(m)
    if bad:
        return bad
    x, al = m.operands
    q1 = _qm(float(F32(x.s / m.out.scale)))
    q2 = _qm(float(F32(F32(x.s * al.s) / m.out.scale)))
    bounds = m.out.range

    def run(read: Reader) -> np.ndarray:
        d = read(x.value).astype(np.int64) - x.zp
        slope = read(al.value).astype(np.int64) - al.zp
        y = np.where(d >= 0, _mbqm(d, q1), _mbqm(d * slope, q2)) + m.out.zero_point
        return clamp_out(y, m, bounds)

    return Prepared("tflite Prelu (two multipliers)", run)


def prelu_tpu_mlir(m: Match) -> Prepared | Decline:
    bad = _per_tensor_8bit(m) or _same_scale(m)
    if bad:
        return bad
    x, al = m.operands
    if al.zp != 0 or al.data is None:
        return Decline("TPU-MLIR's PRelu needs a constant slope with zero point 0")
    channels = x.shape[1] if len(x.shape) > 1 else 1
    if al.data.size not in (1, channels):
        return Decline(f"slope of {al.data.size} values is not per channel ({channels})")
    q_alpha = al.data.astype(np.int64).reshape(-1)
    mult, r = tpu_multiplier_rshift(float(al.s), bits=8, method="search")
    mult, r = int(mult), int(r)

    def run(read: Reader) -> np.ndarray:
        return prelu_int(read(x.value), q_alpha, x.zp, m.out.zero_point, mult, r,
                         m.out.dtype.np)

    return Prepared(f"tpu-mlir prelu (m={mult}, r={r})", run)
