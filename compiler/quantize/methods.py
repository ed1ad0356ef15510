"""Calibration methods: a tensor's histogram → its real range [lo, hi] → (scale, zero point).

After Caffe2 DNNLOWP (pytorch ``caffe2/quantization/server``), whose formulas are followed:

- ``minmax`` (dnnlowp.cc ``MIN_MAX_QUANTIZATION``): ``[min(x), max(x)]``.
- ``percentile`` (p99.cc): with ``zero_bin = ceil(-lo / w)`` (w = bin width), the smallest
  ``width`` such that bins ``[zero_bin - width, zero_bin + width]`` hold at least ``p`` of the
  values (bins ``[0, width - 1]`` when the histogram starts at 0); range ``[lo + w·(zero_bin -
  width), lo + w·(zero_bin + width + 1)]`` (``[lo, lo + w·width]``). DNNLOWP's default p = 0.99;
  qfuse defaults to 0.9999 (0.99 clips 1 % of every post-ReLU tensor).
- ``l2`` (norm_minimization.cc ``ChooseQuantizationParams``): map src bins ``[start, start +
  width)`` onto ``D = 2^bits`` dst bins of width ``dw = width/D``; every value is represented by
  the centre of its dst bin (values outside by the first / last centre); values are uniform
  within a src bin. Minimise over (start, width) the error::

      E = Σ_d ∫_{region d} ρ(t) (t - c_d)² dt,   c_d = start + (d + ½)·dw,

  region d = [start + d·dw, start + (d+1)·dw), the first reaching down to 0 and the last up to
  the histogram's end. The range is ``[lo + w·start, lo + w·(start + width)]``.
- ``kl`` (kl_minimization.cc): for the same candidates, P = the histogram with the values
  below / above the range added to its first / last bin; Q spreads each dst bin's in-range mass
  evenly over the part of it where P is non-zero; minimise KL(P‖Q) =
  ``Σ p·log(p/q)``. The range is ``[lo + w·(start + ½), lo + w·(start + width + ½)]`` (as
  kl_minimization.cc writes it). Src bins are split between dst bins by their exact overlap.

Both searches are brute force over every (start, width) as in DNNLOWP, evaluated in closed form
from prefix sums of the histogram (O(D) per candidate, not O(bins)); on histograms of more than
``COARSE_BINS`` bins, coarse to fine (``_search``). With ``symmetric`` (DNNLOWP's ``preserve_sparsity``) only ranges starting at 0
(a histogram starting at 0) or centred on the zero bin are searched.

(scale, zero point) from a range (fbgemm ``ChooseQuantizationParams``, src/QuantUtils.cc):
extend [lo, hi] to contain 0; ``scale = (hi - lo) / (qmax - qmin)``; zero point from the end
with the smaller rounding error, nudged into [qmin, qmax]. Symmetric: s8 zero point 0 and
``scale = max(-lo/128, hi/127)``; u8 zero point 128 when the range straddles 0.

Per-channel scales with one zero point (``channel_scales``; depthwise inputs, placement.py):
the tensor's (scale, zero point) as above from its range [lo, hi]; channel c's range
[lo_c, hi_c] (its min / max, clipped to [lo, hi], extended to contain 0) gets the smallest
scale that keeps it on the grid at that zero point:
``s_c = max(hi_c / (qmax - zp), lo_c / (qmin - zp))`` (a term dropped when its denominator is
0, where the tensor's range has no room either). The channel's ends are never clipped, so a
channel whose range is set by the end the rounded zero point left short can get a scale a
little above the tensor's (the tensor itself clips there, up to half a step: measured on the
real zoo, covering the end is the better choice, PP-LCNet's HardSwish minimum -0.375 in
almost every channel); a channel that is all zero keeps the tensor's scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from qfuse.compiler.quantize.histogram import Histogram

METHODS = ("minmax", "percentile", "l2", "kl")
COARSE_BINS = 64
_CHUNK = 2048  # candidates evaluated at once (memory: chunk × D float64 per array)


# ----------------------------------------------------------------------- scale and zero point
def choose_qparams(lo: float, hi: float, qmin: int, qmax: int,
                   symmetric: bool = False) -> tuple[float, int]:
    """(scale, zero point) for the real range [lo, hi] (module docstring)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric and lo < 0:
        half = (qmax - qmin + 1) // 2  # 128
        scale = max(-lo / half, hi / (half - 1))
        zp = (qmin + qmax + 1) // 2  # s8: 0, u8: 128
        return _safe_scale(scale), zp
    if symmetric and qmin < 0:  # s8 symmetric on a non-negative range: zero point 0
        return _safe_scale(hi / qmax), 0
    scale = _safe_scale((hi - lo) / (qmax - qmin))
    from_min, from_max = qmin - lo / scale, qmax - hi / scale
    err_min, err_max = abs(qmin) + abs(lo / scale), abs(qmax) + abs(hi / scale)
    zp = from_min if err_min < err_max else from_max
    return scale, int(min(max(np.rint(zp), qmin), qmax))


def channel_scales(ch_lo: np.ndarray, ch_hi: np.ndarray, lo: float, hi: float, scale: float,
                   zero_point: int, qmin: int, qmax: int) -> np.ndarray:
    """Per-channel float32 scales at the common ``zero_point`` (module docstring)."""
    c_lo = np.minimum(np.maximum(np.asarray(ch_lo, np.float64), lo), 0.0)
    c_hi = np.maximum(np.minimum(np.asarray(ch_hi, np.float64), hi), 0.0)
    s = np.zeros_like(c_lo)
    if qmax > zero_point:
        s = np.maximum(s, c_hi / (qmax - zero_point))
    if qmin < zero_point:
        s = np.maximum(s, c_lo / (qmin - zero_point))
    s = s.astype(np.float32)
    return np.where(s >= np.finfo(np.float32).tiny, s, np.float32(scale)).astype(np.float32)


def _safe_scale(scale: float) -> float:
    scale = float(np.float32(scale))
    return 0.1 if scale == 0.0 or math.isinf(1.0 / scale) else scale  # as fbgemm does


# ------------------------------------------------------------------------------- the methods
def minmax_range(hist: Histogram) -> tuple[float, float]:
    return hist.min, hist.max


def percentile_range(hist: Histogram, p: float = 0.9999) -> tuple[float, float]:
    """p99.cc with threshold ``p`` (fraction of values kept)."""
    h, lo, w = hist.counts, hist.lo, hist.bin_width
    n, total = len(h), h.sum()
    if total == 0 or w == 0:
        return hist.min, hist.max
    cdf = np.concatenate([[0.0], np.cumsum(h)])
    if lo == 0:
        widths = np.arange(n)
        kept = cdf[np.clip(widths, 0, n)]  # bins [0, width - 1]
        best = int(np.argmax(kept / total >= p)) if np.any(kept / total >= p) else n - 1
        return lo, lo + w * best
    zero_bin = math.ceil(-lo / w)
    widths = np.arange(n)
    begin, end = np.maximum(0, zero_bin - widths), np.minimum(n - 1, zero_bin + widths)
    kept = cdf[end + 1] - cdf[begin]
    ok = kept / total >= p
    best = int(np.argmax(ok)) if ok.any() else n - 1
    return lo + w * (zero_bin - best), lo + w * (zero_bin + best + 1)


def l2_range(hist: Histogram, bits: int = 8, symmetric: bool = False) -> tuple[float, float]:
    start, width = _search(hist, l2_error, bits, symmetric)
    return hist.lo + hist.bin_width * start, hist.lo + hist.bin_width * (start + width)


def kl_range(hist: Histogram, bits: int = 8, symmetric: bool = False) -> tuple[float, float]:
    start, width = _search(hist, kl_divergence, bits, symmetric)
    return (hist.lo + hist.bin_width * (start + 0.5),
            hist.lo + hist.bin_width * (start + width + 0.5))


def select_range(hist: Histogram, method: str, *, bits: int = 8, symmetric: bool = False,
                 percentile: float = 0.9999) -> tuple[float, float]:
    """The range ``method`` picks, never wider than the values seen (and 0)."""
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose one of "
                         f"{', '.join(METHODS)}")
    if hist.bin_width == 0 or hist.counts.sum() == 0 or method == "minmax":
        return minmax_range(hist)
    hist = hist.trimmed()
    if method == "percentile":
        lo, hi = percentile_range(hist, percentile)
    elif method == "l2":
        lo, hi = l2_range(hist, bits, symmetric)
    else:
        lo, hi = kl_range(hist, bits, symmetric)
    return max(lo, min(hist.min, 0.0)), min(hi, max(hist.max, 0.0))


# --------------------------------------------------------------------------- the search
Objective = Callable[[np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]


def _candidates_all(n: int) -> tuple[np.ndarray, np.ndarray]:
    width = np.concatenate([np.full(n - k + 1, k) for k in range(1, n + 1)])
    start = np.concatenate([np.arange(n - k + 1) for k in range(1, n + 1)])
    return start, width


def _candidates_symmetric(hist: Histogram, n: int) -> tuple[np.ndarray, np.ndarray]:
    width = np.arange(1, n + 1)
    if hist.lo == 0:
        return np.zeros(n, np.int64), width
    zero_bin = round(-hist.lo / (hist.hi - hist.lo) * n)
    return zero_bin - width // 2, width


def _best(h: np.ndarray, start: np.ndarray, width: np.ndarray, objective: Objective,
          dst: int) -> tuple[int, int]:
    best_value, best = math.inf, (0, len(h))
    for i in range(0, len(start), _CHUNK):
        s, w = start[i:i + _CHUNK], width[i:i + _CHUNK]
        values = objective(h, s, w, dst)
        j = int(np.argmin(values))
        if values[j] < best_value:  # first minimum wins (DNNLOWP's strict <)
            best_value, best = float(values[j]), (int(s[j]), int(w[j]))
    return best


def _search(hist: Histogram, objective: Objective, bits: int,
            symmetric: bool) -> tuple[int, int]:
    """(start_bin, nbins_selected) on ``hist`` minimising ``objective``.

    A histogram of at most COARSE_BINS bins is searched whole. A larger one is padded with
    empty bins to COARSE_BINS·2^k bins and searched coarse to fine: every candidate on the
    bins merged to COARSE_BINS, then at 4× (last 2×) finer bins only the ends within one
    coarser bin of the best so far."""
    h = hist.counts.astype(np.float64)
    n, dst = len(h), 1 << bits
    if symmetric:
        start, width = _candidates_symmetric(hist, n)
        return _best(h, start, width, objective, dst)
    if n <= COARSE_BINS:
        return _best(h, *_candidates_all(n), objective, dst)
    factor = 1 << math.ceil(math.log2(n / COARSE_BINS))
    padded = np.concatenate([h, np.zeros(factor * COARSE_BINS - n)])
    s, w = _best(padded.reshape(-1, factor).sum(axis=1), *_candidates_all(COARSE_BINS),
                 objective, dst)
    while factor > 1:
        ratio = min(4, factor)
        factor //= ratio
        level = padded.reshape(-1, factor).sum(axis=1) if factor > 1 else padded
        m = len(level)
        begin = np.arange(max(0, (s - 1) * ratio), min(m - 1, (s + 1) * ratio) + 1)
        end = np.arange(max(1, (s + w - 1) * ratio), min(m, (s + w + 1) * ratio) + 1)
        bb, ee = np.meshgrid(begin, end, indexing="ij")
        keep = ee > bb
        s, w = _best(level, bb[keep], (ee - bb)[keep], objective, dst)
    return s, w


# ------------------------------------------------------ integrals of a piecewise-constant density
def _prefix(dens: np.ndarray, kmax: int) -> list[np.ndarray]:
    """pre[k][s] = ∫_0^s ρ(t)·t^k dt at the integer bin edges, ρ = dens[s] on [s, s+1)."""
    s = np.arange(len(dens) + 1, dtype=np.float64)
    return [np.concatenate([[0.0], np.cumsum(dens * (s[1:] ** (k + 1) - s[:-1] ** (k + 1))
                                             / (k + 1))]) for k in range(kmax + 1)]


def _at(prefix: list[np.ndarray], dens: np.ndarray, x: np.ndarray) -> list[np.ndarray]:
    """∫_0^x ρ(t)·t^k dt for every k of ``prefix`` (ρ = 0 outside [0, n))."""
    n = len(dens)
    x = np.clip(x, 0.0, n)
    fl = np.minimum(np.floor(x).astype(np.int64), n - 1)
    f = fl.astype(np.float64)
    d = dens[fl]
    xp, fp = x.copy(), f.copy()
    out = []
    for k, pre in enumerate(prefix):
        out.append(pre[fl] + d * (xp * x - fp * f) / (k + 1) if k else pre[fl] + d * (x - f))
        if k:
            xp, fp = xp * x, fp * f
    return out


def _edges(start: np.ndarray, width: np.ndarray, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """Dst bin edges (candidates × dst+1) and the dst bin width (candidates × 1), bin units."""
    dw = width.astype(np.float64)[:, None] / dst
    return start.astype(np.float64)[:, None] + np.arange(dst + 1)[None, :] * dw, dw


def l2_error(h: np.ndarray, start: np.ndarray, width: np.ndarray, dst: int) -> np.ndarray:
    """DNNLOWP's L2 error (module docstring) of each candidate, in bin units: per dst region
    ``M2 - 2c·M1 + c²·M0`` with ``M_k = ∫ ρ t^k`` over the region."""
    edges, dw = _edges(start, width, dst)
    c = edges[:, :-1] + dw / 2
    edges[:, 0], edges[:, -1] = -np.inf, np.inf  # outside values go to the first / last centre
    m0, m1, m2 = (np.diff(m, axis=1) for m in _at(_prefix(h, 2), h, edges))
    return np.sum(m2 - 2 * c * m1 + c * c * m0, axis=1)


def _overlap(bin_index: np.ndarray, edges: np.ndarray) -> np.ndarray:
    s = bin_index.astype(np.float64)[:, None]
    return np.clip(np.minimum(s + 1, edges[:, 1:]) - np.maximum(s, edges[:, :-1]), 0.0, None)


def _xlogx(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def kl_divergence(h: np.ndarray, start: np.ndarray, width: np.ndarray, dst: int) -> np.ndarray:
    """DNNLOWP's KL(P‖Q) (module docstring) of each candidate.

    With g = P's counts (h plus the outliers on the two edge bins) and, per dst bin, S = ∫h
    (its in-range mass) and Z = ∫[g > 0] (its non-zero length): p/q = g·Z/S, so the dst bin
    contributes ``∫ g·log g + (log Z - log S)·∫ g`` (divided by the total count).
    """
    n, total = len(h), float(h.sum())
    cdf = np.concatenate([[0.0], np.cumsum(h)])
    left = cdf[np.clip(start, 0, n)]
    right = total - cdf[np.clip(start + width, 0, n)]
    s0, s1 = np.maximum(start, 0), np.minimum(start + width - 1, n - 1)
    same = s0 == s1
    g0 = h[s0] + left + np.where(same, right, 0.0)
    g1 = h[s1] + right
    edges, _ = _edges(start, width, dst)
    ov0, ov1 = _overlap(s0, edges), np.where(same[:, None], 0.0, _overlap(s1, edges))
    nz = (h > 0).astype(np.float64)
    hl = _xlogx(h)
    mass = np.diff(_at(_prefix(h, 0), h, edges)[0], axis=1)
    hlogh = np.diff(_at(_prefix(hl, 0), hl, edges)[0], axis=1)
    nonzero = np.diff(_at(_prefix(nz, 0), nz, edges)[0], axis=1)
    g_mass = mass + ov0 * (g0 - h[s0])[:, None] + ov1 * (g1 - h[s1])[:, None]
    g_logg = (hlogh + ov0 * (_xlogx(g0) - hl[s0])[:, None]
              + ov1 * (_xlogx(g1) - hl[s1])[:, None])
    g_nonzero = (nonzero + ov0 * ((g0 > 0) - nz[s0])[:, None]
                 + ov1 * ((g1 > 0) - nz[s1])[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        term = g_logg + g_mass * (np.log(g_nonzero) - np.log(mass))
    term = np.where(g_mass > 0, term, 0.0)
    term = np.where((g_mass > 0) & (mass <= 0), np.inf, term)
    return np.sum(term, axis=1) / total
