"""A benchmark session against one target: the asyncio gRPC client, Triton's statistics (when its URL is known)
and the sequential query loop that attributes Triton's server-side time to each query."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

from orchestrator.client import AsyncThinkServeClient
from orchestrator.triton.client import TritonClient
from .query_costs import query_cost
from .prices import BenchSettings
from .record import QueryRecord, run_query
from .target import Target
from .triton_stats import Snapshot, Topology, read_topology, snapshot
from .workload import WorkloadQuestion


class BenchSession:
    def __init__(self, target: Target, settings: BenchSettings, collection: str, progress: Callable[[str], None] = print):
        self.target = target
        self.settings = settings
        self.collection = collection
        self.progress = progress
        self.client: Optional[AsyncThinkServeClient] = None
        self.triton: Optional[TritonClient] = None
        self.topology = Topology({}, frozenset())

    async def __aenter__(self) -> "BenchSession":
        self.client = AsyncThinkServeClient(self.target.address, timeout_s=self.settings.request_timeout_s, token=self.target.token)
        if self.target.triton_url:
            self.triton = TritonClient(self.target.triton_url, default_timeout_s=30)
            self.topology = await read_topology(self.triton)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.client is not None:
            await self.client.close()
        if self.triton is not None:
            await self.triton.close()

    @property
    def target_in_process(self) -> bool:
        return self.target.in_process

    @property
    def server_stats(self) -> bool:
        return self.triton is not None

    async def snapshot(self) -> Optional[Snapshot]:
        return await snapshot(self.triton) if self.triton is not None else None

    async def query(self, question: WorkloadQuestion, config: str, overrides: Optional[dict[str, Any]] = None,
                    due_s: Optional[float] = None) -> QueryRecord:
        return await run_query(self.client, self.collection, question, config, overrides, due_s)

    async def warm_up(self, questions: Sequence[WorkloadQuestion], overrides: Optional[dict[str, Any]] = None) -> None:
        """Run and discard the first few questions (models, caches and connections warm)."""
        for question in list(questions)[: self.settings.warmup_queries]:
            await self.query(question, "warm-up", overrides)

    async def sequential(self, question: WorkloadQuestion, config: str, overrides: Optional[dict[str, Any]] = None) -> QueryRecord:
        """One query alone on the server, with Triton's counters snapshotted around it: its own server-side time."""
        before = await self.snapshot()
        record = await self.query(question, config, overrides)
        after = await self.snapshot()
        server = after.since(before) if before is not None and after is not None else None
        if server is not None:
            record.server = self.topology.leaves(server)
        if record.ok:
            public = self.topology.by_public_model(server) if server is not None else None
            record.cost = query_cost(record.usage, self.settings.prices, public, self.topology.decoupled)
        return record


def now() -> float:
    return time.monotonic()
