"""Soak: hours of mixed load against a writer and a read replica, watching for what a minute-long test cannot show:
memory or descriptors that grow per query or per document, a p99 that drifts, a replica that falls behind.

While it runs:
  questions  open-loop Poisson arrivals at a steady rate near the knee (given, or a fraction of the closed-loop
             throughput measured first at as many queries in flight as the machine has cores), alternating between
             the writer and the replica as a round-robin load balancer would; latency counts from when each was due
  churn      every --churn-interval s one document operation on the writer, in rotation over a few slots (PDFs,
             parsed by MinerU, and Markdown): add, replace with other bytes, delete; so the collection's size stays
             bounded and memory should stay flat once warm
  lag        after each operation returns on the writer, how long until the replica shows it (GetDocument gives
             the new document id, or NOT_FOUND after a delete)
  samples    every --sample-interval s: RSS, open file descriptors and threads of both orchestrators, tritonserver
             and each python-backend stub (by model), Triton's /dev/shm regions, the data folder's bytes
At the end: per-minute p50/p95/p99 and errors by code, every series' growth after the warm-up as a least-squares
slope per hour (growth.py) with a verdict against a limit, the p99 of each minute against the baseline window's
(the first hour after the warm-up, or the first half of a shorter run), the replica's lag, and the servers' own
request counts by code (their /metrics). A deliberate refusal (RESOURCE_EXHAUSTED, HTTP 429) is not a failure.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import grpc
import httpx

from orchestrator.client import AsyncThinkServeClient
from .. import process_sampler as procs
from ..growth import verdict
from ..record import OK, REJECTED, run_query
from ..soak_deployment import SoakDeployment
from ..stats import distribution, percentile
from ..workload import WorkloadQuestion

MAX_IN_FLIGHT = 256  # arrivals beyond this many queries in flight are counted as dropped by the generator
LAG_POLL_S = 0.05
CHECKPOINT_S = 600.0  # a partial report this often: a long run cut short still leaves its data


@dataclass(frozen=True)
class SoakPlan:
    duration_s: float = 7200.0
    warmup_s: float = 600.0  # left out of the growth fits (allocator arenas, caches, first builds)
    rate_qps: Optional[float] = None  # None: knee_fraction x the closed-loop throughput measured first
    knee_fraction: float = 0.6
    knee_seconds: float = 30.0
    churn_interval_s: float = 30.0
    churn_slots: int = 4  # documents that come and go (even slots PDFs, odd Markdown)
    sample_interval_s: float = 10.0
    query_timeout_s: float = 60.0
    ingest_timeout_s: float = 900.0
    lag_timeout_s: float = 120.0
    growth_limit_pct_per_h: float = 5.0
    p99_limit_ratio: float = 2.0
    seed: int = 7
    options: dict = field(default_factory=dict)


@dataclass
class ChurnDocuments:
    """What the churn ingests: a pool of generated PDFs (cycled) and Markdown made fresh for each operation."""

    pdfs: list[Path]
    counter: itertools.count = field(default_factory=itertools.count)

    def pdf(self) -> bytes:
        return self.pdfs[next(self.counter) % len(self.pdfs)].read_bytes()

    def markdown(self, rng: random.Random) -> bytes:
        number = next(self.counter)
        site = rng.choice(["Harbourview", "Kestrel Point", "Millbrook", "Ashford Quay", "Dunmore"])
        lines = [f"# Depot bulletin {number}", "", f"The {site} depot counted {rng.randint(10, 9999)} crates of spare "
                 f"parts in week {number}.", "", f"Shipments to the {site} yard rose by {rng.randint(1, 90)} percent, "
                 f"and {rng.randint(2, 40)} forklifts were serviced."]
        return "\n".join(lines).encode()


# ---------------------------------------------------------------------- the run


class _Soak:
    def __init__(self, deployment: SoakDeployment, plan: SoakPlan, questions: Sequence[WorkloadQuestion],
                 churn: ChurnDocuments, collection: str, progress: Callable[[str], None],
                 checkpoint: Optional[Callable[[dict], None]] = None):
        self.deployment, self.plan, self.questions, self.churn = deployment, plan, list(questions), churn
        self.collection, self.progress, self.checkpoint = collection, progress, checkpoint
        self.rng = random.Random(plan.seed)
        self.started = 0.0
        self.queries: list[dict] = []
        self.operations: list[dict] = []
        self.samples: list[dict] = []
        self.dropped = 0
        self.in_flight = 0
        self.clients: dict[str, AsyncThinkServeClient] = {}

    def now(self) -> float:
        return time.monotonic() - self.started

    async def run(self) -> dict:
        plan = self.plan
        d = self.deployment
        self.clients = {
            "writer": AsyncThinkServeClient(d.writer.address, timeout_s=plan.query_timeout_s),
            "replica": AsyncThinkServeClient(d.replica.address, timeout_s=plan.query_timeout_s),
        }
        try:
            knee = await self._knee() if plan.rate_qps is None else None
            rate = plan.rate_qps if plan.rate_qps is not None else plan.knee_fraction * knee["queries_per_s"]
            self.progress(f"soak: {rate:.2f} questions/s for {plan.duration_s / 60:.0f} min, a document operation every "
                          f"{plan.churn_interval_s:g} s, samples every {plan.sample_interval_s:g} s")
            self.started = time.monotonic()
            stop = asyncio.Event()
            tasks = [asyncio.create_task(job) for job in (self._arrivals(rate, stop), self._churn_loop(stop),
                                                          self._sampler(stop), self._reporter(stop, rate, knee))]
            try:
                await asyncio.sleep(plan.duration_s)
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
            ended = self.now()
            server_counts = {role: await _request_counts(server.http) for role, server in
                             (("writer", d.writer), ("replica", d.replica))}
            alive = {role: server.process.poll() is None for role, server in (("writer", d.writer), ("replica", d.replica))}
        finally:
            for client in self.clients.values():
                await client.close()
        return self.result(rate, knee, ended, server_counts, alive)

    # ------------------------------------------------------------------ questions

    async def _knee(self) -> dict:
        """Closed loop at as many queries in flight as cores, alternating targets: the throughput the rate is a
        fraction of (no churn yet)."""
        import os

        workers = max(2, os.cpu_count() or 2)
        self.progress(f"soak: measuring the knee (closed loop, {workers} in flight, {self.plan.knee_seconds:g} s) ...")
        latencies: list[float] = []
        order = itertools.cycle(self.questions)
        targets = itertools.cycle(self.clients)

        async def worker() -> None:
            while time.monotonic() < end:
                record = await run_query(self.clients[next(targets)], self.collection, next(order), "knee", self.plan.options)
                if record.ok and record.ended_s <= end:
                    latencies.append(record.client_ms)

        for question in self.questions[:4]:  # warm
            await run_query(self.clients["writer"], self.collection, question, "warm", self.plan.options)
        started = time.monotonic()
        end = started + self.plan.knee_seconds
        await asyncio.gather(*(worker() for _ in range(workers)))
        result = {"concurrency": workers, "seconds": self.plan.knee_seconds,
                  "queries_per_s": len(latencies) / self.plan.knee_seconds, "latency": distribution(latencies)}
        self.progress(f"soak: knee {result['queries_per_s']:.2f} q/s at {workers} in flight "
                      f"(p50 {result['latency']['p50_ms'] or 0:.0f} ms)")
        if not latencies:
            raise RuntimeError("no question was answered while measuring the knee")
        return result

    async def _arrivals(self, rate: float, stop: asyncio.Event) -> None:
        order = itertools.cycle(self.questions)
        targets = itertools.cycle(["writer", "replica"])
        due = time.monotonic()
        pending: set[asyncio.Task] = set()
        while not stop.is_set():
            due += self.rng.expovariate(rate)
            delay = due - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    break
                except asyncio.TimeoutError:
                    pass
            if self.in_flight >= MAX_IN_FLIGHT:
                self.dropped += 1
                continue
            task = asyncio.create_task(self._ask(next(targets), next(order), due))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:  # the last queries end (each has its deadline)
            await asyncio.wait(pending, timeout=self.plan.query_timeout_s + 5)

    async def _ask(self, target: str, question: WorkloadQuestion, due: float) -> None:
        self.in_flight += 1
        try:
            record = await run_query(self.clients[target], self.collection, question, target, self.plan.options, due_s=due)
        finally:
            self.in_flight -= 1
        code = "OK" if record.ok else (record.error.split(":", 1)[0] or record.status.upper())
        self.queries.append({"t": round(due - self.started, 3), "target": target, "ms": record.client_ms,
                             "status": record.status, "code": code,
                             "error": record.error[:200] if not record.ok else "", "degraded": record.degraded})

    # ------------------------------------------------------------------ churn and lag

    async def _churn_loop(self, stop: asyncio.Event) -> None:
        present: dict[int, str] = {}  # slot -> its document id on the writer
        replaced: dict[int, bool] = {}
        lags: set[asyncio.Task] = set()
        for number in itertools.count():
            try:
                await asyncio.wait_for(stop.wait(), self.plan.churn_interval_s * self.rng.uniform(0.5, 1.5))
                break
            except asyncio.TimeoutError:
                pass
            slot = number % self.plan.churn_slots
            pdf = slot % 2 == 0
            name = f"churn-{slot}.{'pdf' if pdf else 'md'}"
            kind = "add" if slot not in present else ("replace" if not replaced.get(slot) else "delete")
            operation = {"t": round(self.now(), 3), "kind": kind, "document": name, "ok": True, "code": "OK"}
            began = time.monotonic()
            try:
                if kind == "delete":
                    await self.clients["writer"].delete_document(self.collection, name, timeout_s=self.plan.ingest_timeout_s)
                    present.pop(slot)
                    replaced[slot] = False
                    expected = None
                else:
                    data = self.churn.pdf() if pdf else self.churn.markdown(self.rng)
                    report = await self._writer_ingest(data, name)
                    present[slot], replaced[slot] = report.document_id, kind == "replace"
                    expected = report.document_id
                    operation["already_present"] = report.already_present
            except grpc.aio.AioRpcError as error:
                operation.update(ok=False, code=error.code().name, error=(error.details() or "")[:200])
            operation["seconds"] = round(time.monotonic() - began, 3)
            self.operations.append(operation)
            if operation["ok"]:
                task = asyncio.create_task(self._lag(operation, name, expected, time.monotonic()))
                lags.add(task)
                task.add_done_callback(lags.discard)
        if lags:
            await asyncio.wait(lags, timeout=self.plan.lag_timeout_s + 5)

    async def _writer_ingest(self, data: bytes, name: str):
        client = AsyncThinkServeClient(self.deployment.writer.address, timeout_s=self.plan.ingest_timeout_s)
        try:
            return await client.ingest(self.collection, data, name)
        finally:
            await client.close()

    async def _lag(self, operation: dict, name: str, expected: Optional[str], committed: float) -> None:
        """Seconds until the replica shows the writer's change (None: not within lag_timeout_s)."""
        replica = self.clients["replica"]
        deadline = committed + self.plan.lag_timeout_s
        while time.monotonic() < deadline:
            try:
                info = await replica.get_document(self.collection, name, timeout_s=10)
                seen = info.document_id == expected
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:
                    operation.setdefault("lag_errors", []).append(error.code().name)
                seen = expected is None and error.code() == grpc.StatusCode.NOT_FOUND
            if seen:
                operation["lag_s"] = round(time.monotonic() - committed, 3)
                return
            await asyncio.sleep(LAG_POLL_S)
        operation["lag_s"] = None

    # ------------------------------------------------------------------ samples

    async def _sampler(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.samples.append(await asyncio.to_thread(self._sample))
            try:
                await asyncio.wait_for(stop.wait(), self.plan.sample_interval_s)
            except asyncio.TimeoutError:
                pass

    def _sample(self) -> dict:
        d = self.deployment
        entry: dict[str, Any] = {"t": round(self.now(), 3), "in_flight": self.in_flight}
        triton = d.triton_pid
        tritons = {triton, *procs.descendants(triton)} if triton else set()
        for role, server in (("writer", d.writer), ("replica", d.replica)):
            found = procs.sample(server.pid)
            entry[role] = found.as_dict() if found else None
            helpers = [p for p in procs.descendants(server.pid) if p not in tritons]  # the watchdog, MinerU's parses
            entry[f"{role}_children"] = procs.total(procs.sample(p) for p in helpers)
        found = procs.sample(triton) if triton else None
        entry["triton"] = found.as_dict() if found else None
        stubs: dict[str, dict] = {}
        for pid in procs.children(triton) if triton else []:
            found = procs.sample(pid)
            if found is not None:
                model = procs.stub_model(pid) or found.name
                stubs[f"{model}:{pid}"] = found.as_dict()
        entry["stubs"] = stubs
        entry["shm_bytes"] = procs.shm_bytes(procs.shm_prefix(triton)) if triton else 0
        entry["data_bytes"] = procs.folder_bytes(d.data_dir)
        return entry

    async def _reporter(self, stop: asyncio.Event, rate: float, knee: Optional[dict]) -> None:
        """A progress line a minute, and a partial report every CHECKPOINT_S."""
        last_checkpoint = time.monotonic()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 60.0)
                return
            except asyncio.TimeoutError:
                pass
            minute = int(self.now() // 60)
            recent = [q for q in self.queries if minute - 1 <= q["t"] / 60 < minute]
            ok = [q["ms"] for q in recent if q["status"] == OK]
            failed = sum(q["status"] not in (OK, REJECTED) for q in recent)
            writer = (self.samples[-1].get("writer") or {}) if self.samples else {}
            self.progress(f"soak: minute {minute}: {len(recent)} questions, p99 {percentile(ok, 99) or 0:.0f} ms, "
                          f"{failed} failed, {len(self.operations)} document operations, writer RSS "
                          f"{writer.get('rss_kib', 0) / 1024:.0f} MiB, {writer.get('fds', 0)} fds")
            if self.checkpoint is not None and time.monotonic() - last_checkpoint >= CHECKPOINT_S:
                last_checkpoint = time.monotonic()
                await asyncio.to_thread(self.checkpoint, self.result(rate, knee, self.now(), {}, {}, partial=True))

    # ------------------------------------------------------------------ the result

    def result(self, rate: float, knee: Optional[dict], ended_s: float, server_counts: dict, alive: dict,
               partial: bool = False) -> dict:
        plan = self.plan
        queries, operations, samples = list(self.queries), list(self.operations), list(self.samples)
        baseline_end = plan.warmup_s + min(3600.0, max(0.0, ended_s - plan.warmup_s) / 2)
        minutes = per_minute(queries, operations, ended_s)
        baseline = [q["ms"] for q in queries if q["status"] == OK and plan.warmup_s <= q["t"] < baseline_end]
        baseline_p99 = percentile(baseline, 99)
        later = [m for m in minutes if m["start_s"] >= baseline_end and m["p99_ms"] is not None]
        ratios = [m["p99_ms"] / baseline_p99 for m in later] if baseline_p99 else []
        codes = Counter(q["code"] for q in queries)
        failures = [q for q in queries if q["status"] not in (OK, REJECTED)]
        failed_operations = [o for o in operations if not o["ok"] and o["code"] != "RESOURCE_EXHAUSTED"]
        lags = [o["lag_s"] for o in operations if o.get("lag_s") is not None]
        unfollowed = [o for o in operations if o["ok"] and "lag_s" in o and o["lag_s"] is None]
        series = growth_series(samples)
        growth = {name: verdict(times, values, plan.warmup_s, plan.growth_limit_pct_per_h)
                  for name, (times, values) in series.items()}
        gated = [name for name in GATED if name in growth]
        return {
            "mode": "soak", "partial": partial, "plan": asdict(plan), "rate_qps": rate, "knee": knee,
            "seconds": ended_s, "questions": len(queries), "dropped_by_generator": self.dropped,
            "codes": dict(codes), "failed_questions": len(failures), "failure_examples": failures[:20],
            "rejected_questions": codes.get("RESOURCE_EXHAUSTED", 0),
            "degraded_answers": sum(bool(q.get("degraded")) for q in queries),
            "latency_all": distribution(q["ms"] for q in queries if q["status"] == OK),
            "latency_by_target": {t: distribution(q["ms"] for q in queries if q["status"] == OK and q["target"] == t)
                                  for t in ("writer", "replica")},
            "baseline": {"start_s": plan.warmup_s, "end_s": baseline_end, "p99_ms": baseline_p99},
            "p99_ratio": {"max": max(ratios) if ratios else None, "minutes": len(ratios),
                          "minutes_over_limit": sum(r > plan.p99_limit_ratio for r in ratios), "limit": plan.p99_limit_ratio},
            "operations": {"count": len(operations), "by_kind": dict(Counter(o["kind"] for o in operations)),
                           "failed": len(failed_operations), "failure_examples": failed_operations[:20],
                           "seconds": distribution(1000 * o["seconds"] for o in operations)},
            "replica_lag": {"count": len(lags), "not_followed": len(unfollowed),
                            "ms": distribution(1000 * s for s in lags), "by_hour": lag_by_hour(operations)},
            "growth": growth, "growth_gated": gated,
            "verdict": {
                "failed_requests": len(failures) + len(failed_operations),
                "memory_and_fds_flat": all(growth[n]["flat"] for n in gated) if gated else None,
                "p99_within_limit": (not ratios or max(ratios) <= plan.p99_limit_ratio) if baseline_p99 else None,
                "replica_followed_every_change": not unfollowed,
                "servers_alive": alive,
            },
            "server_request_counts": server_counts,
            "minutes": minutes,
            "queries_raw": queries, "operations_raw": operations, "samples": samples,
        }


GATED = ("writer_rss_kib", "writer_fds", "replica_rss_kib", "replica_fds")  # the goal: the orchestrators flat


def growth_series(samples: Sequence[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """name -> (times, values) of every sampled series (processes that disappeared leave gaps)."""
    series: dict[str, tuple[list[float], list[float]]] = {}

    def add(name: str, t: float, value: Optional[float]) -> None:
        if value is not None:
            times, values = series.setdefault(name, ([], []))
            times.append(t)
            values.append(float(value))

    for sample in samples:
        t = sample["t"]
        for role in ("writer", "replica", "triton"):
            process = sample.get(role)
            for metric in ("rss_kib", "fds", "threads"):
                add(f"{role}_{metric}", t, process[metric] if process else None)
        stubs = sample.get("stubs") or {}
        if stubs:
            add("stubs_rss_kib", t, sum(s["rss_kib"] for s in stubs.values()))
            add("stubs_fds", t, sum(s["fds"] for s in stubs.values()))
            for key, stub in stubs.items():
                add(f"stub_{key.split(':')[0]}_rss_kib", t, stub["rss_kib"])
        add("shm_bytes", t, sample.get("shm_bytes"))
        add("data_bytes", t, sample.get("data_bytes"))
    return series


def per_minute(queries: Sequence[dict], operations: Sequence[dict], ended_s: float) -> list[dict]:
    out = []
    for minute in range(math.ceil(ended_s / 60 - 0.05)):  # a trailing sliver of a minute (the stop) is no minute
        start, end = 60.0 * minute, 60.0 * (minute + 1)
        inside = [q for q in queries if start <= q["t"] < end]
        ok = [q["ms"] for q in inside if q["status"] == OK]
        out.append({
            "minute": minute, "start_s": start, "questions": len(inside), "ok": len(ok),
            "p50_ms": percentile(ok, 50), "p95_ms": percentile(ok, 95), "p99_ms": percentile(ok, 99),
            "codes": dict(Counter(q["code"] for q in inside if q["code"] != "OK")),
            "operations": sum(start <= o["t"] < end for o in operations),
            "max_lag_s": max((o["lag_s"] for o in operations if start <= o["t"] < end and o.get("lag_s") is not None),
                             default=None),
        })
    return out


def lag_by_hour(operations: Sequence[dict]) -> list[dict]:
    hours: dict[int, list[float]] = {}
    for o in operations:
        if o.get("lag_s") is not None:
            hours.setdefault(int(o["t"] // 3600), []).append(o["lag_s"])
    return [{"hour": h, "count": len(v), "p50_s": percentile(v, 50), "p95_s": percentile(v, 95), "max_s": max(v)}
            for h, v in sorted(hours.items())]


_REQUESTS = re.compile(r'^thinkserve_requests_total\{([^}]*)\}\s+([0-9.e+]+)', re.M)


async def _request_counts(http: str) -> dict:
    """The server's own finished requests by method and code (its /metrics), {} when unreachable."""
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            text = (await client.get(f"{http}/metrics")).text
    except httpx.HTTPError as error:
        return {"error": str(error)}
    counts: dict[str, float] = {}
    for labels, value in _REQUESTS.findall(text):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        counts[f"{fields.get('method')} {fields.get('code')}"] = float(value)
    return counts


async def run_soak(deployment: SoakDeployment, plan: SoakPlan, questions: Sequence[WorkloadQuestion],
                   churn: ChurnDocuments, collection: str, progress: Callable[[str], None] = print,
                   checkpoint: Optional[Callable[[dict], None]] = None) -> dict:
    return await _Soak(deployment, plan, questions, churn, collection, progress, checkpoint).run()
