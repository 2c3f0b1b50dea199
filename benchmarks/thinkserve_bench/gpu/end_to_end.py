"""The end-to-end part: routed questions through the real orchestrator, against the Triton the runner started.

The orchestrator is the deployment `thinkserve serve` runs (orchestrator.server.deployment: FAISS, the graph, the query
pipeline, its gRPC server on a real socket), in a child process (thinkserve_bench.target.own_deployment: the
load generator shares no interpreter or event loop with it), given the runner's Triton (`triton.url`). Its
knowledge base is ingested first through its Ingest RPC from the carried corpus (corpus.py), so every vector comes
from the models that answer. The questions are the cost run's (`--cost`: 24 generated over the same documents),
each sent through the Query RPC with the route the cost run's router gave it pinned (the standin router is the
LLM asked, with random weights: it would route at random) and the cost run's options (`answerer=llm`). The
deployment is given the trained models' defaults whatever the profile (page images, perception, the LLM
answerer), so the CPU dry run's tiny profile goes through the same stages as the GPU's standin one.

Units, in this order: for each concurrency (1, 8, 32), each route in turn, Simple first (on the first H200 run a
slow route measured first starved the others of the budget): a closed loop of `concurrency` clients sending the
route's questions in turn. After a warm-up, a window: throughput counts the queries that ended inside it, latency
(client side, request to final event) and the pipeline's own model and orchestrator time come from those. The
window stretches until `min_completed` queries ended (a Complex query can outlast it), never past the time the
later units need. When it closes, queries still running get `straggler_s` to end, then are cancelled: counted,
never waited for longer. A unit that would end past the deadline is not started. Every unit is recorded (and the
JSON and Markdown written) as soon as it ends.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from orchestrator.config import Settings

from ..record import QueryRecord, run_query
from ..result_files import read_json
from ..stats import percentile
from ..workload import WorkloadQuestion
from .call_mix import costs, gpu_rates
from .corpus import ingest_corpus
from .options import ROOT, Options

ROUTE_ORDER = ("simple", "moderate", "complex")
COLLECTION = "bench"  # the cost run's collection name, which its questions carry
# The options of the replayed cost run (`--option answerer=llm`), sent with every question
QUERY_OPTIONS = {"answerer": "llm"}

Record = Callable[[str, object], None]
Progress = Callable[[str], None]


def routed_questions(cost: dict, config: str = "routed", per_route: int = 0) -> dict[str, list[WorkloadQuestion]]:
    """The cost run's questions by the route its router chose for each (first `per_route` of each; 0: all), in
    ROUTE_ORDER; a question whose query failed there has no route and is left out."""
    texts = {q["id"]: q for q in (cost.get("workload") or {}).get("questions_text", [])}
    routes: dict[str, list[WorkloadQuestion]] = {}
    seen: set[str] = set()
    for record in cost["result"]["configs"][config]["records"]:
        question, route = texts.get(record.get("question_id")), record.get("route")
        if question is None or route not in ROUTE_ORDER or question["id"] in seen:
            continue
        seen.add(question["id"])
        routes.setdefault(route, []).append(WorkloadQuestion.model_validate({**question, "route": route}))
    return {route: routes[route][: per_route or None] for route in ROUTE_ORDER if route in routes}


def deployment_settings(triton_url: str, repository: Path, profile: str, data_dir: Path, concurrency: int) -> Settings:
    """The orchestrator's settings: the runner's Triton, a fresh data folder, free ports, HTTP off (the measured
    API is gRPC), OCR off (the repository is built without it), admission for the largest level (none of its
    queries is refused), and the trained models' defaults (see the module's docstring)."""
    return Settings.load(None, {
        "profile": profile, "triton.url": triton_url, "triton.model_repository": str(repository),
        "triton.call_timeout_s": 600.0, "storage.data_dir": str(data_dir), "server.port": 0, "http.enabled": False,
        "server.max_concurrent_queries": concurrency, "server.max_queued_queries": concurrency,
        "server.default_deadline_s": 600.0, "ingest.ocr": "off",
        "retrieval.rerank_weight": 1.0, "answer.answerer": "llm", "pages.run_by_default": True, "perception.mode": "dpr",
    })


def error_code(record: QueryRecord) -> str:
    """The gRPC status name of a failed query ("DEADLINE_EXCEEDED: ..." -> DEADLINE_EXCEEDED), else its status."""
    head = record.error.split(":", 1)[0].strip()
    return head if head.isupper() else record.status


async def closed_loop(client, questions: Sequence[WorkloadQuestion], concurrency: int, warmup_s: float, window_s: float,
                      until: float, straggler_s: float, min_completed: int = 2,
                      overrides: Optional[dict] = None) -> tuple[list[QueryRecord], dict]:
    """`concurrency` clients sending `questions` in turn; returns the records that ended inside the window and the
    window's facts. `until`: monotonic seconds past which the window does not stretch."""
    cycle = itertools.cycle(questions)
    ended: list[QueryRecord] = []
    closed = asyncio.Event()

    async def client_loop() -> None:
        while not closed.is_set():
            ended.append(await run_query(client, COLLECTION, next(cycle), "e2e", {**QUERY_OPTIONS, **(overrides or {})}))

    tasks = [asyncio.create_task(client_loop()) for _ in range(concurrency)]
    try:
        await asyncio.sleep(warmup_s)
        t0 = time.monotonic()
        hard_stop = max(t0 + window_s, min(until, t0 + max(60.0, 10 * window_s)))
        while True:
            now = time.monotonic()
            inside = sum(1 for r in ended if r.ended_s >= t0)
            if (now - t0 >= window_s and inside >= min_completed) or now >= hard_stop:
                break
            await asyncio.sleep(min(0.05, max(0.0, hard_stop - now)))
        t1 = time.monotonic()
        closed.set()  # no client starts another query; those running get straggler_s
        _, running = await asyncio.wait(tasks, timeout=straggler_s)
    finally:
        closed.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in ended if t0 <= r.ended_s <= t1], {
        "window_s": t1 - t0, "stretched": t1 - t0 > window_s + 0.1, "cancelled_at_close": len(running),
        "ended_after_close": sum(1 for r in ended if r.ended_s > t1),
    }


def summarize(route: str, concurrency: int, records: list[QueryRecord], window: dict, rates: dict[str, float]) -> dict:
    """One unit's row: queries/s, latency, the pipeline's own model and orchestrator time per query, $ per query at
    the GPU rates at that throughput, failures by gRPC code, and whether the orchestrator took the pinned route."""
    ok = [r for r in records if r.ok]
    queries_per_s = len(ok) / window["window_s"] if window["window_s"] > 0 else None
    latency = [r.client_ms for r in ok if r.client_ms is not None]
    return {
        "route": route, "concurrency": concurrency, **{k: round(v, 3) if isinstance(v, float) else v for k, v in window.items()},
        "completed": len(ok), "failed": len(records) - len(ok),
        "errors_by_code": dict(collections.Counter(error_code(r) for r in records if not r.ok)),
        "error_messages": sorted({r.error for r in records if not r.ok})[:3],
        "queries_per_s": queries_per_s,
        "latency_p50_ms": percentile(latency, 50), "latency_p95_ms": percentile(latency, 95),
        "first_token_p50_ms": percentile([r.first_delta_ms for r in ok if r.first_delta_ms is not None], 50),
        "model_ms_p50": percentile([r.model_ms for r in ok], 50),
        "model_ms_mean": sum(r.model_ms for r in ok) / len(ok) if ok else None,
        "orchestrator_ms_p50": percentile([r.orchestrator_ms for r in ok], 50),
        "completion_tokens_mean": sum(r.completion_tokens for r in ok) / len(ok) if ok else None,
        # the pipeline's stages as it timed them (p50 over the queries that ran each): which ran, and where time went
        "stage_ms_p50": {stage: percentile([r.timings[stage] for r in ok if stage in r.timings], 50)
                         for stage in sorted({stage for r in ok for stage in r.timings})},
        "routes_taken": dict(collections.Counter(r.route for r in ok)),
        "degraded": sum(1 for r in ok if r.degraded),
        "cost": costs(queries_per_s, rates),
    }


def unit_seconds(options: Options) -> float:
    """The least time a unit takes: its warm-up, its window, the stragglers' bound and a margin."""
    return options.e2e_warmup_s + options.e2e_window_s + options.e2e_straggler_s + 5.0


async def measure_end_to_end(triton_url: str, repository: Path, profile: str, work: Path, options: Options,
                             record: Record, progress: Progress, observer=None) -> None:
    """`observer` (observation.UnitObserver): Triton's statistics and the GPU's utilisation over each unit."""
    from orchestrator.client import AsyncThinkServeClient
    from thinkserve_bench.target import own_deployment

    cost = read_json(options.cost)
    questions = routed_questions(cost, options.cost_config, options.e2e_questions)
    record("source", {
        "cost_run": str(options.cost.relative_to(ROOT)) if options.cost.is_relative_to(ROOT) else str(options.cost),
        "command": cost.get("command"), "config": options.cost_config, "options": QUERY_OPTIONS,
        "corpus": (cost.get("corpus") or {}).get("documents"),
        "questions": {route: len(items) for route, items in questions.items()},
    })
    largest = max(options.e2e_concurrency)
    settings = deployment_settings(triton_url, repository, profile, work / "e2e-data", largest)
    began = time.monotonic()
    async with own_deployment(settings, progress) as target:
        started_s = round(time.monotonic() - began, 1)
        progress(f"  orchestrator ready in {started_s} s at {target.address}; ingesting the corpus")
        knowledge = await ingest_corpus(target.address, COLLECTION, options.corpus, progress)
        record("deployment", {"orchestrator_start_s": started_s, "address": target.address, "triton": triton_url,
                              "profile": profile, "max_concurrent_queries": largest, "knowledge_base": knowledge})
        rates = gpu_rates()
        units: list[dict] = []
        plan = [(c, route) for c in options.e2e_concurrency for route in questions]
        async with AsyncThinkServeClient(target.address, timeout_s=600) as client:
            for index, (concurrency, route) in enumerate(plan):
                later = len(plan) - index - 1
                if options.left() < unit_seconds(options):
                    units.append({"route": route, "concurrency": concurrency, "skipped": "out of time"})
                    record("units", units)
                    continue
                # a unit may stretch its window to count slow queries, but leaves every later unit its minimum
                until = time.monotonic() + options.left() - later * unit_seconds(options) - options.e2e_straggler_s - 5.0
                if observer is not None:
                    observer.begin()
                records, window = await closed_loop(client, questions[route], concurrency, options.e2e_warmup_s,
                                                    options.e2e_window_s, until, options.e2e_straggler_s)
                unit = summarize(route, concurrency, records, window, rates)
                if observer is not None:
                    unit["observed"] = observer.end()  # over the whole unit: warm-up and stragglers included
                units.append(unit)
                record("units", units)
                progress(f"  {route} at concurrency {concurrency}: {unit['queries_per_s'] or 0:.2f} q/s, p50 "
                         f"{unit['latency_p50_ms'] or 0:.0f} ms, p95 {unit['latency_p95_ms'] or 0:.0f} ms, "
                         f"{unit['completed']} queries, {unit['failed']} failed {unit['errors_by_code'] or ''}")
