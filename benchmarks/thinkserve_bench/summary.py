"""Aggregates of query records: latency distributions (end to end, rag_ttft, LLM TTFT, inter-token, per stage,
per route), outcomes, cost, and Triton's queue vs compute time per model. Always from the raw records."""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional, Sequence

from .query_costs import summarize_costs
from .record import QueryRecord
from .stats import distribution
from .triton_stats import ModelCounters

GENERATED_SOURCES = ("llm", "vlm")  # answers streamed token by token: their inter-token gaps mean something


def server_totals(per_model: Iterable[dict[str, ModelCounters]]) -> dict[str, dict]:
    """Triton counters summed over windows (queries or levels), per leaf model, with per-request means."""
    totals: dict[str, ModelCounters] = {}
    for window in per_model:
        for name, counters in window.items():
            totals[name] = totals[name].plus(counters) if name in totals else counters
    out = {}
    for name, c in sorted(totals.items()):
        row = c.as_dict()
        row["queue_ms_per_request"] = c.queue_ms / c.requests if c.requests else None
        # a request's own view: what it waited for and what it was computed over (its batch's duration)
        row["compute_ms_per_request"] = c.request_compute_ns / 1e6 / c.requests if c.requests else None
        waited_and_computed = c.queue_ns + c.request_compute_ns
        row["queue_share"] = c.queue_ns / waited_and_computed if waited_and_computed else None
        out[name] = row
    return out


def latency_summary(records: Sequence[QueryRecord]) -> dict:
    ok = [r for r in records if r.ok]
    stages = sorted({s for r in ok for s in r.timings})
    generated = [r for r in ok if r.answer_source in GENERATED_SOURCES]
    totals = sum(r.timings.get("total", 0.0) for r in ok)
    return {
        "queries": len(records),
        "ok": len(ok),
        "statuses": dict(Counter(r.status for r in records)),
        "client": distribution(r.client_ms for r in ok),
        "rag_ttft": distribution(r.timings["rag_ttft"] for r in ok if "rag_ttft" in r.timings),
        "first_delta_client": distribution(r.first_delta_ms for r in ok if r.first_delta_ms is not None),
        "llm_ttft": distribution(r.timings["llm_ttft"] for r in ok if "llm_ttft" in r.timings),
        # pooled gaps of every generated answer (each gap a sample), client side
        "inter_token": distribution(g for r in generated for g in r.inter_token_ms),
        "stages": {s: distribution(r.timings[s] for r in ok if s in r.timings) for s in stages},
        "routes": dict(Counter(r.route for r in ok)),
        "route_sources": dict(Counter(r.route_source for r in ok)),
        "answer_sources": dict(Counter(r.answer_source for r in ok)),
        "degraded": sum(1 for r in ok if r.degraded),
        "orchestrator_share": (sum(r.orchestrator_ms for r in ok) / totals) if totals else None,
    }


def summarize(records: Sequence[QueryRecord], by_route: bool = True) -> dict:
    """Latency, cost and server-side time of a series; per route taken as well."""
    out = latency_summary(records)
    costs = [r.cost for r in records if r.ok and r.cost is not None]
    out["cost"] = summarize_costs(costs)
    windows = [r.server for r in records if r.server]
    out["server"] = server_totals(windows) if windows else None
    if by_route:
        routes = sorted({r.route for r in records if r.ok})
        out["by_route"] = {route: summarize([r for r in records if r.ok and r.route == route], by_route=False) for route in routes}
    return out


def paired_ok(a: Sequence[QueryRecord], b: Sequence[QueryRecord]) -> tuple[list[QueryRecord], list[QueryRecord]]:
    """The queries that succeeded in both of two series that asked the same questions in the same order.

    Savings and ratios between series are taken over these only: a question that failed in one series (a
    timeout on the Complex path, say) would otherwise stay in one average and drop out of the other."""
    if [r.question_id for r in a] != [r.question_id for r in b]:
        raise ValueError("the two series did not ask the same questions in the same order")
    kept = [(x, y) for x, y in zip(a, b) if x.ok and y.ok]
    return [x for x, _ in kept], [y for _, y in kept]


def counters_dict(counters: dict[str, ModelCounters]) -> dict[str, dict]:
    return {name: c.as_dict() for name, c in counters.items()}


def recall_summary(pairs: Sequence[tuple[str, Optional[float]]]) -> dict:
    """Mean page recall overall and per question type, over the questions that have expected pages."""
    scored = [(kind, value) for kind, value in pairs if value is not None]
    out: dict = {"questions": len(scored), "recall": (sum(v for _, v in scored) / len(scored)) if scored else None}
    for kind in sorted({k for k, _ in scored}):
        values = [v for k, v in scored if k == kind]
        out[kind] = sum(values) / len(values)
    return out
