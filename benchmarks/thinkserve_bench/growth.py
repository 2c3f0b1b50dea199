"""Does a series grow? A least-squares slope after the warm-up, per hour and as a share of the series' level,
instead of eyeballing a plot.

Memory that settles (allocator arenas filling, caches reaching their bound) rises early and then stays: the
warm-up is left out, and the slope of what follows is compared with the level the fit gives at its start. A
leak of a few KiB per query shows as a steady slope however noisy the samples; a single step (one more arena)
shows as a small slope spread over the run. `flat` is the verdict against a limit in percent per hour.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def slope_per_hour(times_s: Sequence[float], values: Sequence[float]) -> Optional[dict]:
    """{slope_per_h, level, pct_per_h, samples, first, last, min, max} of the least-squares line through the
    samples (times in seconds); None with fewer than 3 samples or no spread in time."""
    t = np.asarray(times_s, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if t.size < 3 or float(np.ptp(t)) <= 0:
        return None
    slope, intercept = np.polyfit(t - t[0], v, 1)
    level = float(intercept)
    per_hour = float(slope) * 3600.0
    return {
        "samples": int(t.size), "slope_per_h": per_hour, "level": level,
        "pct_per_h": 100.0 * per_hour / level if level else None,
        "first": float(v[0]), "last": float(v[-1]), "min": float(v.min()), "max": float(v.max()),
        "span_h": float(np.ptp(t)) / 3600.0,
    }


def verdict(times_s: Sequence[float], values: Sequence[float], warmup_s: float, limit_pct_per_h: float) -> dict:
    """The growth of the samples after `warmup_s` (times from the run's start), and whether it stays under the limit."""
    kept = [(t, v) for t, v in zip(times_s, values) if t >= warmup_s]
    fit = slope_per_hour([t for t, _ in kept], [v for _, v in kept]) if kept else None
    if fit is None:
        return {"flat": None, "limit_pct_per_h": limit_pct_per_h, "why": "too few samples after the warm-up"}
    pct = fit["pct_per_h"]
    return {**fit, "limit_pct_per_h": limit_pct_per_h, "flat": pct is not None and pct < limit_pct_per_h}
