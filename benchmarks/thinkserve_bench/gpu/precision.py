"""A mean over repeated rounds and its stated precision: the half-width of its 95% confidence interval (Student's
t), absolute and relative to the mean. The first H200 run compared generators on one 32-token generation per
1-stream row, with no precision at all."""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

# Student's t, two-sided 95%, by degrees of freedom (1-30); 1.96 beyond
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(degrees: int) -> float:
    return T95[degrees - 1] if degrees <= len(T95) else 1.96


def interval(samples: Sequence[float]) -> dict:
    """mean, half-width of its 95% interval, relative half-width, n; the interval is unknown (None) under 2 samples."""
    values = [v for v in samples if v is not None]
    if not values:
        return {"mean": None, "half_width": None, "relative": None, "n": 0}
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "half_width": None, "relative": None, "n": 1}
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "half_width": half, "relative": half / mean if mean else None, "n": len(values)}


def ratio_interval(numerator: dict, denominator: dict) -> dict:
    """The ratio of two independent means, its relative half-width from theirs (first order)."""
    if not numerator.get("mean") or not denominator.get("mean"):
        return {"ratio": None, "relative": None}
    value = numerator["mean"] / denominator["mean"]
    if numerator.get("relative") is None or denominator.get("relative") is None:
        return {"ratio": value, "relative": None}
    return {"ratio": value, "relative": math.hypot(numerator["relative"], denominator["relative"])}


def precise_enough(parts: Sequence[dict], target: float) -> bool:
    """Whether every interval is known and within `target` (relative half-width)."""
    return all(part.get("relative") is not None and part["relative"] <= target for part in parts)


def percent(relative: Optional[float]) -> str:
    return "n/a" if relative is None else f"±{100 * relative:.1f}%"
