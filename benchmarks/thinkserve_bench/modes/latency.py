"""Latency: sequential queries (one in flight), per configuration and per route taken, with the pipeline's own
stage timings next to Triton's queue and compute time per model for the same queries."""

from __future__ import annotations

from typing import Any, Sequence

from ..session import BenchSession
from ..summary import summarize
from ..workload import WorkloadQuestion

# routed: the router decides (the deployment's mode: features on the tiny profile); the others force a route.
CONFIGS: dict[str, dict[str, Any]] = {
    "routed": {},
    "simple": {"route": "simple"},
    "moderate": {"route": "moderate"},
    "complex": {"route": "complex"},
}


async def run_latency(
    session: BenchSession, questions: Sequence[WorkloadQuestion], configs: dict[str, dict[str, Any]], rounds: int = 1,
    common: dict[str, Any] | None = None,
) -> dict:
    results = {}
    for label, overrides in configs.items():
        options = {**(common or {}), **overrides}
        session.progress(f"latency: {label} ({len(questions) * rounds} queries, one at a time)")
        await session.warm_up(questions, options)
        records = [await session.sequential(q, label, options) for _ in range(rounds) for q in questions]
        results[label] = {"options": options, "summary": summarize(records), "records": [r.as_dict() for r in records]}
    return {"mode": "latency", "rounds": rounds, "questions": len(questions), "server_stats": session.server_stats,
            "configs": results}
