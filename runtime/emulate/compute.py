"""Conv / ConvTranspose / MatMul / Gemm in each framework's integer arithmetic.

Every framework computes the same exact accumulator (VNNI / AMX and the reference kernels do;
see tests/runtime/test_numerics_ort.py on int16 saturation without VNNI)::

    acc[oc] = Σ (x_q - zp_x) · (w_q[oc] - zp_w[oc])          int64 here, wraps like int32
    padding taps contribute 0 (the padded *real* value is 0, i.e. x_q = zp_x)

and differs only in how it turns ``acc`` (+ the int32 bias, at scale ``s_x·s_w[oc]``) into the
output (``runtime.numerics.schemes`` has each formula and its source):

- tflite: ``requantize(scheme=tflite_scheme(per_channel, kind))`` — QUANTIZED_OP.md's table: D1 / D2 /
  F2 by per-tensor vs per-channel weights and conv kind (depthwise when group == C_in == C_out
  > 1, pointwise for 1x1 kernels with group 1, else regular; ConvTranspose, MatMul and Gemm
  (TFLite's TransposeConv / FullyConnected / BatchMatMul share the conv's multiplier code) are
  "regular").
- onnxruntime: ``MlasRequantizeOutput`` (QLinearConv, QLinearMatMul, QGemm). ORT's CPU
  provider does not fuse DQ -> ConvTranspose -> Q, nor a conv followed by a Relu / Clip it
  cannot drop (``ort_keeps_activation``): those run in float, and so does the emulation.
- caffe2: F2 (SNPS-Caffe QUANTIZED_OP.md).
- onednn: ``f32(acc)·f32(s_x·s_w) + bias_f32``, the Relu / Clip as an f32 eltwise post-op, then
  ``saturate(rint(x·f32(1/s_y) + zp_y))``; ``bias_f32`` is the DequantizeLinear of the int32
  bias (``f32(b)·s_b``), as qfuse's bias fusion produces it.
- tpu-mlir: multiplier + rshift (``get_scale_and_shift``), ``(acc + bias)·m >> r``, half up.

Preconditions (a kernel declines otherwise, and the node runs on the float path): x quantized
per tensor; w per tensor or per *output* channel (Conv: axis 0; ConvTranspose: axis 1 with
group 1; MatMul: the last axis; Gemm: axis 0 with transB, else 1); the bias an int32 constant
with zero point 0 and scale ``s_x·s_w`` (relative 1e-6), one value per output channel; Gemm
with alpha = beta = 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qfuse.ir.ops import Op
from qfuse.ir.types import DType
from qfuse.runtime.emulate.kernel import (
    Prepared,
    Reader,
    activation_bounds,
    clamp_out,
    float_activation,
    ort_keeps_activation,
)
from qfuse.runtime.emulate.patterns import Decline, Match, Operand
from qfuse.runtime.numerics import (
    Scheme,
    channel_broadcast,
    dequantize,
    requantize,
    requantize_onednn,
    tflite_scheme,
)
from qfuse.runtime.reference import IMPLS

__all__ = ["caffe2", "onednn", "onnxruntime", "tflite", "tpu_mlir"]

_BIAS_RTOL = 1e-6


@dataclass(frozen=True)
class _Setup:
    """What every framework needs: the accumulator and the scales, checked."""

    accumulate: Callable[[Reader], np.ndarray]
    s_x: np.float32
    s_w: np.ndarray  # 0-D, or 1-D per output channel
    axis: int  # output channel axis of the accumulator
    bias: Operand | None
    kind: str  # conv kind for TFLite: regular / depthwise / pointwise

    @property
    def per_channel(self) -> bool:
        return self.s_w.size > 1

    def bias_i32(self) -> np.ndarray | None:
        return None if self.bias is None else _bias_vector(self.bias)


def _bias_vector(b: Operand) -> np.ndarray:
    assert b.data is not None
    return b.data.astype(np.int64).reshape(-1)


def _weight_axis(m: Match) -> int:
    """The weight axis that indexes output channels."""
    op, w = m.op, m.operands[1]
    if op.op is Op.CONV:
        return 0
    if op.op is Op.CONV_TRANSPOSE:
        return 1
    if op.op is Op.GEMM:
        return 0 if op.attrs.trans_b else 1
    return len(w.shape) - 1  # MatMul: [..., K, N]


def _out_channels(m: Match) -> int:
    op, w = m.op, m.operands[1]
    if op.op is Op.CONV_TRANSPOSE:
        return w.shape[1] * op.attrs.group
    return w.shape[_weight_axis(m)]


def _conv_kind(m: Match) -> str:
    op, x, w = m.op, m.operands[0], m.operands[1]
    if op.op is not Op.CONV:
        return "regular"
    group, c_in, c_out = op.attrs.group, x.shape[1], w.shape[0]
    if group > 1 and group == c_in == c_out:
        return "depthwise"
    if group == 1 and all(k == 1 for k in op.attrs.kernel_shape):
        return "pointwise"
    return "regular"


def _setup(m: Match) -> _Setup | Decline:
    x, w = m.operands
    op = m.op
    if not x.per_tensor:
        return Decline(f"input '{x.value}' is quantized per axis")
    for o in (x, w):
        if o.dtype not in (DType.U8, DType.S8):
            return Decline(f"'{o.value}' is {o.dtype.name}, not an 8-bit integer")
    if op.op is Op.GEMM:
        attrs = op.attrs
        if attrs.alpha != 1.0 or (m.bias is not None and attrs.beta != 1.0):
            return Decline(f"Gemm alpha={attrs.alpha}, beta={attrs.beta} (want 1)")
        if attrs.trans_a:
            return Decline("Gemm with transA")
    along_outputs = w.axis == _weight_axis(m) and not (
        op.op is Op.CONV_TRANSPOSE and op.attrs.group != 1)
    if not w.per_tensor and not along_outputs:
        return Decline(f"weights '{w.value}' are quantized along axis {w.axis}, not along the "
                       f"output channels")
    s_w = w.scale if not w.per_tensor else w.scale.reshape(())
    if m.bias is not None:
        reason = _check_bias(m.bias, x.s, s_w, _out_channels(m))
        if reason:
            return Decline(reason)

    def accumulate(read: Reader) -> np.ndarray:
        xi = read(x.value).astype(np.int64) - x.zp
        wq = read(w.value)
        zw = w.zero_point if w.per_tensor else channel_broadcast(w.zero_point, wq.ndim, w.axis)
        wi = wq.astype(np.int64) - zw
        if op.op in (Op.CONV, Op.CONV_TRANSPOSE):
            return IMPLS[op.op](op, [xi, wi])[0].astype(np.int64)
        if op.op is Op.GEMM:
            return xi @ (wi.T if op.attrs.trans_b else wi)
        return np.matmul(xi, wi)

    out_axis = 1 if op.op in (Op.CONV, Op.CONV_TRANSPOSE) else -1
    return _Setup(accumulate, x.s, s_w, out_axis, m.bias, _conv_kind(m))


def _check_bias(b: Operand, s_x: np.float32, s_w: np.ndarray, channels: int) -> str | None:
    """The int8 kernels add the int32 bias to the accumulator: it must be at its scale."""
    if b.dtype is not DType.S32 or b.data is None:
        return f"bias '{b.value}' is not an int32 constant"
    if np.any(b.zero_point != 0):
        return f"bias '{b.value}' has a non-zero zero point"
    if b.data.size != channels:
        return f"bias '{b.value}' has {b.data.size} values for {channels} output channels"
    expected = np.broadcast_to((s_x * s_w).astype(np.float64), (channels,))
    got = np.broadcast_to(b.scale.astype(np.float64), (channels,))
    if np.any(np.abs(got - expected) > _BIAS_RTOL * expected):
        return f"bias '{b.value}' scale is not s_x·s_w (as the int8 kernels assume)"
    return None


def _prepare(m: Match, run: Callable[[_Setup, np.ndarray], np.ndarray],
             describe: Callable[[_Setup], str]) -> Prepared | Decline:
    setup = _setup(m)
    if isinstance(setup, Decline):
        return setup
    return Prepared(describe(setup), lambda read: run(setup, setup.accumulate(read)))


def _weights(s: _Setup) -> str:
    return "per-channel" if s.per_channel else "per-tensor"


def tflite(m: Match) -> Prepared | Decline:
    bounds = activation_bounds(m, half_away=True)

    def scheme(s: _Setup) -> Scheme:
        return tflite_scheme(s.per_channel, s.kind)  # type: ignore[arg-type]

    def run(s: _Setup, acc: np.ndarray) -> np.ndarray:
        y = requantize(acc, scheme=scheme(s), s_in=s.s_x, s_w=s.s_w, s_out=m.out.scale,
                       zp_out=m.out.zero_point, dtype=m.out.dtype.np, bias=s.bias_i32(),
                       axis=s.axis)
        return clamp_out(y, m, bounds)

    return _prepare(m, run, lambda s: f"tflite {scheme(s).value.split('_')[1].upper()} "
                                      f"({s.kind}, {_weights(s)} weights)")


def _simple(scheme: Scheme, label: str) -> Callable[[Match], Prepared | Decline]:
    def kernel(m: Match) -> Prepared | Decline:
        if scheme is Scheme.ONNXRUNTIME:
            if m.op.op is Op.CONV_TRANSPOSE:
                return Decline("ONNX Runtime's CPU provider has no QDQ ConvTranspose fusion; "
                               "it runs DQ -> ConvTranspose -> Q in float")
            kept = ort_keeps_activation(m)
            if kept:
                return kept
        bounds = activation_bounds(m)

        def run(s: _Setup, acc: np.ndarray) -> np.ndarray:
            y = requantize(acc, scheme=scheme, s_in=s.s_x, s_w=s.s_w, s_out=m.out.scale,
                           zp_out=m.out.zero_point, dtype=m.out.dtype.np, bias=s.bias_i32(),
                           axis=s.axis)
            return clamp_out(y, m, bounds)

        return _prepare(m, run, lambda s: f"{label} ({_weights(s)} weights)")

    return kernel


onnxruntime = _simple(Scheme.ONNXRUNTIME, "onnxruntime MlasRequantizeOutput")
caffe2 = _simple(Scheme.CAFFE2, "caffe2 F2")
tpu_mlir = _simple(Scheme.TPU_MLIR, "tpu-mlir multiplier+rshift")


def onednn(m: Match) -> Prepared | Decline:
    post_op = float_activation(m)

    def run(s: _Setup, acc: np.ndarray) -> np.ndarray:
        bias_f32 = None
        if s.bias is not None:
            b = s.bias
            bias_f32 = dequantize(_bias_vector(b).astype(np.int32), b.scale.reshape(-1),
                                  axis=0 if b.scale.size > 1 else None)
        return requantize_onednn(acc, s.s_x, s.s_w, m.out.scale, m.out.zero_point,
                                 m.out.dtype.np, bias_f32=bias_f32, post_ops=post_op,
                                 axis=s.axis)

    return _prepare(m, run, lambda s: f"onednn f32 scales, dst rint ({_weights(s)} weights)")
