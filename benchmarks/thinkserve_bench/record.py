"""One query as the benchmarks see it: sent over gRPC like any client, timed on the monotonic clock, with the
pipeline's own stage timings, usage and cost from its final event, and the outcome (ok, rejected, timeout, error)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import grpc

from .query_costs import QueryCost, Usage, usage_from_proto
from .stats import gaps_ms
from .triton_stats import ModelCounters
from .workload import ExpectedPage, WorkloadQuestion

# RESOURCE_EXHAUSTED is the server's admission control saying "at capacity": a rejection, not a failure.
REJECTED, TIMEOUT, ERROR, OK = "rejected", "timeout", "error", "ok"


@dataclass
class QueryRecord:
    question_id: str
    question_type: str
    config: str  # the run's label for the options sent (routed, complex, an ablation's name, ...)
    started_s: float  # monotonic, when the request was sent (open loop: when it was due)
    ended_s: float = 0.0  # monotonic, when the final event (or the error) arrived
    status: str = OK
    error: str = ""
    client_ms: Optional[float] = None  # end to end as the client saw it: request sent (or due) -> final event
    route_event_ms: Optional[float] = None
    evidence_event_ms: Optional[float] = None
    first_delta_ms: Optional[float] = None
    inter_token_ms: list[float] = field(default_factory=list)  # gaps between answer deltas, client side
    route: str = ""
    route_source: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # the pipeline's own stage timings
    usage: list[Usage] = field(default_factory=list)
    model_ms: float = 0.0
    orchestrator_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    answer_source: str = ""
    finish_reason: str = ""
    degraded: bool = False
    evidence_pages: list[tuple[str, list[int]]] = field(default_factory=list)  # (document, pages) by rank
    lateness_ms: float = 0.0  # open loop: how late the generator sent it
    server: Optional[dict[str, ModelCounters]] = None  # Triton counters of this query per leaf model (sequential runs)
    cost: Optional[QueryCost] = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cost"] = self.cost.as_dict() if self.cost else None
        out["server"] = {name: c.as_dict() for name, c in self.server.items()} if self.server is not None else None
        return out


def _status(error: grpc.aio.AioRpcError) -> str:
    code = error.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return REJECTED
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TIMEOUT
    return ERROR


async def run_query(
    client,
    collection: str,
    question: WorkloadQuestion,
    config: str,
    overrides: Optional[dict[str, Any]] = None,
    due_s: Optional[float] = None,
) -> QueryRecord:
    """Send one query and read its stream to the end. `due_s`: the open loop's scheduled send time, from which
    latency is counted (a late generator must not hide queueing: no coordinated omission)."""
    sent = time.monotonic()
    began = due_s if due_s is not None else sent
    record = QueryRecord(question.id, question.type, config, began, lateness_ms=(sent - began) * 1000.0)
    deltas: list[float] = []
    try:
        async for event in client.query(question.collection or collection, question.question, **question.query_options(overrides)):
            now = time.monotonic()
            kind = event.WhichOneof("event")
            if kind == "route":
                record.route_event_ms = (now - began) * 1000.0
                record.route, record.route_source = event.route.label, event.route.source
            elif kind == "evidence":
                record.evidence_event_ms = (now - began) * 1000.0
                record.evidence_pages = [
                    (item.document_name, sorted({r.page for r in item.regions} or {item.page}))
                    for item in sorted(event.evidence.items, key=lambda item: item.rank)
                ]
            elif kind == "delta":
                deltas.append(now)
            elif kind == "final":
                final = event.final
                record.client_ms = (now - began) * 1000.0
                record.timings = {t.stage: t.milliseconds for t in final.timings}
                record.usage = [usage_from_proto(u) for u in final.cost.models]
                record.model_ms, record.orchestrator_ms = final.cost.model_ms, final.cost.orchestrator_ms
                record.prompt_tokens, record.completion_tokens = final.usage.prompt_tokens, final.usage.completion_tokens
                record.answer_source, record.finish_reason = final.answer_source, final.finish_reason
                record.degraded = final.degraded
    except grpc.aio.AioRpcError as error:
        record.ended_s = time.monotonic()
        record.status, record.error = _status(error), f"{error.code().name}: {error.details()}"
        return record
    record.ended_s = time.monotonic()
    if record.client_ms is None:
        record.status, record.error = ERROR, "the stream ended without a final event"
        return record
    if deltas:
        record.first_delta_ms = (deltas[0] - began) * 1000.0
        record.inter_token_ms = gaps_ms(deltas)
    return record


def page_recall(record: QueryRecord, expected: tuple[ExpectedPage, ...], k: int) -> Optional[float]:
    """Share of the expected pages among the first k evidence items (a page of -1: the document itself); a
    failed query delivered none of them: 0."""
    if not expected:
        return None
    if not record.ok:
        return 0.0
    top = record.evidence_pages[:k]
    found = sum(
        1 for want in expected
        if any(document == want.document and (want.page < 0 or want.page in pages) for document, pages in top)
    )
    return found / len(expected)
