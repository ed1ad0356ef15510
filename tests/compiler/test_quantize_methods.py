"""Calibration methods (compiler/quantize/methods.py) against independent implementations of
DNNLOWP's formulas (pytorch caffe2/quantization/server: norm_minimization.cc,
kl_minimization.cc, p99.cc; fbgemm QuantUtils.cc ChooseQuantizationParams), and the one-pass
histogram against a histogram of all values at once."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnxruntime.quantization.quant_utils import compute_scale_zp

from qfuse.compiler.quantize.histogram import Histogram
from qfuse.compiler.quantize.methods import (
    _candidates_all,
    _search,
    choose_qparams,
    kl_divergence,
    l2_error,
    percentile_range,
    select_range,
)


def _hist(counts: list[float] | np.ndarray, lo: float, hi: float) -> Histogram:
    h = Histogram(len(counts))
    h.counts = np.asarray(counts, np.float64)
    h.lo, h.hi = lo, hi
    h.min, h.max = lo, hi
    return h


def _random_counts(rng: np.random.Generator, n: int) -> np.ndarray:
    counts = rng.integers(0, 50, n).astype(np.float64)
    counts[rng.random(n) < 0.3] = 0  # empty bins: P's zeros and Q's non-zero lengths
    counts[n // 3] += 400  # a peak, so narrow ranges win over the full one
    return counts


# --------------------------------------------------------------------------- L2 (brute force)
def l2_numeric(h: np.ndarray, start: int, width: int, dst: int, sub: int = 400) -> float:
    """∫ρ(t)·(t - centre(t))² by midpoint sampling: each bin's count spread over ``sub``
    points, each point represented by the centre of its (clamped) dst bin."""
    dw = width / dst
    total = 0.0
    for s, count in enumerate(h):
        if count == 0:
            continue
        t = s + (np.arange(sub) + 0.5) / sub
        d = np.clip(np.floor((t - start) / dw), 0, dst - 1)
        centre = start + (d + 0.5) * dw
        total += count / sub * float(np.sum((t - centre) ** 2))
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_l2_error_matches_numeric_integration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h = _random_counts(rng, 20)
    start, width = _candidates_all(len(h))
    ours = l2_error(h, start, width, 8)
    for i in rng.choice(len(start), 40, replace=False):
        ref = l2_numeric(h, int(start[i]), int(width[i]), 8)
        # midpoint rule error: O(1/sub²) of each sub-interval's quadratic
        assert ours[i] == pytest.approx(ref, rel=2e-3, abs=1e-3), (start[i], width[i])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_l2_search_finds_the_brute_force_minimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h = _random_counts(rng, 16)
    best = min((l2_numeric(h, s, w, 4, 200), s, w)
               for w in range(1, 17) for s in range(17 - w))
    s, w = _search(_hist(h, -1.0, 3.0), l2_error, 2, symmetric=False)
    assert l2_numeric(h, s, w, 4, 200) <= best[0] * (1 + 1e-6) + 1e-9


# --------------------------------------------------------------- KL (kl_minimization.cc loops)
def kl_loops(bins: np.ndarray, start_bin: int, nbins_selected: int, dst_nbins: int) -> float:
    """A line-by-line port of kl_minimization.cc's inner loops for one candidate."""
    nbins = len(bins)
    total_sum = float(bins.sum())
    left_outliers = float(bins[:start_bin].sum())
    right_outliers = float(bins[start_bin + nbins_selected:].sum())
    kl = 0.0
    for dst_bin in range(dst_nbins):
        non_zero_length = 0.0
        total = 0.0
        b_nr = start_bin + dst_bin * nbins_selected / dst_nbins
        e_nr = start_bin + (dst_bin + 1) * nbins_selected / dst_nbins
        b, e = int(b_nr), math.ceil(e_nr)
        fractions = {}
        for src_bin in range(b, e):
            if not 0 <= src_bin < nbins:
                continue
            fraction = 1.0
            if src_bin == b and src_bin == e - 1:
                fraction = e_nr - b_nr
            elif src_bin == b:
                fraction = (b + 1) - b_nr
            elif src_bin == e - 1:
                fraction = e_nr - (e - 1)
            fractions[src_bin] = fraction
            value = bins[src_bin] * fraction
            total += value
            if src_bin == max(start_bin, 0):
                value += left_outliers
            if src_bin == min(start_bin + nbins_selected - 1, nbins - 1):
                value += right_outliers
            if value > 0:
                non_zero_length += fraction
        for src_bin, fraction in fractions.items():
            value = float(bins[src_bin])
            if src_bin == max(start_bin, 0):
                value += left_outliers
            if src_bin == min(start_bin + nbins_selected - 1, nbins - 1):
                value += right_outliers
            value *= fraction
            if value > 0:
                p = value / total_sum
                q = total * fraction / non_zero_length / total_sum
                kl += p * math.log(p / q) if q > 0 else math.inf
    return kl


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dst", [4, 8])
def test_kl_divergence_matches_the_loops(seed: int, dst: int) -> None:
    rng = np.random.default_rng(seed)
    h = _random_counts(rng, 18)
    start, width = _candidates_all(len(h))
    ours = kl_divergence(h, start, width, dst)
    for i in range(len(start)):
        ref = kl_loops(h, int(start[i]), int(width[i]), dst)
        if math.isinf(ref):
            assert math.isinf(ours[i]), (start[i], width[i])
        else:
            assert ours[i] == pytest.approx(ref, rel=1e-9, abs=1e-12), (start[i], width[i])


def test_kl_search_returns_the_loops_minimum() -> None:
    h = _random_counts(np.random.default_rng(7), 24)
    best = min((kl_loops(h, s, w, 8), s, w) for w in range(1, 25) for s in range(25 - w))
    assert _search(_hist(h, -1.0, 5.0), kl_divergence, 3, symmetric=False) == best[1:]


# ----------------------------------------------------------------------------- percentile (p99)
def p99_loops(bins: np.ndarray, lo: float, hi: float, p: float) -> tuple[float, float]:
    """p99.cc, loop for loop."""
    nbins = len(bins)
    w = (hi - lo) / nbins
    zero_bin = math.ceil(-lo / w)
    total = float(bins.sum())
    best = 0
    for width in range(nbins):
        if lo == 0:
            i_begin, i_end = 0, width - 1
        else:
            i_begin, i_end = max(0, zero_bin - width), min(nbins - 1, zero_bin + width)
        if sum(bins[i_begin:i_end + 1]) / total >= p:
            best = width
            break
    if lo == 0:
        return lo, lo + w * best
    return lo + w * (zero_bin - best), lo + w * (zero_bin + best + 1)


@pytest.mark.parametrize("lo", [0.0, -1.0, -3.5])
@pytest.mark.parametrize("p", [0.9, 0.99])
def test_percentile_matches_p99_loops(lo: float, p: float) -> None:
    h = _random_counts(np.random.default_rng(3), 40)
    assert percentile_range(_hist(h, lo, 6.0), p) == pytest.approx(p99_loops(h, lo, 6.0, p))


# ------------------------------------------------------------------- scale and zero point
@pytest.mark.parametrize(("lo", "hi"), [(-1.0, 3.0), (0.0, 6.0), (-0.37, 0.011), (0.5, 2.0),
                                        (-5.0, -1.0)])
def test_choose_qparams_matches_onnxruntime(lo: float, hi: float) -> None:
    """ONNX Runtime's quantize_static MinMax: same scale, same zero point (u8 asymmetric)."""
    scale, zp = choose_qparams(lo, hi, 0, 255)
    ort_zp, ort_scale = compute_scale_zp(np.float32(min(lo, 0)), np.float32(max(hi, 0)),
                                         np.uint8(0), np.uint8(255))
    assert scale == pytest.approx(float(ort_scale), rel=1e-6)
    assert zp == int(ort_zp)


def test_choose_qparams_symmetric() -> None:
    assert choose_qparams(-1.0, 2.0, -128, 127, symmetric=True) == (pytest.approx(2 / 127), 0)
    assert choose_qparams(-2.56, 1.0, 0, 255, symmetric=True) == (pytest.approx(0.02), 128)
    assert choose_qparams(0.0, 2.55, 0, 255, symmetric=True) == (pytest.approx(0.01), 0)


# ---------------------------------------------------------------------------------- histogram
def test_one_pass_histogram_equals_the_histogram_of_everything() -> None:
    """Batches that widen the range merge bins exactly: the counts are those of all values
    binned on the final grid at once (up to values within float rounding of an edge)."""
    rng = np.random.default_rng(0)
    batches = [rng.normal(0.5, 0.1, 500), rng.normal(0, 3, 500), rng.uniform(-20, 1, 300),
               rng.uniform(0, 45, 300)]
    h = Histogram(256)
    for b in batches:
        h.add(b)
    everything = np.concatenate(batches)
    assert h.min == everything.min() and h.max == everything.max()
    assert h.lo <= min(everything.min(), 0) and h.hi >= everything.max()
    idx = np.clip(((everything - h.lo) / h.bin_width).astype(np.int64), 0, 255)
    direct = np.bincount(idx, minlength=256)
    assert h.counts.sum() == everything.size
    assert np.abs(h.counts - direct).sum() <= 4


def test_methods_stay_within_the_observed_range() -> None:
    rng = np.random.default_rng(1)
    h = Histogram(512)
    h.add(np.maximum(rng.standard_normal(20000), 0) * 3)
    h.add(rng.standard_normal(200))
    for method in ("minmax", "percentile", "l2", "kl"):
        lo, hi = select_range(h, method)
        assert min(h.min, 0) <= lo < hi <= h.max, method
    lo, hi = select_range(h, "l2")
    assert hi < h.max  # the long tail is clipped
