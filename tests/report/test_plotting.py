"""Decimation: bounded point counts, spikes kept, streaming agrees with the one-shot version."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbtrainer.plotting import Ema, MinMaxStream, decimate, minmax_indices


def test_minmax_indices_bounds_and_keeps_spikes():
    rng = np.random.default_rng(0)
    y = rng.normal(size=1_000_003)
    y[123_456], y[987_654] = 80.0, -80.0
    idx = minmax_indices(y, 2000)
    assert len(idx) <= 2000 and np.all(np.diff(idx) > 0)
    assert 123_456 in idx and 987_654 in idx
    assert minmax_indices(y[:1500], 2000).tolist() == list(range(1500))  # short series untouched


def test_minmax_indices_several_rows_share_the_budget():
    y = np.zeros((3, 10_000))
    y[0, 10], y[1, 5000], y[2, 9999] = 1, -1, 2
    idx = minmax_indices(y, 600)
    assert len(idx) <= 600 and {10, 5000, 9999} <= set(idx.tolist())


@pytest.mark.parametrize("chunk", [1, 7, 1000, 250_000])
def test_stream_bounds_points_and_keeps_spikes_for_a_million_steps(chunk):
    n = 1_000_000 if chunk >= 1000 else 20_000
    x = np.arange(1, n + 1, dtype=float)
    y = np.sin(x / 500.0)
    spikes = {n // 3: 50.0, n // 2: -50.0, n - 1: 30.0}
    for i, v in spikes.items():
        y[i] = v
    s = MinMaxStream(2000)
    for start in range(0, n, chunk):
        s.extend(x[start : start + chunk], y[start : start + chunk])
    px, py = s.points()
    assert s.count == n and len(px) <= 2000
    assert np.all(np.diff(px) > 0), "points stay in x order"
    for i, v in spikes.items():
        assert x[i] in px and v in py
    assert py.max() == y.max() and py.min() == y.min()
    # the whole range is covered: first and last buckets are present
    assert px[0] <= x[s.width] and px[-1] >= x[-s.width - 1]


def test_stream_nonfinite_values_are_skipped_not_drawn():
    s = MinMaxStream(100)
    s.extend([1, 2, 3, 4], [1.0, math.nan, math.inf, 0.5])
    px, py = s.points()
    assert np.isfinite(py).all() and set(px.tolist()) == {1.0, 4.0}


def test_decimate_and_ema():
    x, _y = decimate(range(10), [float(v) for v in range(10)], 4)
    assert len(x) <= 4 and 0 in x and 9 in x
    ema = Ema(0.5)
    assert ema.extend([2.0, 2.0]) == pytest.approx([2.0, 2.0])  # debiased: no warm-up bias towards 0
    assert math.isnan(ema.extend([math.nan])[0]) and ema.extend([2.0]) == pytest.approx([2.0])
