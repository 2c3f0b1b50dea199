"""The first query pipeline: embed the question, dense FAISS search, prompt, stream the LLM's answer.

Routing, sparse and graph retrieval, reranking, page images, perception and the uncertainty loop plug in
between these stages; each stage already reports its own timing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from ..config import Settings
from ..errors import DeadlineExceededError, InvalidRequestError, TritonUnavailableError
from ..knowledge.store import KnowledgeBase
from ..triton import contracts
from ..triton.models import GenerationOptions, TritonModels
from .events import (
    AnswerDeltaEvent,
    Citation,
    EvidenceEvent,
    EvidenceItem,
    FinalAnswerEvent,
    QueryEvent,
    TokenInfo,
    Usage,
)
from .prompts import ANSWER_STOP, answer_prompt, cited_ranks
from .timing import StageTimer


@dataclass(frozen=True)
class QueryInput:
    collection: str
    question: str
    top_k: Optional[int] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None


class QueryPipeline:
    def __init__(self, settings: Settings, models: TritonModels, knowledge: KnowledgeBase):
        self.settings = settings
        self.models = models
        self.knowledge = knowledge
        self._llm_context: Optional[int] = None

    def validate(self, query: QueryInput) -> None:
        """Reject bad requests before any model work (the collection must exist, limits hold)."""
        limits = self.settings
        question = query.question.strip()
        if not question:
            raise InvalidRequestError("question is empty")
        if len(query.question) > limits.server.max_question_chars:
            raise InvalidRequestError(
                f"question has {len(query.question)} characters; the limit is {limits.server.max_question_chars} (server.max_question_chars)"
            )
        if query.top_k is not None and not 1 <= query.top_k <= limits.retrieval.max_top_k:
            raise InvalidRequestError(f"top_k must be in 1..{limits.retrieval.max_top_k} (retrieval.max_top_k), got {query.top_k}")
        if query.max_tokens is not None and not 0 <= query.max_tokens <= limits.generation.max_tokens_limit:
            raise InvalidRequestError(
                f"max_tokens must be in 0..{limits.generation.max_tokens_limit} (generation.max_tokens_limit), got {query.max_tokens}"
            )
        if query.temperature is not None and query.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {query.temperature}")
        if query.top_p is not None and not 0 < query.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {query.top_p}")
        self.knowledge.collection(query.collection)  # NotFoundError for an unknown collection

    async def run(self, query: QueryInput, deadline: float, request_id: str = "") -> AsyncIterator[QueryEvent]:
        """Stream the events of one query; `deadline` is on the monotonic clock."""
        self.validate(query)
        timer = StageTimer()
        generation = self.settings.generation
        snapshot = self.knowledge.collection(query.collection).snapshot
        model_calls = 0
        with timer.stage("embed_query"):
            vector = (await self.models.embed([query.question], _remaining(deadline)))[0]
            model_calls += 1
        with timer.stage("dense_search"):
            hits = snapshot.search_evidence(vector, query.top_k or self.settings.retrieval.top_k)
        evidence = [EvidenceItem(rank, score, passage) for rank, (passage, score) in enumerate(hits, 1)]
        max_tokens = generation.max_tokens if query.max_tokens is None else query.max_tokens
        prompt, evidence = answer_prompt(query.question, evidence, await self._context_tokens() - max_tokens)
        yield EvidenceEvent(tuple(evidence))

        options = GenerationOptions(
            max_tokens=max_tokens,
            temperature=generation.temperature if query.temperature is None else query.temperature,
            top_p=generation.top_p if query.top_p is None else query.top_p,
            stop=ANSWER_STOP,
            seed=query.seed,
        )
        parts: list[str] = []
        last = None
        generation_started = time.monotonic()
        model_calls += 1
        async with self.models.generate(prompt, options, timeout_s=_remaining(deadline), request_id=request_id) as chunks:
            async for chunk in chunks:
                if last is None:
                    timer.record("llm_ttft", time.monotonic() - generation_started)
                    timer.stages["rag_ttft"] = timer.since_start_ms()
                last = chunk
                parts.append(chunk.text)
                tokens = tuple(TokenInfo(*t) for t in zip(chunk.token_ids, chunk.log_probs, chunk.normalized_entropy))
                if chunk.text or tokens:
                    yield AnswerDeltaEvent(chunk.text, tokens)
        timer.record("llm_generation", time.monotonic() - generation_started)

        answer = "".join(parts).strip()
        by_rank = {item.rank: item for item in evidence}
        citations = tuple(
            Citation(rank, by_rank[rank].record.evidence_id, by_rank[rank].record.document_name, by_rank[rank].record.page)
            for rank in cited_ranks(answer, set(by_rank))
        )
        yield FinalAnswerEvent(
            text=answer,
            citations=citations,
            finish_reason=last.finish_reason if last else "length",
            answer_source="llm",
            timings_ms=timer.report(),
            usage=Usage(
                model_calls=model_calls,
                prompt_tokens=last.prompt_tokens if last else 0,
                completion_tokens=last.completion_tokens if last else 0,
            ),
        )

    async def _context_tokens(self) -> int:
        if self._llm_context is None:
            config = await self.models.client.model_config(contracts.LLM.name)
            parameter = config.parameters.get(contracts.CONTEXT_PARAMETER)
            if parameter is None:
                raise TritonUnavailableError(
                    f"model {contracts.LLM.name} does not declare its context length (config parameter "
                    f"{contracts.CONTEXT_PARAMETER!r}): rebuild the model repository"
                )
            self._llm_context = int(parameter.string_value)
        return self._llm_context


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceededError("the request's deadline passed before the answer was complete")
    return left
