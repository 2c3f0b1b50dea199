"""Timed calls on the monotonic clock (time.perf_counter), warm-up calls run and discarded before any sample is kept:
a fixed number of calls (the benchmark scripts), or calls until a time window has passed (the GPU runner)."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable


def time_calls(call: Callable[[], object], repeat: int, warmup: int = 3) -> list[float]:
    """Each of `repeat` sequential calls' seconds, after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


async def time_async_calls(call: Callable[[], Awaitable[object]], repeat: int, warmup: int = 3) -> list[float]:
    """time_calls for a coroutine function."""
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


def time_window(call: Callable[[], object], seconds: float, min_calls: int, warmup: int = 2) -> tuple[list[float], float]:
    """Sequential calls after `warmup` untimed ones, until `seconds` passed and `min_calls` were made: each call's
    seconds, and the wall time of them all."""
    for _ in range(warmup):
        call()
    latencies = []
    began = time.perf_counter()
    while len(latencies) < min_calls or time.perf_counter() - began < seconds:
        start = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - start)
    return latencies, time.perf_counter() - began


async def time_async_window(call: Callable[[], Awaitable[object]], seconds: float, min_calls: int, inflight: int = 1,
                            warmup: int = 2) -> tuple[list[float], float]:
    """`inflight` closed-loop workers of `call` (after `warmup` untimed calls each) until `seconds` passed and
    `min_calls` were made: latencies and wall time."""
    await asyncio.gather(*(call() for _ in range(warmup * inflight)))
    latencies: list[float] = []
    began = time.perf_counter()

    async def worker() -> None:
        while len(latencies) < min_calls or time.perf_counter() - began < seconds:
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(inflight)))
    return latencies, time.perf_counter() - began
