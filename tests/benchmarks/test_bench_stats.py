"""The bench's arithmetic on synthetic timings, against figures computed by hand."""

from __future__ import annotations

import math

import pytest

from thinkserve_bench.stats import distribution, gaps_ms, goodput, percentile, rate, ratio, saving


def test_percentiles_interpolate_between_closest_ranks():
    samples = [float(v) for v in range(10, 0, -1)]  # 10 .. 1, unsorted on purpose
    # rank = p/100 * (n - 1): p50 -> 4.5 -> between 5 and 6; p90 -> 8.1 -> 9 + 0.1; p99 -> 8.91 -> 9 + 0.91
    assert percentile(samples, 50) == pytest.approx(5.5)
    assert percentile(samples, 90) == pytest.approx(9.1)
    assert percentile(samples, 95) == pytest.approx(9.55)
    assert percentile(samples, 99) == pytest.approx(9.91)
    assert percentile(samples, 0) == 1.0 and percentile(samples, 100) == 10.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(samples, 101)


def test_distribution_of_raw_samples():
    d = distribution([10.0, 20.0, 30.0, 40.0])
    assert d["count"] == 4
    assert d["mean_ms"] == pytest.approx(25.0)
    assert d["p50_ms"] == pytest.approx(25.0)
    assert d["p90_ms"] == pytest.approx(37.0)  # rank 2.7: 30 + 0.7 * 10
    assert d["p95_ms"] == pytest.approx(38.5)
    assert d["p99_ms"] == pytest.approx(39.7)
    assert (d["min_ms"], d["max_ms"]) == (10.0, 40.0)
    empty = distribution([])
    assert empty["count"] == 0 and empty["p99_ms"] is None


def test_percentiles_pool_raw_samples_not_group_summaries():
    fast, slow = [1.0, 1.0, 1.0, 1.0], [100.0]
    pooled = distribution(fast + slow)
    mean_of_medians = (distribution(fast)["p50_ms"] + distribution(slow)["p50_ms"]) / 2
    assert pooled["p50_ms"] == 1.0 and mean_of_medians == 50.5
    assert pooled["p95_ms"] == pytest.approx(80.2)  # rank 3.8: 1 + 0.8 * 99


def test_inter_token_gaps_goodput_and_ratios():
    assert gaps_ms([0.0, 0.010, 0.025, 0.026]) == pytest.approx([10.0, 15.0, 1.0])
    assert gaps_ms([1.0]) == []
    # four queries in 2 s: one failed (None), one over the 5 s SLO
    assert goodput([100.0, 200.0, None, 6000.0], slo_ms=5000.0, wall_s=2.0) == pytest.approx(1.0)
    assert rate(30, 10.0) == 3.0
    with pytest.raises(ValueError):
        rate(1, 0.0)
    assert ratio(3.0, 4.0) == 0.75 and ratio(1.0, 0.0) is None and ratio(None, 2.0) is None
    assert saving(60.0, 100.0) == pytest.approx(0.4)
    assert saving(120.0, 100.0) == pytest.approx(-0.2)
    assert saving(1.0, 0.0) is None
    assert not math.isnan(distribution([5.0])["p99_ms"])
