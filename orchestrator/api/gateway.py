"""What every call goes through, whatever its transport (gRPC or the OpenAI-compatible HTTP endpoint):
request id, authentication, collection scoping, admission, deadline, span, metrics and the request's log lines.

The transports only translate: metadata or headers in, events or errors out. Queries run here, so both
transports get the same limits, the same backpressure and the same numbers on /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Mapping, Optional

import numpy as np
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..config import Settings
from ..errors import InvalidRequestError, ThinkServeError, TritonUnavailableError
from ..knowledge.parsing.local_documents import LocalSource, read_source
from ..observability.logs import REQUEST_ID
from ..observability.metrics import ServiceMetrics
from ..pipeline.events import FinalAnswerEvent, QueryEvent, RouteEvent
from ..pipeline.query import QueryInput, QueryPipeline
from .admission import Admission, AdmissionPool
from .security import Principal, TokenAuthority

log = logging.getLogger("thinkserve.api")
REQUEST_ID_HEADER = "x-request-id"
TRACE_CONTEXT = TraceContextTextMapPropagator()  # W3C traceparent / tracestate, whatever the global propagator


@dataclass(frozen=True)
class Call:
    method: str
    request_id: str
    principal: Principal
    deadline: float  # monotonic clock
    trace_context: Optional[Context] = None  # the request span's, parent of the stage spans

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


def request_id_from(supplied: str) -> str:
    """The client's request id (printable, at most 64 characters), or a new one."""
    cleaned = "".join(ch for ch in supplied if ch.isprintable() and not ch.isspace())[:64]
    return cleaned or uuid.uuid4().hex[:16]


class Gateway:
    def __init__(
        self,
        settings: Settings,
        pipeline: QueryPipeline,
        metrics: ServiceMetrics,
        tracer: trace.Tracer = trace.NoOpTracer(),
    ):
        self.settings = settings
        self.pipeline = pipeline
        self.metrics = metrics
        self.tracer = tracer
        self.authority = TokenAuthority(settings.auth)
        self.admission = Admission.from_settings(settings.server)
        self.started_at = time.time()
        self.draining = False  # set when shutdown begins: new calls get UNAVAILABLE, running ones finish
        pools = (self.admission.queries, self.admission.ingests)
        metrics.track_pools({pool.kind: _pool_reader(pool) for pool in pools})
        for pool in pools:
            pool.on_reject = functools.partial(_count_rejection, metrics, pool.kind)

    def deadline(self, client_timeout_s: Optional[float]) -> float:
        budget = self.settings.server.default_deadline_s if client_timeout_s is None else client_timeout_s
        return time.monotonic() + max(0.0, budget)

    @contextlib.asynccontextmanager
    async def call(
        self, method: str, authorization: str, request_id: str, client_timeout_s: Optional[float],
        carrier: Mapping[str, str] = {},
    ) -> AsyncIterator[Call]:
        """One request: authenticated, traced, counted and logged under its request id. `carrier`: the
        request's metadata or headers; a W3C `traceparent` in it makes the request's span a child of the
        caller's, so a trace continues through ThinkServe."""
        token = REQUEST_ID.set(request_id)
        started = time.monotonic()
        code = "OK"
        # Not made the current span: a streamed HTTP answer ends this call in another task than it began in.
        # Stage spans name it as their parent explicitly instead.
        span = self.tracer.start_span(
            f"thinkserve.{method}", context=TRACE_CONTEXT.extract(carrier), attributes={"thinkserve.request_id": request_id}
        )
        try:
            if self.draining and method != "Health":
                raise TritonUnavailableError("the server is shutting down; retry on another replica")
            principal = self.authority.authenticate(authorization)
            span.set_attribute("thinkserve.principal", principal.name)
            yield Call(method, request_id, principal, self.deadline(client_timeout_s), trace.set_span_in_context(span))
        except ThinkServeError as error:
            code = error.status.name
            log.info("%s failed: %s: %s", method, code, error)
            raise
        except (asyncio.CancelledError, GeneratorExit):  # the client went away
            code = "CANCELLED"
            raise
        except Exception:
            code = "INTERNAL"
            log.exception("%s: internal error", method)
            raise
        finally:
            span.set_attribute("thinkserve.status", code)
            span.end()
            self.metrics.request_done(method, code, time.monotonic() - started)
            with contextlib.suppress(ValueError):  # reset from another task's context: nothing to restore
                REQUEST_ID.reset(token)

    # ------------------------------------------------------------------ queries

    async def query(self, call: Call, query: QueryInput, answer: bool = True) -> AsyncIterator[QueryEvent]:
        """The query's events, once it is admitted; validation and scoping happen before it queues."""
        self.authority.authorize(call.principal, query.collection)
        checked = self.pipeline.validate(query)
        pool = self.admission.queries
        async with self._admitted(pool, call):
            route = ""
            run = self.pipeline.run(checked, call.deadline, call.request_id, answer=answer, trace_context=call.trace_context)
            async with contextlib.aclosing(run):  # closed, not left to the collector (QueryPipeline.run says why)
                async for event in run:
                    if isinstance(event, RouteEvent):
                        route = event.decision.label
                    elif isinstance(event, FinalAnswerEvent) and answer:
                        # recorded while the final event and the call's status go out (0.2 ms, about 30 series)
                        asyncio.get_running_loop().call_soon(self.metrics.query_done, route, event)
                    yield event

    async def embed(self, call: Call, texts: list[str]) -> tuple[np.ndarray, int]:
        """The text embedder's vectors for `texts` and their token count (as the embedder counts them), admitted
        as a query: what retrieval embeds a question with, for clients that index or compare texts themselves."""
        limit = self.settings.server.max_question_chars
        for number, text in enumerate(texts):
            if len(text) > limit:
                raise InvalidRequestError(f"input {number} has {len(text)} characters; the limit is {limit} (server.max_question_chars)")
        async with self._admitted(self.admission.queries, call):
            vectors = await self.pipeline.models.embed(texts, max(0.001, call.remaining()))
        return vectors, sum(self.pipeline.tokenizer.count(text) for text in texts)

    @contextlib.asynccontextmanager
    async def _admitted(self, pool: AdmissionPool, call: Call):
        async with pool.slot(call.principal, call.deadline) as waited:
            self.metrics.queue_wait.labels(pool.kind).observe(waited * 1000.0)
            yield

    @contextlib.asynccontextmanager
    async def ingest_slot(self, call: Call, collection: str):
        """Scoping (write access) and admission of one ingest."""
        self.authority.authorize(call.principal, collection, write=True)
        async with self._admitted(self.admission.ingests, call):
            yield

    # ------------------------------------------------------------------ server-side files

    def server_source(self, server_path: str, name: str) -> LocalSource:
        """A file (or MinerU output folder) named by server path: only under server.ingest_roots, symlinks
        resolved first. Errors repeat the client's own path, never where it resolved to."""
        roots = [Path(root).resolve() for root in self.settings.server.ingest_roots]
        if not roots:
            raise InvalidRequestError("this server does not ingest server-side paths (server.ingest_roots is empty)")
        try:
            resolved = Path(server_path).resolve(strict=True)
        except (OSError, RuntimeError):
            raise InvalidRequestError(f"server_path {server_path!r} does not exist") from None
        if not any(resolved.is_relative_to(root) for root in roots):
            raise InvalidRequestError(f"server_path {server_path!r} is not under an allowed ingest root")
        if resolved.is_file() and resolved.stat().st_size > self.settings.server.max_upload_bytes:
            raise InvalidRequestError(
                f"server_path {server_path!r} is larger than {self.settings.server.max_upload_bytes} bytes "
                "(server.max_upload_bytes)"
            )
        try:
            return read_source(resolved, name or resolved.name)
        except (OSError, ValueError) as error:
            raise InvalidRequestError(f"server_path {server_path!r} cannot be ingested: {_without_paths(error, resolved)}") from None


def _count_rejection(metrics: ServiceMetrics, pool: str, reason: str) -> None:
    metrics.rejected.labels(pool, reason).inc()


def _pool_reader(pool: AdmissionPool) -> Callable[[], tuple[int, int]]:
    def read() -> tuple[int, int]:
        state = pool.state()
        return state.running, state.waiting

    return read


def _without_paths(error: Exception, resolved: Path) -> str:
    return str(error).replace(str(resolved), "<server_path>")
