"""The pipeline's call mix: a cost run's recorded model calls (the routed questions) replayed by the ceiling mode's
replay (the pipeline's phases, branches and concurrency per question) against the GPU's Triton, per route, closed
loop at several concurrencies: model-bound queries/s, model time per query, cost per query at the price table's
GPU rates, and an end-to-end estimate per route (the cost run's own orchestrator time + this model time)."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.models import TritonModels

from ..result_files import read_json
from ..stats import call_latency_summary, percentile
from .generator_measurements import WORDS, page_image, single_token_words, whole_text_tokenizer
from .options import ROOT, Options

# The routes, cheapest first: on the first H200 run they ran alphabetically, Complex (the slowest) first, and the
# budget ran out before Moderate and Simple
ROUTE_ORDER = ("simple", "moderate", "complex")


def route_order(routes) -> list[str]:
    """The routes in ROUTE_ORDER, any other after them by name."""
    return sorted(routes, key=lambda route: (ROUTE_ORDER.index(route) if route in ROUTE_ORDER else len(ROUTE_ORDER), route))


def passages(words: Sequence[str], count: int, length: int, offset: int = 0) -> list[str]:
    return [" ".join(words[(offset + i * length + j) % len(words)] for j in range(length)) for i in range(count)]


def plans_from_cost(cost: dict, config: str, source_image_tokens: int, image_tokens: int,
                    words: Sequence[str] = WORDS, contexts: Optional[dict[str, int]] = None) -> list[tuple[str, object, float]]:
    """(route, ceiling.Plan, the orchestrator's own ms) for every ok query of a cost run's series: its recorded
    model calls, the VLM's prompt tokens re-counted for this VLM's image positions (and a generator's prompt cut to
    its context, `contexts`), the question from the run's workload, and evidence passages as long as its
    cross-encoder pairs were (the run's texts are not recorded)."""
    from thinkserve_bench.modes.ceiling import Call, Plan

    contexts = contexts or {}

    questions = {q["id"]: q["question"] for q in (cost.get("workload") or {}).get("questions_text", [])}
    out = []
    for n, record in enumerate(cost["result"]["configs"][config]["records"]):
        if record.get("status") != "ok":
            continue
        calls = []
        for u in record["usage"]:
            tokens_in = u["tokens_in"]
            if u["model"] == contracts.VLM.name:  # the ledger counts 1 + images items per call
                tokens_in += max(0, u["items"] - u["calls"]) * (image_tokens - source_image_tokens)
            if u["model"] in contexts:  # a prompt (per call) the served context cannot take with its answer
                room = contexts[u["model"]] - u["tokens_out"] // max(1, u["calls"]) - 32
                tokens_in = min(tokens_in, room * max(1, u["calls"]))
            calls.append(Call(u["model"], u["stage"], u["items"], max(1, tokens_in), u["tokens_out"], max(1, u["calls"])))
        pairs = [c for c in calls if c.model == contracts.RERANKER.name]
        per_pair = pairs[0].tokens_in // max(1, pairs[0].items) if pairs else 130
        count = max((c.items // c.calls for c in pairs), default=8)
        question = questions.get(record.get("question_id"), "What does the report say about revenue by region?")
        texts = passages(words, count, max(8, int((per_pair - len(question.split())) * 0.75)), offset=7 * n)
        out.append((record.get("route") or "unknown", Plan(question, calls, texts), float(record.get("orchestrator_ms", 0.0))))
    return out


async def replay_level(models: TritonModels, plans: Sequence[object], images: list[bytes], concurrency: int,
                       warmup_s: float, window_s: float, until: float = math.inf, min_completed: int = 3,
                       grace_s: float = 2.0) -> dict:
    """Closed loop of `concurrency` workers replaying `plans` in turn (the ceiling's replay): queries/s and model
    time per query over the window after the warm-up.

    The window lasts `window_s`, and longer, until `min_completed` queries have ended inside it (answered or
    failed), at most 10 windows or 60 s, and never past `until` (epoch seconds): on the first H200 run a Complex
    query's LLM answer outlasted a 3 s window and the level counted nothing. Queries still running when it closes
    are cancelled and not counted, and not waited for beyond `grace_s` (`abandoned`: how many were still closing):
    the same run's concurrency-8 level went on 70 s past its window for the queries in flight."""
    from thinkserve_bench.modes.ceiling import ReplayTally, replay

    cycle = itertools.cycle(plans)
    ended: list[tuple[float, float]] = []
    errors: list[str] = []
    failed_at: list[float] = []
    tally = ReplayTally()
    closed = asyncio.Event()

    async def worker() -> None:
        while not closed.is_set():
            began = time.monotonic()
            try:
                await replay(models, next(cycle), images, tally)
                ended.append((time.monotonic(), time.monotonic() - began))
            except Exception as error:  # noqa: BLE001 - counted and reported, the level goes on
                errors.append(f"{type(error).__name__}: {error}")
                failed_at.append(time.monotonic())

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(warmup_s)
    t0 = time.monotonic()
    limit = max(0.0, until - time.time())  # never past `until`, even at the cost of a shorter window
    hard_stop = t0 + min(max(window_s, min(max(60.0, 10 * window_s), limit)), limit)
    while True:
        now = time.monotonic()
        inside = sum(1 for end, _ in ended if end >= t0) + sum(1 for end in failed_at if end >= t0)
        if (now - t0 >= window_s and inside >= min_completed) or now >= hard_stop:
            break
        await asyncio.sleep(min(0.05, max(0.0, hard_stop - now)))
    t1 = time.monotonic()
    closed.set()
    for task in workers:
        task.cancel()
    _, closing = await asyncio.wait(workers, timeout=grace_s)
    inside = [latency for end, latency in ended if t0 <= end <= t1]
    return {"concurrency": concurrency, "window_s": t1 - t0, "completed": len(inside), "errors": len(errors),
            "abandoned": len(closing),
            "error_messages": sorted(set(errors))[:3], "queries_per_s": len(inside) / (t1 - t0) if t1 > t0 else None,
            **{k: v for k, v in call_latency_summary(inside).items() if k != "calls"}}


def costs(queries_per_s: Optional[float], rates: dict[str, float]) -> dict:
    """$ per query and per 1,000 queries at each GPU's hourly rate, at that throughput."""
    if not queries_per_s:
        return {}
    return {kind: {"usd_per_query": rate / 3600 / queries_per_s, "usd_per_1000_queries": 1000 * rate / 3600 / queries_per_s}
            for kind, rate in rates.items()}


def gpu_rates() -> dict[str, float]:
    """The price table's hourly rate of one H100 and one H200 (thinkserve_bench.prices defaults)."""
    from thinkserve_bench.prices import PriceTable

    table = PriceTable()
    return {kind: table.deployments[kind].usd_per_deployment_hour for kind in ("h100", "h200") if kind in table.deployments}


async def measure_mix(client: TritonClient, repository: Path, options: Options, record: Callable[[str, object], None],
                      progress: Callable[[str], None], observer=None) -> None:
    """Every route, Simple, Moderate then Complex, each level recorded as it ends (with what the server and the GPU
    did during it, `observed`, when an observation.UnitObserver is given)."""
    from thinkserve_bench.modes.ceiling import calibrate

    models = TritonModels(client)
    cost = read_json(options.cost)
    facts = {name: await models.generator_facts(name) for name in (contracts.LLM.name, contracts.VLM.name)}
    image_tokens = facts[contracts.VLM.name].image_tokens
    # the calibrated prompts are made of words the LLM's tokenizer reads as one token each (a first guess of
    # 0.7 words a token then lands below the target, as the ceiling's calibration expects)
    words = single_token_words(whole_text_tokenizer(repository / contracts.LLM.name / "1" / "tokenizer.json"))
    planned = plans_from_cost(cost, options.cost_config, options.source_image_tokens, image_tokens, words,
                              {name: f.context_tokens for name, f in facts.items()})
    progress(f"  calibrating the generators' prompts of {len(planned)} recorded queries")
    await calibrate(models, [plan for _, plan, _ in planned])
    images = [page_image(seed) for seed in range(8)]
    rates = gpu_rates()
    routes: dict[str, list] = {}
    for route, plan, own_ms in planned:
        routes.setdefault(route, []).append((plan, own_ms))
    record("source", {"cost_run": str(options.cost.relative_to(ROOT)) if options.cost.is_relative_to(ROOT) else str(options.cost),
                      "command": cost.get("command"), "config": options.cost_config, "queries": len(planned),
                      "source_image_tokens": options.source_image_tokens, "image_tokens": image_tokens,
                      "rates_usd_per_hour": rates,
                      "routes": {r: len(routes[r]) for r in route_order(routes)}, "route_order": route_order(routes)})
    units_left = len(routes) * len(options.mix_concurrency)
    for route in route_order(routes):
        items = routes[route]
        plans = [plan for plan, _ in items]
        own = sorted(ms for _, ms in items)
        levels: list[dict] = []
        for concurrency in options.mix_concurrency:
            if options.left() < options.mix_warmup_s + options.mix_window_s + 15:
                levels.append({"concurrency": concurrency, "skipped": "out of time"})
                units_left -= 1
                record(route, route_result(items, own, levels, options, partial=True))
                continue
            # a level may stretch its window to count a few slow queries, but leaves every later level its minimum
            units_left -= 1
            until = options.deadline - 15 - units_left * (options.mix_warmup_s + options.mix_window_s + 15)
            if observer is not None:
                observer.begin()
            level = await replay_level(models, plans, images, concurrency, options.mix_warmup_s, options.mix_window_s,
                                       until=until)
            if observer is not None:
                level["observed"] = observer.end()
            level["cost"] = costs(level["queries_per_s"], rates)
            levels.append(level)
            record(route, route_result(items, own, levels, options, partial=True))  # written now: a kill loses no level
            progress(f"  {route} at concurrency {concurrency}: {level['queries_per_s'] or 0:.2f} q/s, model time p50 "
                     f"{level['p50_ms'] or 0:.0f} ms, p95 {level['p95_ms'] or 0:.0f} ms ({level['completed']} queries)")
        record(route, route_result(items, own, levels, options, partial=False))


def route_result(items: list, own: list[float], levels: list[dict], options: Options, partial: bool) -> dict:
    """A route's levels so far, its best level and the end-to-end estimate (`partial` while levels are to come)."""
    measured = [lv for lv in levels if lv.get("queries_per_s")]
    best = max(measured, key=lambda lv: lv["queries_per_s"], default=None)
    alone = next((lv for lv in measured if lv["concurrency"] == min(options.mix_concurrency)), None)
    own_p50 = percentile(own, 50) if own else None
    return {
        "queries": len(items), "levels": list(levels), "partial": partial,
        "best": {"concurrency": best["concurrency"], "queries_per_s": best["queries_per_s"], "cost": best["cost"]} if best else None,
        "orchestrator_ms_p50_cpu": own_p50,
        # the estimate: the orchestrator's own time as the cost run measured it on the CPU machine + the model
        # time of one query alone on this GPU; not a measurement of the whole system
        "end_to_end_estimate_ms": (own_p50 + alone["p50_ms"]) if own_p50 is not None and alone and alone["p50_ms"] else None,
    }

