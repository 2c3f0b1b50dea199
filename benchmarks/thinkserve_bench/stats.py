"""Latency statistics from raw samples.

Every percentile is computed from the raw per-query samples of one run (never averaged across runs, routes or
levels), by linear interpolation between closest ranks (numpy's default, Hyndman-Fan type 7): for n sorted
samples the p-th percentile sits at rank p/100 * (n - 1). Throughput and goodput are counts over the wall time
of the measured window (warm-up excluded), measured on the monotonic clock by the caller.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def percentile(samples: Sequence[float], p: float) -> Optional[float]:
    """The p-th percentile (0..100) of raw samples; None without samples."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside 0..100")
    if len(samples) == 0:
        return None
    return float(np.percentile(np.asarray(samples, dtype=np.float64), p))


def distribution(samples_ms: Iterable[float]) -> dict:
    """count, mean, min, max and p50/p90/p95/p99 of raw millisecond samples (None values when empty)."""
    values = np.asarray(list(samples_ms), dtype=np.float64)
    out: dict = {"count": int(values.size)}
    if values.size == 0:
        out.update({"mean_ms": None, "min_ms": None, "max_ms": None, **{f"p{p}_ms": None for p in PERCENTILES}})
        return out
    out.update({"mean_ms": float(values.mean()), "min_ms": float(values.min()), "max_ms": float(values.max())})
    for p in PERCENTILES:
        out[f"p{p}_ms"] = float(np.percentile(values, p))
    return out


def gaps_ms(arrivals_s: Sequence[float]) -> list[float]:
    """Successive differences of arrival times (seconds in, milliseconds out): inter-token latencies."""
    return [(later - earlier) * 1000.0 for earlier, later in zip(arrivals_s, arrivals_s[1:])]


def rate(count: int, wall_s: float) -> float:
    """Events per second over a measured window."""
    if wall_s <= 0:
        raise ValueError("the measured window must have a positive length")
    return count / wall_s


def goodput(latencies_ms: Sequence[Optional[float]], slo_ms: float, wall_s: float) -> float:
    """Queries per second that succeeded within the SLO: a failed query is None and never counts."""
    good = sum(1 for latency in latencies_ms if latency is not None and latency <= slo_ms)
    return rate(good, wall_s)


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """numerator / denominator, None when either is missing or the denominator is zero."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def saving(candidate: float, baseline: float) -> Optional[float]:
    """Relative saving of candidate against baseline: 0.4 means 40% cheaper; negative means dearer."""
    if baseline == 0:
        return None
    return 1.0 - candidate / baseline


def summarize(samples_s: list[float], items_per_sample: int = 1) -> dict:
    """distribution() of samples in seconds, in milliseconds, and the throughput of a closed loop with one request
    in flight: items done / time spent."""
    samples_ms = [s * 1000.0 for s in samples_s]
    return {**distribution(samples_ms), "items_per_s": items_per_sample * len(samples_s) / sum(samples_s)}


def call_latency_summary(seconds: Sequence[float]) -> dict:
    """calls, and p50, p95 and mean in milliseconds, of raw per-call seconds (the GPU runner's rows)."""
    if len(seconds) == 0:
        return {"calls": 0, "p50_ms": None, "p95_ms": None, "mean_ms": None}
    samples_ms = [1000.0 * s for s in seconds]
    return {"calls": len(samples_ms), "p50_ms": percentile(samples_ms, 50), "p95_ms": percentile(samples_ms, 95),
            "mean_ms": float(np.mean(samples_ms))}
