"""Load: a closed-loop concurrency sweep (1, 2, 4, ... until saturation) and open-loop Poisson arrivals.

Closed loop: `c` workers each send their next question as soon as their last answer arrives. After a warm-up,
a window of fixed length is measured: throughput counts the queries that ended inside it; latency percentiles
come from those queries' raw samples. The sweep stops when doubling the concurrency gains less than
`saturation_gain` of throughput, or when more than 5% of the queries fail or are rejected.

Open loop: arrivals at a target rate with exponential gaps (seeded); each is sent when due whatever is still in
flight, and its latency counts from when it was due, so a late generator cannot hide queueing. Throughput
counts the queries that ended inside the window; latency percentiles come from the queries that were due
inside it, each followed to its end: under overload the queue grows through the window, and choosing by end
time would leave out the latest arrivals, which wait longest.

The generator's own overhead is measured in the same window: its process CPU time per wall second, and the
lag of its event loop (a 10 ms ticker's oversleep). Triton's statistics are snapshotted at the window's edges:
executions per batch size, queue and compute time per model.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Any, Optional, Sequence

from ..query_costs import query_cost, usd_per_query_at_rate
from ..record import OK, REJECTED, QueryRecord
from ..session import BenchSession
from ..stats import distribution, goodput, rate, ratio
from ..summary import counters_dict, latency_summary
from ..workload import WorkloadQuestion

FAILURE_LIMIT = 0.05
MAX_IN_FLIGHT = 1024  # open loop: arrivals beyond this many in flight are counted as dropped by the generator


class LagMonitor:
    """How late a 10 ms ticker wakes up: the generator's event loop is busy when this grows."""

    def __init__(self, interval_s: float = 0.010):
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._task: Optional[asyncio.Task] = None

    async def _run(self) -> None:
        while True:
            expected = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lags_ms.append(max(0.0, (time.monotonic() - expected) * 1000.0))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class Window:
    """Measures one window: wall time, the generator's CPU and loop lag, Triton's counters."""

    def __init__(self, session: BenchSession):
        self.session = session
        self.monitor = LagMonitor()

    async def open(self) -> None:
        self.before = await self.session.snapshot()
        self.monitor.lags_ms.clear()
        self.cpu0, self.t0 = time.process_time(), time.monotonic()

    async def close(self) -> None:
        self.t1, self.cpu1 = time.monotonic(), time.process_time()
        self.lags_ms = list(self.monitor.lags_ms)  # the window's own: not the drain that follows it
        after = await self.session.snapshot()
        self.server = after.since(self.before) if self.before is not None and after is not None else None

    @property
    def wall_s(self) -> float:
        return self.t1 - self.t0

    def generator(self, in_process_server: bool) -> dict:
        return {
            "cpu_cores": (self.cpu1 - self.cpu0) / self.wall_s,  # CPU seconds of this process per wall second
            "loop_lag": distribution(self.lags_ms),
            "shares_process_with_server": in_process_server,
        }


def level_report(session: BenchSession, records: list[QueryRecord], window: Window, label: str, extra: dict,
                 latency_records: Optional[list[QueryRecord]] = None) -> dict:
    """Throughput, latency, outcomes, goodput, generator overhead, batch sizes and cost for one window.
    `latency_records`: the queries whose latency is sampled (default: those that ended inside the window)."""
    slo = session.settings.slo_ms
    inside = [r for r in records if window.t0 <= r.ended_s <= window.t1]
    ok = [r for r in inside if r.status == OK]
    failed = [r for r in inside if r.status not in (OK, REJECTED)]
    rejected = [r for r in inside if r.status == REJECTED]
    out = {
        "label": label,
        **extra,
        "wall_s": window.wall_s,
        "completed": len(ok),
        "rejected": len(rejected),
        "errors": len(failed),
        "error_messages": sorted({r.error for r in failed})[:5],
        "throughput_qps": rate(len(ok), window.wall_s),
        "goodput_qps": goodput([r.client_ms for r in ok], slo, window.wall_s),
        "slo_ms": slo,
        "latency": latency_summary(inside if latency_records is None else latency_records),
        "generator": window.generator(session.target_in_process),
    }
    out["goodput_share"] = ratio(out["goodput_qps"], out["throughput_qps"])
    if window.server is not None:
        leaves = session.topology.leaves(window.server)
        out["server"] = counters_dict(leaves)
        public = session.topology.by_public_model(window.server)
    else:
        out["server"], public = None, None
    if ok:
        usage = [u for r in ok for u in r.usage]
        total = query_cost(usage, session.settings.prices, public, session.topology.decoupled)
        n = len(ok)
        out["cost"] = {
            "hardware_usd_per_query": total.hardware_usd / n,
            "hosted_usd_per_query": total.hosted_usd / n,
            "model_seconds_per_query": total.seconds / n,
            "model_seconds_per_query_by_model": {m: s / n for m, s in total.model_seconds.items()},
            "sources": total.sources,
            # the deployment's hourly price over the queries it completed per hour at this level's throughput
            # (at the best closed-loop level: the capacity cost)
            "usd_per_query_at_throughput": usd_per_query_at_rate(session.settings.prices, out["throughput_qps"]),
        }
        generated: dict[str, int] = {}
        for u in usage:
            if u.tokens_out:
                generated[u.model] = generated.get(u.model, 0) + u.tokens_out
        out["usage_per_query"] = {"completion_tokens": {m: t / n for m, t in sorted(generated.items())}}
    return out


async def closed_level(session: BenchSession, questions: Sequence[WorkloadQuestion], concurrency: int,
                       overrides: dict[str, Any], offset: int = 0) -> dict:
    settings = session.settings.load
    cycle = itertools.islice(itertools.cycle(questions), offset % len(questions), None)
    records: list[QueryRecord] = []
    stop_at = time.monotonic() + settings.warmup_seconds + settings.level_seconds

    async def worker() -> None:
        while time.monotonic() < stop_at:
            records.append(await session.query(next(cycle), f"closed-{concurrency}", overrides))

    window = Window(session)
    window.monitor.start()
    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(settings.warmup_seconds)
    await window.open()
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    await window.close()
    await asyncio.gather(*workers)
    await window.monitor.stop()
    return level_report(session, records, window, f"closed c={concurrency}", {"concurrency": concurrency})


async def open_level(session: BenchSession, questions: Sequence[WorkloadQuestion], qps: float,
                     overrides: dict[str, Any], seed: int) -> dict:
    settings = session.settings.load
    rng = random.Random(seed)
    start = time.monotonic() + 0.05
    end = start + settings.warmup_seconds + settings.level_seconds
    due, arrivals = start, []
    while due < end:
        arrivals.append(due)
        due += rng.expovariate(qps)
    records: list[QueryRecord] = []
    tasks: list[asyncio.Task] = []
    dropped = 0
    window = Window(session)
    window.monitor.start()
    opened = False

    async def one(question: WorkloadQuestion, when: float) -> None:
        records.append(await session.query(question, f"open-{qps:g}", overrides, due_s=when))

    for n, when in enumerate(arrivals):
        if not opened and when >= start + settings.warmup_seconds:
            await window.open()
            opened = True
        delay = when - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if sum(1 for t in tasks if not t.done()) >= MAX_IN_FLIGHT:
            dropped += 1
            continue
        tasks.append(asyncio.create_task(one(questions[n % len(questions)], when)))
    if not opened:
        await window.open()
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    await window.close()
    await asyncio.gather(*tasks)
    await window.monitor.stop()
    measured_arrivals = sum(1 for a in arrivals if window.t0 <= a <= window.t1)
    due_in_window = [r for r in records if window.t0 <= r.started_s <= window.t1]  # started_s: when it was due
    report = level_report(session, records, window, f"open {qps:.3g} q/s", {
        "target_qps": qps, "offered_qps": measured_arrivals / window.wall_s, "dropped_by_generator": dropped,
    }, latency_records=due_in_window)
    report["generator"]["send_lateness"] = distribution(r.lateness_ms for r in due_in_window)
    return report


def saturated(previous: Optional[dict], current: dict, gain: float) -> Optional[str]:
    """Why the sweep stops here, or None to go on."""
    done = current["completed"] + current["rejected"] + current["errors"]
    if done and (current["rejected"] + current["errors"]) / done > FAILURE_LIMIT:
        return f"more than {FAILURE_LIMIT:.0%} of queries failed or were rejected"
    if previous is not None and current["throughput_qps"] <= previous["throughput_qps"] * (1 + gain):
        return f"throughput grew less than {gain:.0%} from concurrency {previous['concurrency']} to {current['concurrency']}"
    return None


async def run_load(session: BenchSession, questions: Sequence[WorkloadQuestion], common: Optional[dict[str, Any]] = None,
                   concurrency: Optional[Sequence[int]] = None, qps: Optional[Sequence[float]] = None, seed: int = 0,
                   open_loop: bool = True) -> dict:
    settings = session.settings.load
    overrides = dict(common or {})
    await session.warm_up(questions, overrides)
    levels = list(concurrency) if concurrency else [2**i for i in range(16) if 2**i <= settings.concurrency_max]
    closed, stop_reason, previous = [], "", None
    for n, c in enumerate(levels):
        session.progress(f"load: closed loop at concurrency {c} ({settings.warmup_seconds:g} s warm-up + {settings.level_seconds:g} s)")
        level = await closed_level(session, questions, c, overrides, offset=n * 7)
        closed.append(level)
        session.progress(f"  {level['throughput_qps']:.2f} q/s, p50 {level['latency']['client']['p50_ms'] or 0:.0f} ms")
        reason = saturated(previous, level, settings.saturation_gain) if not concurrency else None
        if reason:
            stop_reason = reason
            break
        previous = level
    best = max(closed, key=lambda level: level["throughput_qps"])
    open_levels = []
    if open_loop:
        targets = list(qps) if qps else [f * best["throughput_qps"] for f in settings.qps_fractions if f * best["throughput_qps"] > 0]
        for n, target in enumerate(targets):
            session.progress(f"load: open loop at {target:.2f} q/s")
            open_levels.append(await open_level(session, questions, target, overrides, seed + n))
    return {
        "mode": "load",
        "questions": len(questions),
        "options": overrides,
        "server_stats": session.server_stats,
        "settings": session.settings.load.model_dump(mode="json"),
        "closed_loop": closed,
        "saturation": stop_reason or "the sweep reached its last level",
        "best_closed_loop": {"concurrency": best["concurrency"], "throughput_qps": best["throughput_qps"],
                             "goodput_qps": best["goodput_qps"],
                             "capacity_usd_per_query": usd_per_query_at_rate(session.settings.prices, best["throughput_qps"])},
        "open_loop": open_levels,
    }
