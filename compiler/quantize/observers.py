"""Streaming activation statistics with memory independent of the amount of calibration data.

`MinMax` keeps two numbers. `Histogram` keeps a fixed number of bins for |x| on each side of zero
over [0, R]; when a batch exceeds R, R grows by an integer factor f and old bins merge f to one
(bin i -> i // f): exact, since the new bin edges are old edges. Thresholds then come from the
merged counts: a percentile of |x|, or the KL-divergence (entropy) choice of TensorRT's calibrator.
"""

from __future__ import annotations

import math

import numpy as np

NUM_BINS = 2048
NUM_QUANTIZED_BINS = 128  # levels of one side of an 8-bit grid: the entropy search's target
ENTROPY_STRIDE = 16  # candidate thresholds every 16 bins: ~120 candidates, each O(NUM_BINS)


class MinMax:
    def __init__(self):
        self.lo, self.hi = math.inf, -math.inf

    def update(self, x: np.ndarray) -> None:
        if x.size:
            self.lo = min(self.lo, float(x.min()))
            self.hi = max(self.hi, float(x.max()))

    def range(self) -> tuple[float, float]:
        return (self.lo, self.hi) if self.lo <= self.hi else (0.0, 0.0)


class Histogram(MinMax):
    def __init__(self, num_bins: int = NUM_BINS):
        super().__init__()
        self.positive = np.zeros(num_bins, dtype=np.int64)  # |x| of x >= 0
        self.negative = np.zeros(num_bins, dtype=np.int64)  # |x| of x < 0
        self.limit = 0.0  # R: the histograms cover [0, R]

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32).ravel()
        x = x[np.isfinite(x)]
        if not x.size:
            return
        super().update(x)
        largest = float(np.abs(x).max())
        if self.limit == 0.0:
            self.limit = largest or 1.0
        elif largest > self.limit:
            factor = math.ceil(largest / self.limit)
            self.positive, self.negative = self._merged(self.positive, factor), self._merged(self.negative, factor)
            self.limit *= factor
        bins = len(self.positive)
        index = np.minimum((np.abs(x) * (bins / self.limit)).astype(np.int64), bins - 1)
        index += bins * (x < 0)  # one bincount for both sides: [positive bins | negative bins]
        counts = np.bincount(index, minlength=2 * bins)
        self.positive += counts[:bins]
        self.negative += counts[bins:]

    @staticmethod
    def _merged(counts: np.ndarray, factor: int) -> np.ndarray:
        bins = len(counts)
        return np.bincount(np.arange(bins) // factor, weights=counts, minlength=bins)[:bins].astype(np.int64)

    def _clipped(self, threshold: float) -> tuple[float, float]:
        lo, hi = self.range()
        return max(lo, -threshold), min(hi, threshold)

    def percentile_range(self, percentile: float) -> tuple[float, float]:
        counts = self.positive + self.negative
        total = counts.sum()
        if total == 0:
            return self.range()
        index = int(np.searchsorted(np.cumsum(counts), total * percentile / 100.0))
        return self._clipped((min(index, len(counts) - 1) + 1) * self.limit / len(counts))

    def entropy_range(self) -> tuple[float, float]:
        counts = (self.positive + self.negative).astype(np.float64)
        if counts.sum() == 0:
            return self.range()
        return self._clipped(kl_threshold_bins(counts) * self.limit / len(counts))


def kl_threshold_bins(counts: np.ndarray, num_quantized: int = NUM_QUANTIZED_BINS, stride: int = ENTROPY_STRIDE) -> int:
    """The number of leading bins whose 8-bit quantization keeps the distribution closest (KL)."""
    best_bins, best_kl = len(counts), math.inf
    for bins in list(range(num_quantized, len(counts), stride)) + [len(counts)]:
        reference = counts[:bins].copy()
        reference[-1] += counts[bins:].sum()  # outliers clip into the last bin
        group = np.arange(bins) * num_quantized // bins
        is_used = counts[:bins] > 0
        sums = np.bincount(group, weights=counts[:bins], minlength=num_quantized)
        used = np.bincount(group, weights=is_used, minlength=num_quantized)
        expanded = np.where(is_used, sums[group] / np.maximum(used[group], 1), 0.0)
        p, q = _smoothed(reference), _smoothed(expanded)
        kl = float(np.sum(p * np.log(p / q)))
        if kl < best_kl:
            best_bins, best_kl = bins, kl
    return best_bins


def _smoothed(counts: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """A probability distribution with no zero bin: eps moved onto empty bins from the others (as
    onnxruntime's and MXNet's entropy calibrators do), so the KL divergence stays finite."""
    is_zero = counts == 0
    num_zero, num_nonzero = int(is_zero.sum()), int((~is_zero).sum())
    p = counts / max(counts.sum(), 1e-30)
    if num_zero == 0 or num_nonzero == 0:
        return np.where(is_zero, eps, p)
    return np.where(is_zero, eps, p - eps * num_zero / num_nonzero).clip(min=eps * 1e-3)
