"""What one query cost: every model call with its stage, wall time, items and tokens.

Stages get a `StageModels` view of the models: the protocol's methods (orchestrator.models.protocol.Models)
over any implementation of it, each call recorded in the query's ledger under that stage. From the ledger come the cost report (calls, items, tokens in and out,
model milliseconds per model and stage) and the orchestrator's own time: the query's wall time minus the
time at least one model call was in flight.

Model milliseconds are measured around each call on the orchestrator's clock (queueing and transfer
included); Triton's own per-model compute statistics are cumulative over all requests, so they serve the
benchmarks, not the attribution of one query.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Optional, Sequence, TypeVar

import numpy as np

from ..models import contracts
from ..models.protocol import GenerationChunk, GenerationOptions, GeneratorFacts, Models, PageText
from .timing import StageTimer
from .usage import CostReport, ModelUsage

TokenCounter = Callable[[Sequence[str]], int]
T = TypeVar("T")


@dataclass
class ModelCall:
    model: str
    stage: str
    started: float
    ended: float = 0.0
    items: int = 0
    tokens_in: int = 0
    tokens_out: int = 0


@dataclass
class QueryLedger:
    clock: Callable[[], float] = time.monotonic
    calls: list[ModelCall] = field(default_factory=list)

    @contextlib.contextmanager
    def record(self, model: str, stage: str, items: int = 0, tokens_in: int = 0):
        call = ModelCall(model, stage, self.clock(), items=items, tokens_in=tokens_in)
        self.calls.append(call)
        try:
            yield call
        finally:
            call.ended = call.ended or self.clock()  # an end marked when the model answered stands

    def report(self, total_ms: float) -> CostReport:
        grouped: dict[tuple[str, str], list[ModelCall]] = {}
        for call in self.calls:
            grouped.setdefault((call.model, call.stage), []).append(call)
        usage = tuple(
            ModelUsage(
                model,
                stage,
                len(calls),
                sum(c.items for c in calls),
                sum(c.tokens_in for c in calls),
                sum(c.tokens_out for c in calls),
                sum(c.ended - c.started for c in calls) * 1000.0,
            )
            for (model, stage), calls in grouped.items()
        )
        busy = busy_ms([(c.started, c.ended) for c in self.calls])
        return CostReport(usage, busy, max(0.0, total_ms - busy))


def busy_ms(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (seconds in, milliseconds out): overlapping calls count once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total * 1000.0


# Timer entries that are moments or umbrellas, not stages of their own: their time is in the stages they span.
NOT_STAGES = frozenset({"total", "rag_ttft", "llm_ttft", "retrieval"})
# The ledger's stage name -> the timer's, where they differ (the answering model's calls run in llm_generation).
TIMER_STAGE = {"llm": "llm_generation", "vlm_answer": "llm_generation"}


def own_time_by_stage(timer: StageTimer, ledger: QueryLedger, orchestrator_ms: float) -> dict[str, float]:
    """Milliseconds of each stage spent outside its own model calls (see CostReport.orchestrator_ms_by_stage)."""
    calls: dict[str, list[tuple[float, float]]] = {}
    for call in ledger.calls:
        calls.setdefault(TIMER_STAGE.get(call.stage, call.stage), []).append((call.started, call.ended))
    own: dict[str, float] = dict(timer.merged)  # computed in a worker thread that calls no model
    for stage, intervals in timer.intervals.items():
        if stage in NOT_STAGES:
            continue
        waiting = sum(
            busy_ms([(max(start, began), min(end, ended)) for start, end in calls.get(stage, ()) if start < ended and end > began])
            for began, ended in intervals
        )
        own[stage] = own.get(stage, 0.0) + max(0.0, sum(e - b for b, e in intervals) * 1000.0 - waiting)
    own["unattributed"] = max(0.0, orchestrator_ms - sum(own.values()))
    return own


class StageModels:
    """The models' methods for one stage of one query, each call recorded in the ledger."""

    def __init__(self, models: Models, ledger: QueryLedger, stage: str, count_tokens: TokenCounter):
        self.models = models
        self.ledger = ledger
        self.stage = stage
        self.count_tokens = count_tokens

    def _record(self, model: str, items: int, tokens_in: int = 0):
        return self.ledger.record(model, self.stage, items, tokens_in)

    async def _counted(self, model: str, items: int, work: Awaitable[T], tokens: Callable[[], int]) -> T:
        """A model call recorded in the ledger, its input tokens counted while it is in flight: the count is
        bookkeeping, so it need not add to the query's latency. The call's time ends when the model answers."""
        with self._record(model, items) as call:

            async def answered() -> T:
                try:
                    return await work
                finally:
                    call.ended = self.ledger.clock()

            task = asyncio.ensure_future(answered())
            try:
                await asyncio.sleep(0)  # the request leaves before the count starts
                call.tokens_in = tokens()
                return await task
            finally:
                if not task.done():
                    task.cancel()

    async def embed(
        self, texts: Sequence[str], timeout_s: Optional[float] = None, tokens: Optional[Callable[[], int]] = None,
    ) -> np.ndarray:
        """`tokens`: the input's token count when the caller knows it better (counted at commit time)."""
        return await self._counted(contracts.TEXT_EMBEDDER.name, len(texts), self.models.embed(texts, timeout_s),
                                   tokens or (lambda: self.count_tokens(texts)))

    async def rerank(self, query: str, passages: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        return await self._counted(contracts.RERANKER.name, len(passages), self.models.rerank(query, passages, timeout_s),
                                   lambda: self.count_tokens([query]) * len(passages) + self.count_tokens(passages))

    async def route(self, questions: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        return await self._counted(contracts.ROUTER.name, len(questions), self.models.route(questions, timeout_s),
                                   lambda: self.count_tokens(questions))

    async def embed_page_text(self, family: str, texts: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        return await self._counted(contracts.page_text_encoder(family).name, len(texts),
                                   self.models.embed_page_text(family, texts, timeout_s), lambda: self.count_tokens(texts))

    async def embed_page_images(self, family: str, images: Sequence[bytes], timeout_s: Optional[float] = None) -> np.ndarray:
        return await self._counted(contracts.page_image_encoder(family).name, len(images),
                                   self.models.embed_page_images(family, images, timeout_s), lambda: 0)

    async def page_relevance(self, question: str, images: Sequence[bytes], timeout_s: Optional[float] = None) -> np.ndarray:
        return await self._counted(contracts.VLM_RELEVANCE.name, len(images), self.models.page_relevance(question, images, timeout_s),
                                   lambda: self.count_tokens([question]) * len(images))

    async def read_text(self, images: Sequence[bytes], timeout_s: Optional[float] = None) -> list[PageText]:
        return await self._counted(contracts.OCR.name, len(images), self.models.read_text(images, timeout_s), lambda: 0)

    async def generator_facts(self, model: str) -> GeneratorFacts:
        return await self.models.generator_facts(model)  # the deployed config, read once: not a model call

    @contextlib.asynccontextmanager
    async def generate(
        self,
        prompt: str,
        options: GenerationOptions,
        images: Sequence[bytes] = (),
        timeout_s: Optional[float] = None,
        request_id: str = "",
    ) -> AsyncIterator[AsyncIterator[GenerationChunk]]:
        """As TritonModels.generate; the prompt and completion tokens are the model's own counts."""
        model = contracts.VLM.name if images else contracts.LLM.name
        with self._record(model, 1 + len(images)) as call:
            async with self.models.generate(prompt, options, images, timeout_s, request_id) as chunks:

                async def counted() -> AsyncIterator[GenerationChunk]:
                    async for chunk in chunks:
                        call.tokens_in, call.tokens_out = chunk.prompt_tokens, chunk.completion_tokens
                        yield chunk

                yield counted()

    async def complete(
        self, prompt: str, options: GenerationOptions, images: Sequence[bytes] = (), timeout_s: Optional[float] = None,
        request_id: str = "",
    ) -> "Completion":
        """A whole generation, not streamed: its text and every token's normalised entropy and log-probability."""
        parts: list[str] = []
        entropies: list[float] = []
        log_probs: list[float] = []
        finish = ""
        async with self.generate(prompt, options, images, timeout_s, request_id) as chunks:
            async for chunk in chunks:
                parts.append(chunk.text)
                entropies.extend(chunk.normalized_entropy)
                log_probs.extend(chunk.log_probs)
                finish = chunk.finish_reason or finish
        return Completion("".join(parts).strip(), tuple(entropies), finish, tuple(log_probs))


@dataclass(frozen=True)
class Completion:
    text: str
    normalized_entropy: tuple[float, ...]
    finish_reason: str
    log_probs: tuple[float, ...] = ()
