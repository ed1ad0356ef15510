"""QuantizeLinear / DequantizeLinear bit-exact vs ONNX Runtime, and Q→DQ vs FakeQuantize.

Findings pinned here (see also runtime/reference/ops_quant.py):
- ONNX Runtime divides ``x / scale`` in float32 (MLAS); multiplying by ``1/scale`` would differ
  on some of the inputs below (``test_quantize_divides_not_multiplies`` checks the test data
  tells the two apart).
- NaN quantizes to qmin (0 for u8, -128 for s8) whatever the zero point; ±inf saturates.
- Q→DQ equals FakeQuantize(L=256, il=ol=s·(qmin-zp), ih=oh=s·(qmax-zp)) up to:
  * float32 rounding of the output: DQ is one rounding ``(q-zp)·s``, FQ three
    (``/255·(oh-ol)+ol``): most elements differ by a few ulps, < 1e-4 LSB (LSB = s);
  * level flips, one LSB: near ties (random x: < 1e-3 of the elements) where
    ``(x-il)/(ih-il)·255`` and ``x/s`` round to different sides, and on exact ties
    (power-of-two s, x = (k+0.5)·s) whenever ``zp - qmin`` is odd: Q rounds half to even in
    q-space, FQ in level-index space (index = q - qmin), and the two parities differ. With
    ``zp - qmin`` even and a power-of-two s, Q→DQ and FQ are bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_harness import Case, run_ort, run_ours

from qfuse.ir.ops import DequantizeAttrs, Op, QuantizeAttrs
from qfuse.ir.types import DType
from qfuse.runtime.reference.ops_quant import fake_quantize_f32

F32 = np.float32
QTYPES = {DType.U8: np.uint8, DType.S8: np.int8}


def _scales(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.exp(rng.uniform(-9, 3, n)).astype(F32)


def _inputs(rng: np.random.Generator, s: float, zp: int, lo: int, hi: int,
            n: int = 4000) -> np.ndarray:
    """Random values over and past the range, float32 ties, exact bounds, extremes, NaN."""
    span = rng.uniform(lo - zp - 20, hi - zp + 20, n) * s
    k = np.arange(lo - zp - 3, hi - zp + 3, dtype=np.float64)
    ties = (k + 0.5) * s
    bounds = np.array([lo - zp, hi - zp, lo - zp - 0.5, hi - zp + 0.5], np.float64) * s
    extremes = np.array([1e30, -1e30, 3e38, -3e38, np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0])
    return np.concatenate([span, ties, bounds, extremes]).astype(F32)


def _q_case(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, dtype: DType,
            axis: int = 1) -> Case:
    constants = {"s": scale}
    if zp is not None:
        constants["z"] = zp
    onnx_attrs = {"axis": axis} if scale.ndim else {}
    if zp is None:
        onnx_attrs["output_dtype"] = _tensor_type(dtype)
    return Case("QuantizeLinear", onnx_attrs, Op.QUANTIZE_LINEAR, QuantizeAttrs(dtype, axis),
                {"x": x}, constants)


def _tensor_type(dtype: DType) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(dtype.np)


@pytest.mark.parametrize("dtype", [DType.U8, DType.S8])
def test_quantize_per_tensor_bit_exact(dtype: DType) -> None:
    rng = np.random.default_rng(0 if dtype is DType.U8 else 1)
    lo, hi = dtype.range
    for s in _scales(rng, 12):
        for zp in (0, lo + 1, hi - 3, int(rng.integers(lo, hi + 1))):
            x = _inputs(rng, float(s), zp, lo, hi, 2000)
            case = _q_case(x, np.array(s, F32), np.array(zp, QTYPES[dtype]), dtype)
            (ours,), (ref,) = run_ours(case), run_ort(case)
            np.testing.assert_array_equal(ours, ref, err_msg=f"s={s!r} zp={zp}")


def test_quantize_default_zero_point_is_u8_zero() -> None:
    rng = np.random.default_rng(5)
    x = _inputs(rng, 0.02, 0, 0, 255, 500)
    case = Case("QuantizeLinear", {}, Op.QUANTIZE_LINEAR, QuantizeAttrs(DType.U8),
                {"x": x}, {"s": np.array(0.02, F32)})
    (ours,), (ref,) = run_ours(case), run_ort(case)
    assert ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("dtype", [DType.U8, DType.S8])
@pytest.mark.parametrize("shape, axis", [((2, 3, 4, 5), 1), ((6, 7), 0), ((2, 3, 4), -1),
                                         ((4, 2, 3, 3), 0)])
def test_quantize_per_axis_bit_exact(dtype: DType, shape: tuple[int, ...], axis: int) -> None:
    rng = np.random.default_rng(len(shape) + axis)
    lo, hi = dtype.range
    c = shape[axis]
    scale = _scales(rng, c)
    zp = rng.integers(lo, hi + 1, c).astype(QTYPES[dtype])
    x = (rng.uniform(-300, 300, shape) * scale.reshape([-1 if i == axis % len(shape) else 1
                                                         for i in range(len(shape))]))
    x = x.astype(F32)
    x.flat[:4] = [np.nan, np.inf, -np.inf, 0.0]
    case = _q_case(x, scale, zp, dtype, axis)
    (ours,), (ref,) = run_ours(case), run_ort(case)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("dtype", [DType.U8, DType.S8])
def test_quantize_nan_is_qmin(dtype: DType) -> None:
    lo, _ = dtype.range
    for zp in (0, 7):
        for n in (1, 5, 1000):
            x = np.full(n, np.nan, F32)
            case = _q_case(x, np.array(0.1, F32), np.array(zp, QTYPES[dtype]), dtype)
            (ours,), (ref,) = run_ours(case), run_ort(case)
            assert np.all(ref == lo) and np.all(ours == lo)


def test_quantize_divides_not_multiplies() -> None:
    """The test data contains inputs where rint(x/s) != rint(x·(1/s)), and ORT follows x/s."""
    rng = np.random.default_rng(11)
    flips = 0
    for s in _scales(rng, 20):
        x = _inputs(rng, float(s), 0, -128, 127, 1000)
        x = x[np.isfinite(x)]
        with np.errstate(over="ignore"):
            by_div, by_mul = np.rint(x / s), np.rint(x * (F32(1) / s))
        case = _q_case(x, np.array(s, F32), np.array(0, np.int8), DType.S8)
        (ref,) = run_ort(case)
        differ = (by_div != by_mul) & (np.abs(by_div) <= 127)
        flips += int(differ.sum())
        np.testing.assert_array_equal(ref[differ], by_div[differ].astype(np.int8))
    assert flips > 0


DQ_CASES = [
    # x dtype, shape, axis or None (per tensor), with zero point
    (np.uint8, (2, 3, 4), None, True),
    (np.int8, (2, 3, 4), None, True),
    (np.int8, (2, 3, 4), None, False),
    (np.uint8, (2, 3, 4), 1, True),
    (np.int8, (5, 3, 3, 3), 0, True),
    (np.int8, (4, 6), -1, False),
    (np.int32, (16,), None, False),
    (np.int32, (2, 8), 1, False),
]


@pytest.mark.parametrize("dtype, shape, axis, with_zp", DQ_CASES)
def test_dequantize_bit_exact(dtype: type, shape: tuple[int, ...], axis: int | None,
                              with_zp: bool) -> None:
    rng = np.random.default_rng(len(shape) * 7 + (axis or 0))
    info = np.iinfo(dtype)
    lo, hi = (max(info.min, -2**30), min(info.max, 2**30))
    x = rng.integers(lo, hi, shape, endpoint=True).astype(dtype)
    x.flat[:2] = [info.min, info.max] if dtype != np.int32 else [lo, hi]
    n = 1 if axis is None else shape[axis]
    scale = _scales(rng, n).reshape(() if axis is None else (n,))
    constants = {"s": scale}
    if with_zp:
        constants["z"] = rng.integers(info.min, info.max, n, endpoint=True).astype(
            dtype).reshape(scale.shape)
    attrs = DequantizeAttrs(1 if axis is None else axis)
    case = Case("DequantizeLinear", {} if axis is None else {"axis": axis},
                Op.DEQUANTIZE_LINEAR, attrs, {"x": x}, constants)
    (ours,), (ref,) = run_ours(case), run_ort(case)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, ref)


# ------------------------------------------------------------- Q -> DQ versus FakeQuantize
def _qdq(x: np.ndarray, s: np.float32, zp: int, dtype: DType) -> np.ndarray:
    lo, hi = dtype.range
    q = np.clip(np.rint(x / s) + F32(zp), lo, hi)
    return ((q - F32(zp)) * s).astype(F32)


def _fq_equivalent(x: np.ndarray, s: np.float32, zp: int, dtype: DType) -> np.ndarray:
    lo, hi = dtype.range
    low, high = F32(s * F32(lo - zp)), F32(s * F32(hi - zp))
    return fake_quantize_f32(x, low, high, low, high, 256)


@pytest.mark.parametrize("dtype", [DType.U8, DType.S8])
def test_qdq_vs_fake_quantize_random(dtype: DType) -> None:
    rng = np.random.default_rng(21)
    lo, hi = dtype.range
    flips = total = 0
    for s in _scales(rng, 40):
        zp = int(rng.integers(lo, hi + 1))
        x = (rng.uniform(lo - zp - 5, hi - zp + 5, 5000) * s).astype(F32)
        lsb = np.abs(_qdq(x, s, zp, dtype).astype(np.float64) - _fq_equivalent(x, s, zp, dtype))
        lsb /= float(s)
        assert lsb.max() <= 1 + 1e-4
        flipped = lsb > 0.5
        assert lsb[~flipped].max(initial=0) < 1e-4
        flips += int(flipped.sum())
        total += x.size
    assert flips / total < 1e-3


@pytest.mark.parametrize("dtype", [DType.U8, DType.S8])
@pytest.mark.parametrize("zp_offset", [0, 1, 2, 3])
def test_qdq_vs_fake_quantize_exact_ties(dtype: DType, zp_offset: int) -> None:
    """Power-of-two scales: every tie is exact for both. Same levels iff zp - qmin is even."""
    lo, hi = dtype.range
    zp = (0 if dtype is DType.S8 else 128) + zp_offset
    for s in (F32(2.0**-7), F32(0.5), F32(4.0)):
        k = np.arange(lo - zp, hi - zp, dtype=F32)
        ties = (k + F32(0.5)) * s
        assert np.all(ties / s == k + F32(0.5))
        a, b = _qdq(ties, s, zp, dtype), _fq_equivalent(ties, s, zp, dtype)
        if (zp - lo) % 2 == 0:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_array_equal(np.abs(a - b), np.full(a.shape, s, F32))
        rng = np.random.default_rng(zp_offset)
        x = (rng.uniform(lo - zp - 5, hi - zp + 5, 5000) * s).astype(F32)
        if (zp - lo) % 2 == 0:
            np.testing.assert_array_equal(_qdq(x, s, zp, dtype), _fq_equivalent(x, s, zp, dtype))


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from([DType.U8, DType.S8]),
    scale=st.floats(2.0**-13, 20.0, width=32),
    zp_frac=st.floats(0.0, 1.0),
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    seed=st.integers(0, 2**31),
)
def test_quantize_hypothesis(dtype: DType, scale: float, zp_frac: float, shape: list[int],
                             seed: int) -> None:
    """Random shapes, scales and zero points; x mixes ties (k+0.5)·s and saturating values."""
    lo, hi = dtype.range
    zp = round(lo + zp_frac * (hi - lo))
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    k = rng.integers(lo - zp - 4, hi - zp + 4, n)
    x = np.where(rng.random(n) < 0.5, (k + 0.5) * scale, rng.uniform(-300, 300, n) * scale)
    case = _q_case(x.astype(F32).reshape(shape), np.array(scale, F32),
                   np.array(zp, QTYPES[dtype]), dtype)
    (ours,), (ref,) = run_ours(case), run_ort(case)
    np.testing.assert_array_equal(ours, ref)
