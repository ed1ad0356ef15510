"""A one-pass histogram of a tensor's values over calibration batches.

After DNNLOWP's ``DynamicHistogram`` (pytorch caffe2/quantization/server/dynamic_histogram.cc):
the range grows when a batch falls outside it. Here the growth keeps the bins exact instead of
redistributing counts: the new bin width is an integer multiple ``k`` of the old one and the new
low edge sits on the old grid (``lo' = lo - j·w``), so old bin ``i`` lands wholly in new bin
``(i + j) // k``. The range always contains 0 (the quantized range must), and ``min`` / ``max``
are the exact extremes seen.
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_BINS = 2048


class Histogram:
    """Counts of ``nbins`` equal bins over [lo, hi] (values at hi go in the last bin)."""

    def __init__(self, nbins: int = DEFAULT_BINS) -> None:
        self.nbins = nbins
        self.counts = np.zeros(nbins, np.float64)
        self.lo = self.hi = 0.0
        self.min, self.max = math.inf, -math.inf

    @property
    def bin_width(self) -> float:
        return (self.hi - self.lo) / self.nbins

    def add(self, values: np.ndarray) -> None:
        x = np.asarray(values, np.float64).ravel()
        x = x[np.isfinite(x)]
        if x.size == 0:
            return
        vmin, vmax = float(x.min()), float(x.max())
        self.min, self.max = min(self.min, vmin), max(self.max, vmax)
        if self.hi == self.lo:  # first values: a range just covering them and 0
            lo, hi = min(vmin, 0.0), max(vmax, 0.0)
            if hi == lo:
                hi = lo + 1e-8
            self.lo, self.hi = lo, hi
        elif vmin < self.lo or vmax > self.hi:
            self._grow(min(vmin, self.lo), max(vmax, self.hi))
        w = self.bin_width
        idx = np.clip(((x - self.lo) / w).astype(np.int64), 0, self.nbins - 1)
        self.counts += np.bincount(idx, minlength=self.nbins)

    def _grow(self, need_lo: float, need_hi: float) -> None:
        w, n = self.bin_width, self.nbins
        below = math.ceil((self.lo - need_lo) / w - 1e-9) if need_lo < self.lo else 0
        j, k = below, 2  # new low edge lo - j·w; k old bins per new bin
        while self.lo - j * w + n * k * w < need_hi or j > n * (k - 1):
            k += 1
        merged = np.zeros(n, np.float64)
        np.add.at(merged, (np.arange(n) + j) // k, self.counts)
        self.counts = merged
        self.lo = self.lo - j * w
        self.hi = self.lo + n * k * w

    def trimmed(self) -> Histogram:
        """The same bins without the empty ones at either end (the bin holding 0 stays), so a
        method searches the observed range; DNNLOWP's ``Finalize`` rebins to [min, max]."""
        nonzero = np.flatnonzero(self.counts)
        if nonzero.size == 0 or self.bin_width == 0:
            return self
        w = self.bin_width
        zero = min(int((0.0 - self.lo) / w), self.nbins - 1)
        first, last = min(int(nonzero[0]), zero), max(int(nonzero[-1]), zero)
        out = Histogram(last - first + 1)
        out.counts = self.counts[first:last + 1].copy()
        out.lo, out.hi = self.lo + first * w, self.lo + (last + 1) * w
        out.min, out.max = self.min, self.max
        return out
