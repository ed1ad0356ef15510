"""AveragePool and GlobalAveragePool in each framework's integer arithmetic.

``sum`` is the integer sum of the raw quantized inputs in a window and ``k`` its element count
(the in-bounds taps, or the whole kernel with ``count_include_pad``):

- tflite / caffe2 AveragePool (reference_ops ``AveragePool``; caffe2 ``Int8AveragePool`` is the
  same code), precondition ``S_x == S_y`` and ``Z_x == Z_y`` (they do not rescale) and no
  counted padding: u8 ``(sum + k/2) / k``; s8 ``sum > 0 ? (sum + k/2) / k : (sum - k/2) / k``
  (C division, truncating). caffe2 GlobalAveragePool is the same with the whole image.
- tflite GlobalAveragePool = ``MEAN`` over H, W (reference_ops ``Mean``, uint8 4-D path)::

      t = f32(f32(Z_x·S_x) / S_y);  t = t > 0 ? t + 0.5f : t - 0.5f     float32, then truncate
      bias = Z_y - int(t);  (m, e) = QuantizeMultiplier(f32(S_x / f32(f32(N)·S_y)))
      y = clamp(MBQM(sum, m, e) + bias)

- onnxruntime AveragePool = QLinearAveragePool (contrib qlinear_pool.cc): the input is
  dequantized to float32, each window summed *in float32 in tap order* (h, then w), divided by
  ``f32(k)``, and ``y = clamp(nearbyintf(f32(v / S_y) + f32(Z_y)))``.
- onnxruntime GlobalAveragePool = QLinearGlobalAveragePool (MLAS qlgavgpool.cpp, x86)::

      scale = f32(S_x / f32(S_y·f32(N)));  acc = sum - Z_x·N               int32
      y = rint(clamp(f32(acc)·scale, qmin - Z_y, qmax - Z_y)) + Z_y

- tpu-mlir (TPU-MLIR quantization chapter): ``y = round(Scale·sum - Offset)`` in float32 with
  ``Scale = S_x / (S_y k)``, ``Offset = (S_x/S_y) Z_x - Z_y`` (``runtime.numerics.avgpool_*``;
  padded taps count as ``Z_x`` when ``count_include_pad``), rounding half away from zero.
- onednn: int8 pooling has no scale attributes; it averages the raw values in f32
  (``f32(sum)·f32(1/k)``, the jit kernel's reciprocal) and applies f32 post-ops before its
  ``saturate(rint(·))`` store, so the requantization is two eltwise-linear post-ops (FMAs), the
  form qfuse's lowering (compiler/lower/lower_pool.py) uses::

      x = fma(S_x, avg, f32(-Z_x·S_x));  y = fma(f32(1/S_y), x, f32(Z_y));  rint(y)

  Preconditions: one integer type in and out; oneDNN pads with raw 0, so counted padding
  needs ``Z_x == 0``.

ceil_mode and dilated windows are not emulated (float path).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from qfuse.ir.ops import Op, PoolAttrs
from qfuse.runtime.emulate.eltwise import fma_f32
from qfuse.runtime.emulate.kernel import Prepared, Reader, clamp_out
from qfuse.runtime.emulate.patterns import Decline, Match
from qfuse.runtime.numerics import (
    avgpool_float,
    avgpool_params,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
)
from qfuse.runtime.reference.ops_nn import window_out

__all__ = [
    "avgpool_caffe2",
    "avgpool_onednn",
    "avgpool_onnxruntime",
    "avgpool_tflite",
    "avgpool_tpu_mlir",
    "gap_caffe2",
    "gap_onnxruntime",
    "gap_tflite",
]

F32 = np.float32
Windows = Callable[[np.ndarray, int], tuple[list[np.ndarray], np.ndarray, np.ndarray]]


def _windows(m: Match) -> Windows | Decline:
    """``taps(x, fill)``: the window taps in kernel order (pads read ``fill``), the in-bounds
    counts and the counts the average divides by, for AveragePool or GlobalAveragePool."""
    x = m.operands[0]
    spatial = x.shape[2:]
    if m.op.op is Op.GLOBAL_AVG_POOL:
        n = int(np.prod(spatial, dtype=np.int64))

        def whole(arr: np.ndarray, fill: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
            flat = arr.reshape(arr.shape[:2] + (n,))
            taps = [flat[..., i].reshape(arr.shape[:2] + (1,) * len(spatial)) for i in range(n)]
            k = np.full((1,) * len(spatial), n, np.int64)
            return taps, k, k

        return whole
    attrs: PoolAttrs = m.op.attrs
    if attrs.ceil_mode or any(d != 1 for d in attrs.dilations):
        return Decline("ceil_mode / dilated pooling windows are not emulated")
    r = len(attrs.kernel_shape)
    outs = [window_out(spatial[i], attrs.kernel_shape[i], attrs.strides[i], 1, attrs.pads[i],
                       attrs.pads[r + i], False) for i in range(r)]
    pads = [(attrs.pads[i], attrs.pads[r + i]) for i in range(r)]

    def taps_of(arr: np.ndarray, fill: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        xp = np.pad(arr, [(0, 0), (0, 0)] + pads, constant_values=fill)
        inside = np.pad(np.ones(spatial, bool), pads, constant_values=False)
        taps, count = [], np.zeros(outs, np.int64)
        for j in itertools.product(*(range(k) for k in attrs.kernel_shape)):
            sl = tuple(slice(jj, jj + (o - 1) * s + 1, s)
                       for jj, o, s in zip(j, outs, attrs.strides, strict=True))
            taps.append(xp[(Ellipsis,) + sl])
            count += inside[sl]
        k = np.full(outs, int(np.prod(attrs.kernel_shape)), np.int64)
        return taps, count, (k if attrs.count_include_pad else count)

    return taps_of


def _padded(m: Match) -> bool:
    return m.op.op is Op.AVG_POOL and any(m.op.attrs.pads)


def _counts_pad(m: Match) -> bool:
    return _padded(m) and m.op.attrs.count_include_pad


def _check(m: Match) -> tuple[Windows, Decline | None]:
    windows = _windows(m)
    x = m.operands[0]
    if isinstance(windows, Decline):
        return (lambda a, f: ([], a, a)), windows
    if not x.per_tensor:
        return windows, Decline(f"'{x.value}' is quantized per axis")
    return windows, None


def _same_quant(m: Match) -> Decline | None:
    x = m.operands[0]
    if x.s != m.out.scale or x.zp != m.out.zero_point or x.dtype != m.out.dtype:
        return Decline("the integer pooling kernel needs equal input and output quantization")
    return None


def _largest_window(m: Match) -> int:
    if m.op.op is Op.GLOBAL_AVG_POOL:
        return int(np.prod(m.operands[0].shape[2:], dtype=np.int64))
    return int(np.prod(m.op.attrs.kernel_shape, dtype=np.int64))


def _int_sum(taps: list[np.ndarray]) -> np.ndarray:
    return np.sum([t.astype(np.int64) for t in taps], axis=0)


def _integer_average(name: str, caffe2_u16: bool) -> Callable[[Match], Prepared | Decline]:
    def kernel(m: Match) -> Prepared | Decline:
        windows, bad = _check(m)
        bad = bad or _same_quant(m)
        if bad:
            return bad
        if _counts_pad(m):
            return Decline("count_include_pad with padding is not in this kernel")
        x = m.operands[0]
        if caffe2_u16 and _largest_window(m) * 255 > 0xFFFF:
            return Decline("caffe2's uint16 window accumulator would overflow")

        def run(read: Reader) -> np.ndarray:
            taps, count, _ = windows(read(x.value), 0)
            total = _int_sum(taps)
            half = count // 2
            up = (total + half) // count
            down = -((-total + half) // count)
            return clamp_out(np.where(total > 0, up, down), m, m.out.range)

        return Prepared(f"{name} integer average ((sum ± k/2) / k)", run)

    return kernel


avgpool_tflite = _integer_average("tflite", caffe2_u16=False)
avgpool_caffe2 = _integer_average("caffe2", caffe2_u16=True)
gap_caffe2 = avgpool_caffe2


def gap_tflite(m: Match) -> Prepared | Decline:
    windows, bad = _check(m)
    if bad:
        return bad
    x = m.operands[0]
    n = F32(int(np.prod(x.shape[2:], dtype=np.int64)))
    t = F32(F32(F32(x.zp) * x.s) / m.out.scale)
    t = F32(t + F32(0.5)) if t > 0 else F32(t - F32(0.5))
    bias = m.out.zero_point - int(t)
    q, shift = quantize_multiplier(np.float64(F32(x.s / F32(n * m.out.scale))))

    def run(read: Reader) -> np.ndarray:
        total = _int_sum(windows(read(x.value), 0)[0])
        y = multiply_by_quantized_multiplier(total, q, shift) + bias
        return clamp_out(y, m, m.out.range)

    return Prepared("tflite MEAN (multiplier on the raw sum, rounded zero-point bias)", run)


def avgpool_onnxruntime(m: Match) -> Prepared | Decline:
    windows, bad = _check(m)
    if bad:
        return bad
    x = m.operands[0]

    def run(read: Reader) -> np.ndarray:
        xf = (read(x.value).astype(np.int64) - x.zp).astype(F32) * x.s
        taps, _, count = windows(xf, 0)
        acc = np.zeros(taps[0].shape, F32)
        for tap in taps:  # float32, in ORT's tap order; pads add +0.0, which changes nothing
            acc = (acc + tap).astype(F32)
        v = (acc / count.astype(F32)).astype(F32)
        v = ((v / m.out.scale).astype(F32) + F32(m.out.zero_point)).astype(F32)
        return clamp_out(np.rint(v), m, m.out.range)

    return Prepared("QLinearAveragePool (float32 sequential sum, nearbyintf(v/s + zp))", run)


def gap_onnxruntime(m: Match) -> Prepared | Decline:
    windows, bad = _check(m)
    if bad:
        return bad
    x = m.operands[0]
    n = int(np.prod(x.shape[2:], dtype=np.int64))
    scale = F32(x.s / F32(m.out.scale * F32(n)))
    if n >= 0x1000000 or scale < F32(2.0**-32) or scale >= 256:
        return Decline("QLinearGlobalAveragePool parameters out of MLAS's range")
    qmin, qmax = m.out.range
    zp = m.out.zero_point

    def run(read: Reader) -> np.ndarray:
        acc = _int_sum(windows(read(x.value), 0)[0]) - x.zp * n
        v = (acc.astype(np.int32).astype(F32) * scale).astype(F32)
        v = np.minimum(np.maximum(v, F32(qmin - zp)), F32(qmax - zp))
        return clamp_out(np.rint(v).astype(np.int64) + zp, m, m.out.range)

    return Prepared("MLAS QLinearGlobalAveragePool (int sum, float32 scale, rint)", run)


def avgpool_tpu_mlir(m: Match) -> Prepared | Decline:
    windows, bad = _check(m)
    if bad:
        return bad
    x = m.operands[0]
    fill = x.zp if _counts_pad(m) else 0

    def run(read: Reader) -> np.ndarray:
        taps, _, count = windows(read(x.value), fill)
        total = _int_sum(taps)
        out = np.zeros(total.shape, np.int64)
        for k in np.unique(count):
            scale, offset = avgpool_params(x.s, x.zp, m.out.scale, m.out.zero_point, int(k))
            y = avgpool_float(total, scale, offset, np.int32)
            out = np.where(count == k, y, out)
        return clamp_out(out, m, m.out.range)

    return Prepared("tpu-mlir avgpool round(Scale·sum - Offset)", run)


def avgpool_onednn(m: Match) -> Prepared | Decline:
    windows, bad = _check(m)
    if bad:
        return bad
    x = m.operands[0]
    if x.dtype != m.out.dtype:
        return Decline("oneDNN's int8 pooling writes its source type; u8 <-> s8 is not emulated")
    if _counts_pad(m) and x.zp != 0:
        return Decline("oneDNN pads with raw 0: counted padding needs zero point 0")
    alpha, beta = x.s, F32(-x.zp * np.float64(x.s))
    inv, zp = F32(1) / m.out.scale, F32(m.out.zero_point)

    def run(read: Reader) -> np.ndarray:
        taps, _, count = windows(read(x.value), 0)
        avg = (_int_sum(taps).astype(F32) * (F32(1) / count.astype(F32))).astype(F32)
        real = fma_f32(avg, np.full_like(avg, alpha), np.full_like(avg, beta))
        y = fma_f32(real, np.full_like(real, inv), np.full_like(real, zp))
        return clamp_out(np.rint(y), m, m.out.range)

    return Prepared("onednn int8 pooling, requant as f32 linear post-ops", run)
