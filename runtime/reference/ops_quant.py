"""QuantizeLinear, DequantizeLinear and FakeQuantize, bit-exact.

QuantizeLinear (ONNX): ``y = saturate(round_half_even(x / scale) + zero_point)``.
``x / scale`` is a float32 *division*, as ONNX Runtime computes it: MLAS ``quantize.cpp``
(``MlasQuantizeLinearVector``: ``MlasDivideFloat32x4(FloatVector, ScaleVector)``, then clamp to
``[qmin - zp, qmax - zp]``, then ``_mm_cvtps_epi32`` = round half to even, then ``+ zp``); the
AVX-512 kernel (``quantize_avx512f.cpp``) divides too (``_mm512_div_ps``). Multiplying by a
precomputed ``1/scale`` would differ by one step on some inputs. NaN: ONNX Runtime 1.31 gives ``qmin`` (0 for u8, -128 for s8) whatever the
zero point — ``_mm_max_ps(NaN, lo)`` returns ``lo`` — for per-tensor and per-axis alike (checked
by tests/runtime/test_reference_quant.py); +inf saturates to qmax, -inf to qmin.

DequantizeLinear: ``y = float32(x - zero_point) * scale`` (float32), per tensor or per axis;
int32 inputs (biases) come without a zero point.

FakeQuantize (OpenVINO fake_quantize.md, OpenVINO ``ov::reference::fake_quantize``)::

    x <= min(il, ih)  ->  ol
    x >  max(il, ih)  ->  oh
    else              ->  nearbyint((x - il) / (ih - il) * (L-1)) / (L-1) * (oh - ol) + ol

every operation in float32 in exactly this order (subtract, divide, multiply, round, divide,
multiply, add), ``nearbyint`` under the default rounding mode = round half to EVEN (not
``std::round``'s half away from zero). The ranges broadcast numpy-style against x. This is
bit-exact with OpenVINO's reference implementation (``Node.evaluate``), on ties too. The CPU
plugin computes another formula (clamp, ``x*isc - ish`` with precomputed float32 scales and
FMA, round half to even, ``q*osc + ol``) and differs by up to one level on near-ties and by
float32 ulps elsewhere (tests/runtime/test_reference_fakequantize.py measures and pins it).

A FakeQuantize made from an ONNX Q/DQ pair (``FakeQuantizeAttrs.onnx``) is that pair: ONNX's
QuantizeLinear with the pair's scale and zero point, then (f32 output) its DequantizeLinear —
the quantized levels ``q`` for a quantize-only one, whose output range then starts at qmin.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from qfuse.ir.graph import Node
from qfuse.ir.ops import DequantizeAttrs, FakeQuantizeAttrs, Op, QuantizeAttrs
from qfuse.ir.types import DType, OnnxQuantize
from qfuse.runtime.reference.registry import Arrays, impl, need, opt

F32 = np.float32
_PACK, _UNPACK = struct.Struct("f").pack, struct.Struct("f").unpack
_F32_MAX = float(np.finfo(np.float32).max)


def _along(param: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A scale / zero point shaped to broadcast against a rank-``ndim`` tensor."""
    if param.size == 1:
        return param.reshape(())
    if param.ndim != 1:
        raise ValueError(f"per-axis parameters must be 1-D, got shape {param.shape}")
    axis = axis + ndim if axis < 0 else axis
    if not 0 <= axis < ndim:
        raise ValueError(f"axis {axis} out of range for rank {ndim}")
    shape = [1] * ndim
    shape[axis] = param.size
    return param.reshape(shape)


def quantize_onnx(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, dtype: DType,
                  axis: int) -> np.ndarray:
    """ONNX QuantizeLinear, ``saturate(rint(x / s) + zp)``, as float32 levels (module docstring)."""
    lo, hi = dtype.range
    s = _along(np.asarray(scale, F32), x.ndim, axis)
    z = F32(0) if zp is None else _along(np.asarray(zp), x.ndim, axis).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.rint(x / s) + z
    return np.where(np.isnan(q), F32(lo), np.clip(q, F32(lo), F32(hi))).astype(F32)


@impl(Op.QUANTIZE_LINEAR)
def quantize_linear(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: QuantizeAttrs = node.attrs
    x, scale, zp = need(args, 0), need(args, 1), opt(args, 2)
    out = attrs.dtype.np
    if zp is not None and zp.dtype != out:
        raise ValueError(f"zero point is {zp.dtype} but the output type is {out}")
    if x.dtype != F32 or scale.dtype != F32:
        raise ValueError(f"x and scale must be float32, got {x.dtype} and {scale.dtype}")
    return [quantize_onnx(x, scale, zp, attrs.dtype, attrs.axis).astype(out)]


@impl(Op.DEQUANTIZE_LINEAR)
def dequantize_linear(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: DequantizeAttrs = node.attrs
    x, scale, zp = need(args, 0), need(args, 1), opt(args, 2)
    if x.dtype.kind not in "iu":
        raise ValueError(f"DequantizeLinear reads an integer tensor, got {x.dtype}")
    if scale.dtype != F32:
        raise ValueError(f"scale must be float32, got {scale.dtype}")
    shifted = x.astype(np.int64)
    if zp is not None:
        if zp.dtype != x.dtype:
            raise ValueError(f"zero point is {zp.dtype} but x is {x.dtype}")
        shifted = shifted - _along(zp, x.ndim, attrs.axis).astype(np.int64)
    return [shifted.astype(F32) * _along(scale, x.ndim, attrs.axis)]


def fake_quantize_f32(
    x: np.ndarray, il: np.ndarray, ih: np.ndarray, ol: np.ndarray, oh: np.ndarray, levels: int
) -> np.ndarray:
    """OpenVINO's reference FakeQuantize in float32 (module docstring), numpy broadcasting."""
    x, il, ih, ol, oh = (np.asarray(a, dtype=F32) for a in (x, il, ih, ol, oh))
    steps = F32(levels - 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inside = np.rint((x - il) / (ih - il) * steps) / steps * (oh - ol) + ol
    below = x <= np.minimum(il, ih)
    above = x > np.maximum(il, ih)
    return np.where(below, ol, np.where(above, oh, inside)).astype(F32)


@impl(Op.FAKE_QUANTIZE)
def fake_quantize(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: FakeQuantizeAttrs = node.attrs
    x, il, ih, ol, oh = (need(args, i) for i in range(5))
    if x.dtype != F32:
        raise ValueError(f"FakeQuantize reads float32, got {x.dtype}")
    if attrs.levels < 2:
        raise ValueError(f"levels must be >= 2, got {attrs.levels}")
    if attrs.onnx is not None:
        return [onnx_pair(x, attrs.onnx)]
    y = fake_quantize_f32(x, il, ih, ol, oh, attrs.levels)
    if y.shape != x.shape:
        raise ValueError(f"ranges of shapes {[a.shape for a in (il, ih, ol, oh)]} "
                         f"broadcast x {x.shape} to {y.shape}")
    return [y]


def onnx_pair(x: np.ndarray, form: OnnxQuantize) -> np.ndarray:
    """A FakeQuantize that stands for an ONNX Q/DQ pair (module docstring)."""
    quant = form.quant
    axis = quant.axis if quant.axis is not None else 1
    q = quantize_onnx(x, quant.scale_array(), quant.zero_point_array(), form.dtype, axis)
    if not form.dequantize:
        return q
    zp = _along(quant.zero_point_array().astype(F32), x.ndim, axis)
    return ((q - zp) * _along(quant.scale_array(), x.ndim, axis)).astype(F32)


def _f32(value: float) -> float:
    """``value`` rounded to float32 (as a Python float)."""
    if math.isfinite(value) and abs(value) < _F32_MAX:
        return _UNPACK(_PACK(value))[0]
    with np.errstate(over="ignore"):
        return float(F32(value))


def dynamic_params(x_min: float, x_max: float) -> tuple[float, int]:
    """Scale (float32) and u8 zero point of DynamicQuantizeLinear from the range of x, in
    ONNX Runtime's float32 steps (onnxruntime/core/util/qmath.h ``GetQuantizationParameter``;
    ONNX spec https://onnx.ai/onnx/operators/onnx__DynamicQuantizeLinear.html): the range
    widened to include 0, ``scale = (max - min) / 255`` (1 when the range is empty, where the
    spec would divide by zero), ``zp = rint(clip(0 - min / scale, 0, 255))`` (half to even).
    A NaN in x is not defined by ONNX: measured, onnxruntime's range skips it (a finite
    scale), while oneDNN's min / max reductions return NaN, and every element then quantizes
    to 0 (NaN stores as 0 in u8; this reference computes NaN too).
    Computed on Python floats, each step rounded to float32: one float64 operation on float32
    operands rounded to float32 is the float32 operation's own result (+, −, ·, /; 53 ≥ 2·24 + 2
    bits), so this is ONNX Runtime's float32 arithmetic, 3x faster than numpy scalars in the
    run-time params kernel (compiler/lower/lower_dynamic.py)."""
    lo, hi = min(_f32(x_min), 0.0), max(_f32(x_max), 0.0)
    if hi == lo:
        scale = 1.0
    else:
        scale = _f32(_f32(hi - lo) / 255.0)
    try:
        initial = _f32(0.0 - _f32(lo / scale))
    except ZeroDivisionError:  # a subnormal range rounded to a zero scale: ONNX Runtime's inf
        initial = math.inf if lo < 0 else math.nan
    # std::max(0, std::min(255, initial)): a NaN (an infinite range) clamps to 255, then stays
    clamped = initial if initial < 255.0 else 255.0
    clamped = clamped if 0.0 < clamped else 0.0
    return scale, round(clamped)  # round(): half to even, as rint


@impl(Op.DYNAMIC_QUANTIZE_LINEAR)
def dynamic_quantize_linear(node: Node, args: Arrays) -> list[np.ndarray]:
    x = need(args, 0)
    if x.dtype != F32:
        raise ValueError(f"DynamicQuantizeLinear reads float32, got {x.dtype}")
    scale, zp = dynamic_params(float(x.min()), float(x.max()))
    s, z = np.array(scale, F32), np.array(zp, np.uint8)
    return [quantize_onnx(x, s, z, DType.U8, 0).astype(np.uint8), s, z]
