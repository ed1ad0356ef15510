"""The ops the reference computes in ONNX Runtime's float32 order equal it bit for bit.

AveragePool / GlobalAveragePool (ops_pool.py), linear and cubic Resize (ops_shape.py), Gelu,
Softmax and LayerNormalization (ops_mlas.py): every output element equal, no tolerance. MLAS
picks some kernels by CPU: LayerNorm's needs AVX2 and FMA, Gelu's AVX-512F; those checks are
skipped on a host without them. Softmax follows the host's MLAS kernel (AVX-512F or AVX2 +
FMA), and both are checked wherever they run. ``fma32`` is checked against exact rational
arithmetic.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from reference_harness import Case, randn, run_ort, run_ours

from qfuse.ir.ops import (
    AxisAttrs,
    GeluAttrs,
    LayerNormAttrs,
    NoAttrs,
    Op,
    PoolAttrs,
    ResizeAttrs,
    ResizeMode,
)
from qfuse.runtime.reference.ops_mlas import MLAS_SOFTMAX_KERNEL, fma32, softmax_last_axis

F32 = np.float32
_CPUINFO = Path("/proc/cpuinfo")
FLAGS = set(_CPUINFO.read_text().split()) if _CPUINFO.exists() else set()
needs_avx2 = pytest.mark.skipif(not {"avx2", "fma"} <= FLAGS, reason="MLAS's AVX2 kernel")
needs_avx512 = pytest.mark.skipif("avx512f" not in FLAGS, reason="MLAS's AVX-512F kernel")


def assert_bit_exact(case: Case) -> None:
    for i, (ours, ref) in enumerate(zip(run_ours(case), run_ort(case), strict=True)):
        assert ours.shape == ref.shape, f"output {i}: {ours.shape} vs {ref.shape}"
        np.testing.assert_array_equal(ours, ref, err_msg=f"{case.onnx_op} output {i}")


def test_fma32_rounds_once() -> None:
    rng = np.random.default_rng(0)
    a, b = randn(rng, 4000), randn(rng, 4000)
    c = -(a.astype(np.float64) * b).astype(F32)  # near-cancellation: the hard cases
    c[::2] = randn(rng, 2000) * F32(1e-3)
    got = fma32(a, b, c)
    for x, y, z, r in zip(a, b, c, got, strict=True):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        assert r == _round_f32(exact), (x, y, z, r)


def test_fma32_where_float64_rounds_twice() -> None:
    """(1 + 2^-12)² = 1 + 2^-11 + 2^-24 is a float32 tie; + 2^-60 breaks it upward, but the
    float64 sum drops 2^-60 and the tie would round to even (down)."""
    a = F32(1 + 2**-12)
    assert fma32(a, a, F32(2**-60)) == F32(1 + 2**-11 + 2**-23)
    assert fma32(a, a, F32(-(2**-60))) == F32(1 + 2**-11)
    assert F32(np.float64(a) * np.float64(a) + 2**-60) == F32(1 + 2**-11)  # the naive way


def _round_f32(value: Fraction) -> np.float32:
    """The float32 nearest to a rational, ties to even (float32(float(value)) rounds twice:
    it is at most one float32 step off, so the answer is it or a neighbour)."""
    near = F32(float(value))
    candidates = [np.nextafter(near, F32(-np.inf)), near, np.nextafter(near, F32(np.inf))]
    return min(candidates, key=lambda f: (abs(Fraction(float(f)) - value),
                                          int(np.array(f).view(np.int32)) & 1))


POOL_CASES = [
    # x shape, kernel, strides, pads, ceil_mode, count_include_pad — which MLAS kernel
    ((1, 3, 16, 16), (3, 3), (1, 1), (1, 1, 1, 1), False, False),  # vector, stride 1
    ((2, 2, 9, 7), (3, 3), (2, 2), (1, 1, 1, 1), False, True),  # vector, stride 2
    ((1, 2, 10, 9), (3, 2), (2, 2), (0, 1, 1, 0), True, False),  # vector, ceil_mode
    ((1, 4, 6, 7, 9), (3, 2, 3), (1, 2, 2), (1, 0, 1, 1, 1, 0), False, False),  # 3-D vector
    ((1, 2, 12, 11), (3, 3), (3, 3), (1, 1, 1, 1), False, True),  # generic: stride 3
    ((2, 3, 13), (4,), (3,), (1, 2), True, False),  # generic: 1-D
    ((1, 4, 7, 7), (7, 7), (1, 1), (0, 0, 0, 0), False, False),  # global
    ((1, 2, 8, 8), (2, 2), (3, 3), (1, 1, 1, 1), True, True),  # functor: ceil + include_pad
    ((1, 2, 10, 9), (3, 2), (2, 2), (0, 1, 1, 0), True, True),
]


@pytest.mark.parametrize("xs, kernel, strides, pads, ceil, include", POOL_CASES)
def test_average_pool_opset_17(xs: tuple[int, ...], kernel: tuple[int, ...],
                               strides: tuple[int, ...], pads: tuple[int, ...], ceil: bool,
                               include: bool) -> None:
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
             "ceil_mode": int(ceil), "count_include_pad": int(include)}
    x = randn(np.random.default_rng(sum(xs)), *xs, scale=3.0)
    ones = (1,) * len(kernel)
    assert_bit_exact(Case("AveragePool", attrs, Op.AVG_POOL,
                          PoolAttrs(kernel, strides, pads, ones, ceil, include), {"x": x},
                          opset=17))


@pytest.mark.parametrize("dilations, include", [((2, 2), False), ((2, 1), True), ((1, 1), True)])
def test_average_pool_opset_19_functor(dilations: tuple[int, ...], include: bool) -> None:
    """Dilated windows (and ceil_mode with count_include_pad) take the functor at every opset."""
    attrs = {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [2, 1, 1, 2],
             "dilations": list(dilations), "ceil_mode": 1, "count_include_pad": int(include)}
    x = randn(np.random.default_rng(5), 1, 2, 11, 10, scale=3.0)
    pool = PoolAttrs((3, 3), (2, 1), (2, 1, 1, 2), dilations, True, include)
    assert_bit_exact(Case("AveragePool", attrs, Op.AVG_POOL, pool, {"x": x}, opset=19))


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 4, 7), (1, 2, 3, 4, 5), (1, 8, 56, 56)])
def test_global_average_pool(shape: tuple[int, ...]) -> None:
    x = randn(np.random.default_rng(len(shape)), *shape, scale=3.0)
    assert_bit_exact(Case("GlobalAveragePool", {}, Op.GLOBAL_AVG_POOL, NoAttrs(), {"x": x}))


RESIZES = [
    # input shape, output sizes, coordinate_transformation_mode
    ((1, 16, 16, 16), (1, 16, 32, 32), "half_pixel"),  # the unet's upsampling
    ((2, 3, 7, 9), (2, 3, 20, 13), "align_corners"),
    ((2, 3, 7, 9), (2, 3, 5, 4), "pytorch_half_pixel"),
    ((2, 3, 7, 9), (2, 3, 7, 17), "asymmetric"),  # one axis of scale 1
    ((1, 6, 5, 3), (1, 11, 9, 3), "half_pixel"),  # NHWC: dims 1-2
    ((6, 5), (13, 4), "half_pixel"),  # 2-D
    ((3, 4, 5), (5, 7, 9), "align_corners"),  # 3-D: trilinear
    ((1, 2, 3, 4, 5), (1, 2, 6, 3, 9), "half_pixel"),  # 5-D: trilinear
]


@pytest.mark.parametrize("shape, sizes, transform", RESIZES)
def test_resize_linear(shape: tuple[int, ...], sizes: tuple[int, ...], transform: str) -> None:
    x = randn(np.random.default_rng(len(shape)), *shape, scale=3.0)
    attrs = ResizeAttrs(ResizeMode.LINEAR, sizes, (), transform, "round_prefer_floor")
    onnx_attrs = {"mode": "linear", "coordinate_transformation_mode": transform}
    assert_bit_exact(Case("Resize", onnx_attrs, Op.RESIZE, attrs, {"x": x},
                          {"sizes": np.array(sizes, np.int64)}, order=["x"],
                          onnx_order=["x", "", "", "sizes"]))


CUBICS = [
    # input shape, output sizes, coordinate_transformation_mode, cubic_coeff_a, exclude_outside
    ((1, 3, 240, 240), (1, 3, 224, 224), "half_pixel", -0.75, 0),  # CrossViT's second branch
    ((2, 3, 7, 9), (2, 3, 20, 13), "align_corners", -0.75, 0),
    ((2, 3, 7, 9), (2, 3, 5, 4), "pytorch_half_pixel", -0.5, 0),
    ((2, 3, 7, 9), (2, 3, 7, 17), "asymmetric", -0.75, 1),  # one axis of scale 1
    ((1, 2, 10, 10), (1, 2, 23, 5), "half_pixel", -0.75, 1),
    ((6, 5), (13, 4), "half_pixel", -0.6, 0),  # 2-D
]


@pytest.mark.parametrize("shape, sizes, transform, a, exclude", CUBICS)
def test_resize_cubic(shape: tuple[int, ...], sizes: tuple[int, ...], transform: str, a: float,
                      exclude: int) -> None:
    x = randn(np.random.default_rng(len(shape)), *shape, scale=3.0)
    x[..., 0, :] = -0.0  # ORT's sums start from +0: -0 terms alone sum to +0
    attrs = ResizeAttrs(ResizeMode.CUBIC, sizes, (), transform, "round_prefer_floor", a,
                        bool(exclude))
    onnx_attrs = {"mode": "cubic", "coordinate_transformation_mode": transform,
                  "cubic_coeff_a": a, "exclude_outside": exclude}
    case = Case("Resize", onnx_attrs, Op.RESIZE, attrs, {"x": x},
                {"sizes": np.array(sizes, np.int64)}, order=["x"],
                onnx_order=["x", "", "", "sizes"])
    ours, ref = run_ours(case)[0], run_ort(case)[0]
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_resize_cubic_scales() -> None:
    """Scales given (not sizes): the coordinates use the scale itself, not out / in."""
    x = randn(np.random.default_rng(3), 1, 2, 9, 11, scale=3.0)
    scales = (1.0, 1.0, 1.7, 0.6)
    sizes = (1, 2, 15, 6)
    attrs = ResizeAttrs(ResizeMode.CUBIC, sizes, scales, "half_pixel")
    assert_bit_exact(Case("Resize", {"mode": "cubic"}, Op.RESIZE, attrs, {"x": x},
                          {"scales": np.array(scales, F32)}, order=["x"],
                          onnx_order=["x", "", "scales"]))


@needs_avx512
def test_gelu() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([randn(rng, 20000, scale=4.0), np.linspace(-9, 9, 20001, dtype=F32),
                        np.array([0.0, -0.0, 1.30372, 5.5508, math.inf, -math.inf, math.nan,
                                  1e-40, -3e38], F32)])
    assert_bit_exact(Case("Gelu", {}, Op.GELU, GeluAttrs(), {"x": x}, opset=20))


@pytest.mark.parametrize("shape, axis", [((2, 10), 1), ((2, 3, 4), 1), ((5, 3), 0),
                                         ((4, 4, 16, 16), -1), ((3, 17), 1), ((2, 3, 100), 2),
                                         ((2, 1000), -1)])
@pytest.mark.parametrize("op", [Op.SOFTMAX, Op.LOG_SOFTMAX])
def test_softmax(shape: tuple[int, ...], axis: int, op: Op) -> None:
    """x.flat[0] = 80 sends the rest of its row below exp's range, where the two MLAS kernels
    part (subnormal against 0). LogSoftmax takes the C library's logf of the sum (glibc's
    differs from float32's nearest value in some rows of these)."""
    if MLAS_SOFTMAX_KERNEL == "fma3" and not {"avx2", "fma"} <= FLAGS:
        pytest.skip("MLAS's SSE softmax kernel is not mirrored")
    x = randn(np.random.default_rng(len(shape) + axis), *shape, scale=4.0)
    x.flat[0] = 80.0
    assert_bit_exact(Case(op.value, {"axis": axis}, op, AxisAttrs(axis), {"x": x}, opset=13))


@needs_avx2
@pytest.mark.parametrize("norm", [1, 2, 5, 7, 8, 9, 13, 16, 64, 100, 257])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(norm: int, bias: bool) -> None:
    """n < 8: ONNX Runtime's scalar Welford loop; n >= 8: MlasLayerNormKernelAvx2."""
    rng = np.random.default_rng(norm)
    constants = {"scale": randn(rng, norm)}
    if bias:
        constants["bias"] = randn(rng, norm)
    x = randn(rng, 3, 40, norm, scale=2.0) + F32(1)
    assert_bit_exact(Case("LayerNormalization", {"axis": -1, "epsilon": 1e-5}, Op.LAYER_NORM,
                          LayerNormAttrs(2, 1e-5), {"x": x}, constants, n_outputs=3, opset=17))


@needs_avx2
def test_layer_norm_over_two_axes() -> None:
    rng = np.random.default_rng(7)
    constants = {"scale": randn(rng, 5, 6), "bias": randn(rng, 5, 6)}
    x = randn(rng, 2, 4, 5, 6, scale=2.0)
    assert_bit_exact(Case("LayerNormalization", {"axis": 2, "epsilon": 1e-3}, Op.LAYER_NORM,
                          LayerNormAttrs(2, 1e-3), {"x": x}, constants, n_outputs=3, opset=17))


def test_softmax_kernels_part_below_exp_range() -> None:
    """The AVX-512F kernel scales by 2^r with vscalefps (subnormals kept), the FMA3 kernel builds
    2^r from integer bits, and 2^-127 comes out as 0: the same row, two results."""
    x = np.array([[0.0, -87.5, -88.0, -90.0, -1.0]], F32)
    wide, narrow = softmax_last_axis(x, "avx512f"), softmax_last_axis(x, "fma3")
    assert np.all((wide[0, 1:4] > 0) & (wide[0, 1:4] < np.finfo(F32).tiny))
    np.testing.assert_array_equal(narrow[0, 2:4], 0)  # r = round(x / ln2) = -127
    np.testing.assert_array_equal(wide[0, [0, 1, 4]], narrow[0, [0, 1, 4]])
