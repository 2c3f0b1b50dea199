"""Bounded admission: a fixed number of requests run, a bounded number wait, the rest are refused at once.

Under overload an unbounded queue turns into unbounded latency for everyone (and timeouts for all); a bounded
one keeps the admitted requests fast and tells the others to retry (RESOURCE_EXHAUSTED, naming the limit).
Waiting is first come, first served, and ends at the request's deadline. Each token may also have at most
`max_concurrent` requests running or waiting, so one tenant cannot fill the queue for all.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from ..errors import DeadlineExceededError, ResourceExhaustedError
from .security import Principal


@dataclass(frozen=True)
class PoolState:
    running: int
    waiting: int
    capacity: int
    queue_depth: int


class AdmissionPool:
    """One kind of work (queries, ingests): `capacity` slots and a FIFO of at most `queue_depth` waiters."""

    def __init__(self, kind: str, capacity: int, queue_depth: int, setting: str):
        self.kind = kind
        self.capacity = capacity
        self.queue_depth = queue_depth
        self.setting = setting  # the settings names of the limits, for the error message
        self.running = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._per_principal: collections.Counter[str] = collections.Counter()
        self.rejected: collections.Counter[str] = collections.Counter()  # reason -> count
        self.on_reject: Callable[[str], None] = lambda reason: None  # e.g. a metrics counter

    def state(self) -> PoolState:
        return PoolState(self.running, len(self._waiters), self.capacity, self.queue_depth)

    @contextlib.asynccontextmanager
    async def slot(self, principal: Principal, deadline: float) -> AsyncIterator[float]:
        """Hold a slot for the block; yields the seconds spent waiting for it."""
        limit = principal.max_concurrent
        if limit is not None and self._per_principal[principal.name] >= limit:
            self._reject("token_limit")
            raise ResourceExhaustedError(
                f"token '{principal.name}' already has {limit} requests in flight (auth.tokens max_concurrent = {limit})"
            )
        self._per_principal[principal.name] += 1
        try:
            waited = await self._acquire(deadline)
            try:
                yield waited
            finally:
                self._release()
        finally:
            self._per_principal[principal.name] -= 1
            if self._per_principal[principal.name] <= 0:
                del self._per_principal[principal.name]

    async def _acquire(self, deadline: float) -> float:
        if self.running < self.capacity and not self._waiters:
            self.running += 1
            return 0.0
        if len(self._waiters) >= self.queue_depth:
            self._reject("queue_full")
            raise ResourceExhaustedError(
                f"server busy: {self.running} {self.kind} running and {len(self._waiters)} waiting "
                f"({self.setting}); retry later"
            )
        started = time.monotonic()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - started))
        except asyncio.TimeoutError:
            if not self._forfeit(waiter):  # the slot arrived just as the time ran out: hand it on
                self._release()
            self._reject("deadline_in_queue")
            raise DeadlineExceededError(
                f"the deadline passed after {time.monotonic() - started:.2f} s waiting for one of "
                f"{self.capacity} {self.kind} slots"
            ) from None
        except BaseException:  # cancelled by the client while waiting
            if not self._forfeit(waiter):
                self._release()
            raise
        return time.monotonic() - started

    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1
        self.on_reject(reason)

    def _forfeit(self, waiter: asyncio.Future) -> bool:
        """Leave the queue; False when the slot had already been handed to this waiter."""
        if waiter.done():
            return False
        waiter.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        return True

    def _release(self) -> None:
        """Pass the slot to the first waiter still waiting, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to it: `running` stays the same
                return
        self.running -= 1


class Admission:
    def __init__(self, queries: AdmissionPool, ingests: AdmissionPool):
        self.queries = queries
        self.ingests = ingests

    @classmethod
    def from_settings(cls, server) -> "Admission":
        return cls(
            AdmissionPool("queries", server.max_concurrent_queries, server.max_queued_queries,
                          "server.max_concurrent_queries / max_queued_queries"),
            AdmissionPool("ingests", server.max_concurrent_ingests, server.max_queued_ingests,
                          "server.max_concurrent_ingests / max_queued_ingests"),
        )
