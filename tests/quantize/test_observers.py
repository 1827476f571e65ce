"""Streaming statistics: growing histograms merge exactly, memory is fixed, thresholds behave."""

import numpy as np
import pytest
from infc.compiler.quantize.observers import Histogram, MinMax, kl_threshold_bins

RNG = np.random.default_rng(0)


def test_minmax_tracks_the_running_range():
    observer = MinMax()
    for scale in (1.0, 3.0, 0.5):
        observer.update(RNG.standard_normal(100) * scale)
    assert observer.range()[0] < -3 and observer.range()[1] > 3
    assert MinMax().range() == (0.0, 0.0)


def test_growing_range_merges_bins_exactly_as_one_histogram_would():
    batches = [RNG.standard_normal(1000) * scale for scale in (1.0, 2.5, 9.0, 4.0)]
    streamed = Histogram(num_bins=256)
    for batch in batches:
        streamed.update(batch)
    everything = np.concatenate(batches)
    growth = streamed.limit / np.abs(batches[0]).astype(np.float32).max()
    assert growth == pytest.approx(round(growth)) and growth > 1 and streamed.limit >= np.abs(everything).max()
    edges_positive = np.histogram(everything[everything >= 0], bins=256, range=(0, streamed.limit))[0]
    edges_negative = np.histogram(-everything[everything < 0], bins=256, range=(0, streamed.limit))[0]
    for merged, direct in ((streamed.positive, edges_positive), (streamed.negative, edges_negative)):
        # the same counts, up to a value sitting on a bin edge (float32 vs float64 rounding)
        assert merged.sum() == direct.sum() and np.abs(merged - direct).max() <= 1
        assert np.count_nonzero(merged != direct) <= 4
    assert streamed.positive.shape == (256,)  # fixed memory however much data came in


def test_percentile_clips_rare_outliers_per_side():
    data = np.concatenate([RNG.uniform(-1, 2, 100_000), [50.0]])
    observer = Histogram()
    observer.update(data)
    lo, hi = observer.percentile_range(99.9)
    assert lo == pytest.approx(data.min()) and 1.9 < hi < 2.1
    assert observer.percentile_range(100.0)[1] == pytest.approx(50.0)


def test_entropy_threshold_cuts_a_long_tail_but_keeps_the_bulk():
    data = np.concatenate([RNG.standard_normal(200_000), RNG.uniform(-60, 60, 20)])
    observer = Histogram()
    observer.update(data)
    lo, hi = observer.entropy_range()
    assert 3.0 < hi < 30.0 and lo == pytest.approx(-hi)


def test_kl_threshold_keeps_everything_for_a_flat_distribution():
    assert kl_threshold_bins(np.ones(2048)) == 2048


def test_non_finite_values_are_ignored():
    observer = Histogram()
    observer.update(np.array([1.0, np.inf, -np.nan, -2.0]))
    assert observer.range() == (-2.0, 1.0)
