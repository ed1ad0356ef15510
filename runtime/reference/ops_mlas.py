"""ONNX Runtime's float32 CPU kernels for GELU, Softmax and LayerNorm, step by step in numpy.

Every step below is one float32 operation (or float64 where stated), rounded as the CPU
rounds it; ``fma`` is a fused multiply-add (one rounding), computed exactly by ``fma32``. The
results are the bits ONNX Runtime 1.32's CPU execution provider produces on x86-64 with AVX2
and AVX-512F (checked element for element by tests/runtime/test_reference_ort_kernels.py).
Where another CPU takes another kernel, that is said below.

GELU, erf form (``MlasGeluErfKernelAvx512F``, ``mlas/lib/intrinsics/avx512/gelu_avx512f.cpp``):
``y = (0.5·x)·(erf(x·f32(1/√2)) + 1)``, NaN passed through, where with ``a = min(|x|, 3.925)``:

- ``a <= 0.921875``: ``s = a·a``; ``r = fma(...fma(fma(P0, s, P1), s, P2)..., s, P5 - 1)``;
  ``erf = fma(r, a, a)``;
- else ``q = fma(...fma(fma(B0, a, B1), a, B2)..., a, B6 - 1)``, ``t = max(-fma(q, a, a),
  -88.376...)``, ``erf = 1 - exp(t)`` with ``r = fma(1/ln2, t, 1.5·2^23) - 1.5·2^23``,
  ``f = fma(r, ln2_lo, fma(r, ln2_hi, t))``, ``exp = fma(...fma(E0, f, E1)..., f, E6)·2^r``;

the sign of the argument is then copied onto erf. Constants: MLAS's ``MlasErfConstants``.
(Without AVX-512, MLAS evaluates erf with ``MlasErfKernelFma3``, which clamps at 3.725.)

Softmax of one row of D elements (``MlasComputeSoftmax``): ``m = max(row)``;
``e_i = exp(x_i + (-m))``, ``y_i = e_i · (1 / sum)`` (a float32 reciprocal, then a product);
LogSoftmax ``y_i = (x_i + (-m)) - logf(sum)`` (the C library's ``logf``).
MLAS picks the sum-of-exponentials kernel by CPU (``MLAS_SOFTMAX_KERNEL``, read from the host):

- AVX-512F (``MlasComputeSumExpF32KernelAvx512F``): ``x = max(x_i - m, -103.97...)``,
  ``r = fma(x, 1/ln2, 1.5·2^23) - 1.5·2^23``, ``x = fma(r, ln2_lo, fma(r, ln2_hi, x))``,
  ``p = fma(fma(...fma(C0, x, C1)..., x, 1), x, 1)``, ``e = p·2^r`` (``vscalefps``: subnormal
  results kept); the sum adds element ``i`` into lane ``i mod 16`` (in order, from 0), then
  ``a_j = lane_j + lane_{j+8}`` and ``sum = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))``.
- AVX2 + FMA (``MlasComputeSumExpF32KernelFma3``, ``mlas/lib/x86_64/TransKernelFma3.S``): the
  same reduction and polynomial with ``x`` clamped at -88.376... (so ``r >= -127``), and
  ``2^r`` built by integer arithmetic on the biased sum, ``bits((r << 23) + 0x3F800000)``:
  ``2^-127`` comes out as +0.0, so ``e = 0`` where MLAS's AVX-512 kernel gives a subnormal;
  the sum runs in 8 lanes (element ``i`` into lane ``i mod 8``), reduced by two ``vhaddps``
  as ``((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))``.

LayerNorm of a row of n elements, n >= 8 (``MlasLayerNormKernelAvx2``,
``mlas/lib/layernorm_kernel_avx2.cpp``, on every AVX2 CPU): ``mean = f32(S / n)`` with S the
float64 sum of four lanes (element i into lane i mod 4, in order), ``(l0 + l2) + (l1 + l3)``,
then the remaining elements; ``d = x - mean``; ``var`` = eight lanes of ``fma(d, d, lane)``,
summed as ``((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))``, then the tail: a block of four
(``var + d·d``, product rounded) and the rest ``fma(d, d, var)`` (how GCC compiled the tail
loop); ``inv_std = 1 / sqrt(var / n + eps)``; ``y = fma(d·inv_std, scale, bias)``
(``(d·inv_std)·scale`` without bias). n < 8 (ONNX Runtime's scalar fallback, Welford's
algorithm in float32): ``mean += (x_k - mean) / (k+1)``, ``m2 += delta·(x_k - mean)``,
``den = sqrt(m2 / n + eps)``, ``y = (x - mean) / den · scale + bias``, ``inv_std = 1 / den``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from pathlib import Path

import numpy as np

F32 = np.float32
F64 = np.float64


def fma32(a: np.ndarray | float, b: np.ndarray | float, c: np.ndarray | float) -> np.ndarray:
    """float32 ``a·b + c`` rounded once (IEEE fusedMultiplyAdd), for float32 operands.

    ``a·b`` is exact in float64 (24 + 24 bits); the float64 sum is made round-to-odd (its
    rounding error, found by TwoSum, moves an even result one ulp toward the exact value), and
    a round-to-odd value with 53 >= 24 + 2 bits rounds to float32 exactly as the exact sum."""
    product = np.asarray(a, dtype=F32).astype(F64) * np.asarray(b, dtype=F32).astype(F64)
    addend = np.asarray(c, dtype=F32).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        total = product + addend
        virtual = total - product
        error = (product - (total - virtual)) + (addend - virtual)
        even = (total.view(np.int64) & 1) == 0
        fix = np.isfinite(total) & (error != 0) & even
        toward = np.where(error > 0, np.inf, -np.inf)
        total = np.where(fix, np.nextafter(total, toward), total)
        return total.astype(F32)


_ERF_SMALL = [-5.99104969e-4, 4.99339588e-3, -2.67667342e-2, 1.12818025e-1, -3.76124859e-1,
              1.28379151e-1]
_ERF_BIG = [1.72948930e-5, -3.83208680e-4, 3.88393435e-3, -2.42545605e-2, 1.06777847e-1,
            6.34846687e-1, 1.28717512e-1]
_ERF_EXP = [1.38319808e-3, 8.37550033e-3, 4.16689515e-2, 1.66664466e-1, 4.99999851e-1, 1.0, 1.0]
_ROUNDING_BIAS = F32(12582912.0)  # 1.5·2^23: adding it rounds a float32 to an integer
_LOG2E = F32(1.44269504088896341)
_LN2_HI, _LN2_LO = F32(-6.93145752e-1), F32(-1.42860677e-6)


def _horner(coefficients: list[float], x: np.ndarray) -> np.ndarray:
    r = np.full(x.shape, F32(coefficients[0]), dtype=F32)
    for c in coefficients[1:]:
        r = fma32(r, x, F32(c))
    return r


def _erf(x: np.ndarray) -> np.ndarray:
    a = np.minimum(np.abs(x), F32(3.925))
    big = a > F32(0.921875)
    small = fma32(_horner(_ERF_SMALL, a * a), a, a)
    ab = np.where(big, a, F32(0))
    t = np.maximum(-fma32(_horner(_ERF_BIG, ab), ab, ab), F32(-88.3762626647949))
    r = fma32(_LOG2E, t, _ROUNDING_BIAS) - _ROUNDING_BIAS
    f = fma32(r, _LN2_LO, fma32(r, _LN2_HI, t))
    e = np.ldexp(_horner(_ERF_EXP, f), r.astype(np.int32)).astype(F32)
    return np.copysign(np.where(big, F32(1) - e, small), x).astype(F32)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """``MlasGeluErfKernelAvx512F`` on float32 ``x``: ``(0.5·x)·(erf(x·(1/√2)) + 1)``, NaN kept."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(invalid="ignore", over="ignore"):
        y = (F32(0.5) * x) * (_erf(x * F32(0.70710678118654752440)) + F32(1))
    return np.where(np.isnan(x), x, y).astype(F32)


_EXP_POLY = [float.fromhex(h) for h in ("0x1.694000p-10", "0x1.125edcp-7", "0x1.555b5ap-5",
                                        "0x1.555450p-3", "0x1.fffff6p-2", "0x1p0", "0x1p0")]


def _host_has_avx512f() -> bool:
    """Whether MLAS takes its AVX-512F kernels here (Linux: the kernel's CPU flags, which also
    require the OS to save the AVX-512 state; elsewhere assume the AVX-512 machines of CI)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return True
    return "avx512f" in cpuinfo.read_text().split()


#: The sum-of-exponentials kernel MLAS runs on this host: "avx512f" or "fma3" (docstring).
MLAS_SOFTMAX_KERNEL = "avx512f" if _host_has_avx512f() else "fma3"


def _exp_avx512f(shifted: np.ndarray) -> np.ndarray:
    shifted = np.maximum(shifted, F32(-103.9720840454))
    r = fma32(shifted, _LOG2E, _ROUNDING_BIAS) - _ROUNDING_BIAS
    reduced = fma32(r, _LN2_LO, fma32(r, _LN2_HI, shifted))
    with np.errstate(invalid="ignore"):  # NaN in, NaN out (its exponent is never used)
        exponent = r.astype(np.int32)
    return np.ldexp(_horner(_EXP_POLY, reduced), exponent).astype(F32)


def _exp_fma3(shifted: np.ndarray) -> np.ndarray:
    shifted = np.maximum(shifted, F32(-88.3762626647949))
    biased = fma32(shifted, _LOG2E, _ROUNDING_BIAS)
    r = biased - _ROUNDING_BIAS
    reduced = fma32(r, _LN2_LO, fma32(r, _LN2_HI, shifted))
    # vpslld by 23 then vpaddd of 127 << 23: the low bits of the biased sum hold r
    scale = ((biased.view(np.uint32) << np.uint32(23)) + np.uint32(0x3F800000)).view(F32)
    return (_horner(_EXP_POLY, reduced) * scale).astype(F32)


def softmax_last_axis(x: np.ndarray, kernel: str | None = None) -> np.ndarray:
    """``MlasComputeSoftmax`` over the last axis of float32 ``x`` with MLAS's ``kernel``
    ("avx512f" or "fma3"; default: the host's, ``MLAS_SOFTMAX_KERNEL``) (module docstring)."""
    _, e, total = _sum_exp(x, kernel)
    return (e * (F32(1) / total)[..., None]).astype(F32)


def log_softmax_last_axis(x: np.ndarray, kernel: str | None = None) -> np.ndarray:
    """``MlasComputeSoftmax``'s LogSoftmax over the last axis of float32 ``x`` (module
    docstring): ``(x + (-m)) - logf(sum)``."""
    neg_max, _, total = _sum_exp(x, kernel)
    log_sum = np.vectorize(_logf, otypes=[F32])(total) if total.size else total
    return ((np.asarray(x, dtype=F32) + neg_max) - log_sum[..., None]).astype(F32)


def _libm_logf() -> Callable[[float], float] | None:
    """The C library's ``logf``, which ONNX Runtime's ``std::log(float)`` calls (glibc's is
    not always float32's nearest value: log(1.2065225) = 0.18774223 against 0.18774222)."""
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    except OSError:
        return None
    logf = libm.logf
    logf.restype, logf.argtypes = ctypes.c_float, [ctypes.c_float]
    return logf


_LOGF = _libm_logf()


def _logf(value: np.float32) -> np.float32:
    """``logf(value)``: the C library's where there is one, else float32's nearest value."""
    if _LOGF is not None:
        return F32(_LOGF(float(value)))
    return F32(np.log(F64(value)))


def _sum_exp(x: np.ndarray, kernel: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(``-max``, the exponentials, their sum in MLAS's lane order) of each last-axis row."""
    kernel = MLAS_SOFTMAX_KERNEL if kernel is None else kernel
    if kernel not in ("avx512f", "fma3"):
        raise ValueError(f"unknown MLAS softmax kernel {kernel!r}")
    x = np.asarray(x, dtype=F32)
    neg_max = -x.max(axis=-1, keepdims=True)
    e = _exp_avx512f(x + neg_max) if kernel == "avx512f" else _exp_fma3(x + neg_max)
    width = 16 if kernel == "avx512f" else 8
    d = x.shape[-1]
    padded = np.zeros(x.shape[:-1] + (-(-d // width) * width,), dtype=F32)
    padded[..., :d] = e
    chunks = padded.reshape(x.shape[:-1] + (-1, width))
    lanes = np.zeros(x.shape[:-1] + (width,), dtype=F32)
    for i in range(chunks.shape[-2]):
        lanes = lanes + chunks[..., i, :]
    a = lanes[..., :8] + lanes[..., 8:] if width == 16 else lanes
    total = ((a[..., 0] + a[..., 1]) + (a[..., 2] + a[..., 3])) + \
        ((a[..., 4] + a[..., 5]) + (a[..., 6] + a[..., 7]))
    return neg_max, e, total


def _reduce8(v: np.ndarray) -> np.ndarray:
    """``(lo + hi)``, then ``(r0 + r2) + (r1 + r3)``: the AVX horizontal sum of 8 lanes."""
    r = v[..., :4] + v[..., 4:]
    return (r[..., 0] + r[..., 2]) + (r[..., 1] + r[..., 3])


def layer_norm_rows(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None,
                    epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm of each row of float32 ``x`` [rows, n]: (y, mean, inv_std) (ops_nn.py)."""
    x = np.asarray(x, dtype=F32)
    n, eps = x.shape[-1], F32(epsilon)
    if n < 8:
        mean, m2 = np.zeros(x.shape[:-1], F32), np.zeros(x.shape[:-1], F32)
        for k in range(n):
            delta = x[..., k] - mean
            mean = mean + delta / F32(k + 1)
            m2 = m2 + delta * (x[..., k] - mean)
        denom = np.sqrt(m2 / F32(n) + eps)
        y = (x - mean[..., None]) / denom[..., None] * scale
        return (y if bias is None else y + bias), mean, F32(1) / denom
    quads = n // 4
    lanes = np.add.accumulate(x[..., :4 * quads].astype(F64).reshape(x.shape[:-1] + (quads, 4)),
                              axis=-2)[..., -1, :]
    total = (lanes[..., 0] + lanes[..., 2]) + (lanes[..., 1] + lanes[..., 3])
    for i in range(4 * quads, n):
        total = total + x[..., i].astype(F64)
    mean = (total / F64(n)).astype(F32)
    d = x - mean[..., None]
    octets = n // 8
    acc = np.zeros(x.shape[:-1] + (8,), F32)
    for i in range(octets):
        acc = fma32(d[..., 8 * i:8 * i + 8], d[..., 8 * i:8 * i + 8], acc)
    var = _reduce8(acc)
    tail = 8 * octets
    quad_end = tail + (n - tail) // 4 * 4
    for i in range(tail, quad_end):  # the compiler's 4-wide epilogue: rounded products
        var = var + d[..., i] * d[..., i]
    for i in range(quad_end, n):  # the scalar remainder: contracted to FMA
        var = fma32(d[..., i], d[..., i], var)
    inv_std = F32(1) / np.sqrt(var / F32(n) + eps)
    y = d * inv_std[..., None]
    y = fma32(y, scale, bias) if bias is not None else y * scale
    return y.astype(F32), mean, inv_std.astype(F32)
