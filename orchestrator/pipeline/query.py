"""The query pipeline: route -> hybrid retrieval (+ page images) -> rerank -> adjacent context -> perception ->
answer (extractive, LLM with the uncertainty loop, or the VLM end to end) -> final answer with citations.

Every model call goes through Triton and is recorded in the query's ledger (its cost); every stage reports its
wall time. The page-image path runs concurrently with text retrieval and reranking. Answers degrade to the
extractive answer, flagged, when the LLM is down or the deadline would pass; a question the evidence cannot
answer gets a refusal instead of a guess.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Awaitable, Optional, Sequence, TypeVar

from ..config import Settings
from ..errors import DeadlineExceededError, InvalidRequestError, ModelExecutionError, TritonUnavailableError
from ..knowledge.chunking import ChunkTokenizer, Span
from ..knowledge.segments import EvidenceRecord
from ..knowledge.store import KnowledgeBase, Snapshot
from ..triton import contracts
from ..triton.models import GenerationOptions, TritonModels
from .accounting import QueryLedger, StageModels
from .context import adjacent_blocks, context_texts
from .events import (
    AnswerDeltaEvent,
    Citation,
    EvidenceEvent,
    EvidenceItem,
    FinalAnswerEvent,
    QueryEvent,
    RouteEvent,
    Signals,
    TokenInfo,
    UncertaintyReport,
    Usage,
)
from .extractive import extractive_answer
from .fusion import ScoredCandidate, blend_rerank
from .pages import PageHit, filter_pages, search_pages
from .perception import load_image, perceive, visual_items
from .plan import QueryOptions, QueryPlan, make_plan, router_mode, validate_options
from .prompts import ANSWER_STOP, answer_prompt, cited_ranks
from .retrieval import retrieve
from .router import decide, query_features
from .timing import StageTimer
from .uncertainty import deliberate

T = TypeVar("T")
REFUSAL = "The documents in this collection do not contain enough evidence to answer this question."
NO_SENTENCE = "No sentence of the retrieved evidence answers this question closely enough."


@dataclass(frozen=True)
class QueryInput:
    collection: str
    question: str
    options: QueryOptions = QueryOptions()


@dataclass
class _Answer:
    """The answer as it is produced, whichever answerer produces it."""

    text: str = ""
    source: str = ""
    finish_reason: str = ""
    ranks: tuple[int, ...] = ()
    degradations: list[str] = field(default_factory=list)  # stages skipped or replaced, and why
    uncertainty: Optional[UncertaintyReport] = None
    parts: list[str] = field(default_factory=list)


class QueryPipeline:
    def __init__(self, settings: Settings, models: TritonModels, knowledge: KnowledgeBase, tokenizer: ChunkTokenizer):
        self.settings = settings
        self.models = models
        self.knowledge = knowledge
        self.tokenizer = tokenizer
        self._context: dict[str, int] = {}

    def validate(self, query: QueryInput) -> None:
        """Reject bad requests before any model work (the collection must exist, limits hold)."""
        question = query.question.strip()
        if not question:
            raise InvalidRequestError("question is empty")
        limit = self.settings.server.max_question_chars
        if len(query.question) > limit:
            raise InvalidRequestError(f"question has {len(query.question)} characters; the limit is {limit} (server.max_question_chars)")
        validate_options(query.options, self.settings)
        self.knowledge.collection(query.collection)  # NotFoundError for an unknown collection

    def _count_tokens(self, texts: Sequence[str]) -> int:
        return sum(len(encoding.ids) for encoding in self.tokenizer.encode(texts)) if texts else 0

    async def run(self, query: QueryInput, deadline: float, request_id: str = "") -> AsyncIterator[QueryEvent]:
        """Stream the events of one query; `deadline` is on the monotonic clock."""
        self.validate(query)
        timer, ledger = StageTimer(), QueryLedger()
        settings, options = self.settings, query.options
        question = " ".join(query.question.split())
        snapshot = self.knowledge.collection(query.collection).snapshot

        def models(stage: str) -> StageModels:
            return StageModels(self.models, ledger, stage, self._count_tokens)

        answer = _Answer()
        with timer.stage("route"):
            features = query_features(question, snapshot.entity_key_set)
            mode = router_mode(options, settings)
            probabilities = None
            if mode == "model":
                probabilities = await self._optional("route", answer, models("route").route([question], _remaining(deadline)))
                if probabilities is None:
                    mode = "features"
                else:
                    probabilities = probabilities[0]
            decision = decide(
                question, features, mode,
                fixed_route=options.route or settings.router.fixed_route,
                moderate_at=settings.router.moderate_at,
                complex_at=settings.router.complex_at,
                model_probabilities=probabilities,
                max_sub_questions=settings.router.max_sub_questions,
                decompose={name: settings.routes.policy(name).decompose for name in ("simple", "moderate", "complex")},
            )
        plan = make_plan(decision.label, options, settings)
        yield RouteEvent(decision)

        page_search = None
        if plan.page_images and snapshot.pages:
            page_search = asyncio.create_task(self._pages(models, snapshot, question, plan, deadline, timer))
        try:
            questions = [question, *decision.sub_questions]
            retrieval_started = time.monotonic()
            with timer.stage("embed"):
                vectors = await models("embed").embed(questions, _remaining(deadline))
            retrieval = await asyncio.to_thread(
                retrieve, snapshot, questions, vectors, plan, settings.retrieval, features.entities, features.modalities
            )
            timer.merge(retrieval.timings_ms)
            timer.record("retrieval", time.monotonic() - retrieval_started)
            ranked = retrieval.candidates
            if plan.rerank and ranked:
                head = ranked[: max(settings.retrieval.rerank_candidates, plan.evidence_k)]
                with timer.stage("rerank"):
                    passages = [snapshot.evidence[c.row].text for c in head]
                    scores = await self._optional("rerank", answer, models("rerank").rerank(question, passages, _remaining(deadline)))
                if scores is not None:
                    ranked = blend_rerank(head, scores, plan.rerank_weight)
            pages = (await self._optional("page images", answer, page_search) or []) if page_search is not None else []
        finally:
            if page_search is not None and not page_search.done():
                page_search.cancel()

        with timer.stage("context"):
            items = self._evidence(snapshot, ranked[: plan.evidence_k], pages)
        best_similarity = max((c.semantic for c in retrieval.candidates), default=0.0)
        answerable = best_similarity >= settings.retrieval.min_similarity or any(
            (hit.relevance or 0.0) >= settings.pages.min_relevance for hit in pages
        )
        visual = visual_items(items, settings.perception.max_items) if plan.perception != "off" else []
        if answerable and plan.perception == "dpr" and visual:
            # Descriptions may use the time the answer does not need; past that they are skipped, not waited for.
            budget = _left(deadline) - (settings.answer.llm_reserve_s if plan.answerer == "llm" else settings.answer.extractive_reserve_s)
            with timer.stage("perception"):
                described = await self._optional(
                    "perception", answer,
                    perceive(models("perception"), snapshot, question, visual, settings.perception.max_tokens, budget, request_id),
                    budget,
                )
            if described:
                items = [replace(item, perception=described.get(item.rank, "")) for item in items]
        yield EvidenceEvent(tuple(items))

        if not answerable:
            answer.text, answer.source, answer.finish_reason = REFUSAL, "refusal", "refusal"
            yield self._first_delta(timer, answer.text)
        elif plan.perception == "end_to_end" and visual:
            async for event in self._generate(models("vlm_answer"), question, decision.instruction, items, plan, visual, snapshot, deadline, timer, answer, request_id):
                yield event
        elif plan.answerer == "llm":
            async for event in self._llm_answer(models, snapshot, question, decision, items, plan, vectors[0], deadline, timer, answer, request_id):
                yield event
        else:
            async for event in self._extractive(models, snapshot, question, vectors[0], items, deadline, timer, answer):
                yield event

        by_rank = {item.rank: item.record for item in items}
        ranks = answer.ranks or tuple(cited_ranks(answer.text, set(by_rank)))
        citations = tuple(Citation(r, by_rank[r].evidence_id, by_rank[r].document_name, by_rank[r].page) for r in ranks if r in by_rank)
        report = timer.report()
        cost = ledger.report(report["total"])
        answering = [c for c in ledger.calls if c.model in (contracts.LLM.name, contracts.VLM.name) and c.stage not in ("perception",)]
        yield FinalAnswerEvent(
            text=answer.text,
            citations=citations,
            finish_reason=answer.finish_reason,
            answer_source=answer.source,
            timings_ms=report,
            usage=Usage(len(ledger.calls), sum(c.tokens_in for c in answering), sum(c.tokens_out for c in answering)),
            cost=cost,
            degraded=bool(answer.degradations),
            degraded_reason="; ".join(answer.degradations),
            uncertainty=answer.uncertainty,
        )

    # ------------------------------------------------------------------ stages

    async def _pages(self, models, snapshot: Snapshot, question: str, plan: QueryPlan, deadline: float, timer: StageTimer) -> list[PageHit]:
        with timer.stage("page_images"):
            hits = await search_pages(models("page_images"), snapshot, question, plan.page_top_m, _remaining(deadline))
        with timer.stage("vlm_filter"):
            return await filter_pages(
                models("vlm_filter"), snapshot, question, hits, plan.page_top_k, self.settings.pages.min_relevance, _remaining(deadline)
            )

    def _evidence(self, snapshot: Snapshot, selected: Sequence[ScoredCandidate], pages: Sequence[PageHit]) -> list[EvidenceItem]:
        """Ranked evidence: the selected chunks and units (units with their adjacent context), then the pages."""
        records = [snapshot.evidence[c.row] for c in selected]
        covered: dict[str, set[int]] = {}
        for record in records:
            covered.setdefault(record.document_id, set()).update(span.block for span in record.spans)
        items = []
        for rank, (candidate, record) in enumerate(zip(selected, records), 1):
            context: tuple[str, ...] = ()
            if record.kind == "unit" and record.spans:
                blocks = snapshot.segment(record.document_id).blocks
                near = adjacent_blocks(
                    blocks, record.spans[0].block, self.settings.retrieval.context_blocks, frozenset(covered[record.document_id])
                )
                context = context_texts(blocks, near)
            signals = Signals(
                candidate.semantic, candidate.lexical, candidate.structural, candidate.modality, candidate.fused,
                candidate.rerank, final=candidate.final, found_by=candidate.found_by,
            )
            items.append(EvidenceItem(rank, candidate.final, record, signals, context))
        for rank, hit in enumerate(pages, len(items) + 1):
            document = snapshot.segment(hit.page.document_id).document
            record = EvidenceRecord(
                f"{document.document_id}:p{hit.page.page}", document.document_id, document.name, "page", "page", "", "",
                (Span(-1, hit.page.page, (0, 0, 1000, 1000)),), asset=f"{document.document_id}/{hit.page.image}",
            )
            signals = Signals(page_similarity=hit.similarity, page_relevance=hit.relevance, final=hit.relevance or 0.0, found_by=("page",))
            items.append(EvidenceItem(rank, hit.relevance or 0.0, record, signals))
        return items

    def _first_delta(self, timer: StageTimer, text: str) -> AnswerDeltaEvent:
        timer.stages.setdefault("rag_ttft", timer.since_start_ms())
        return AnswerDeltaEvent(text, ())

    async def _extractive(self, models, snapshot, question, vector, items, deadline, timer, answer: _Answer, reason: str = ""):
        with timer.stage("answer"):
            extracted = await extractive_answer(
                models("answer"), question, vector, items, self.settings.answer, max(0.05, _left(deadline)), _titles(snapshot, items)
            )
        answer.text = extracted.text or NO_SENTENCE
        answer.source, answer.finish_reason, answer.ranks = "extractive", "extracted", extracted.ranks
        answer.degradations += [r for r in (reason, extracted.note) if r]
        for sentence, _ in extracted.sentences or ((None, 0.0),):
            yield self._first_delta(timer, f"{sentence.text} [{sentence.rank}] " if sentence else answer.text)

    async def _llm_answer(self, models, snapshot, question, decision, items, plan: QueryPlan, vector, deadline, timer, answer: _Answer, request_id):
        reserve = self.settings.answer
        if _left(deadline) < reserve.llm_reserve_s:
            reason = f"{_left(deadline):.2f} s left before the deadline, less than answer.llm_reserve_s ({reserve.llm_reserve_s} s)"
            async for event in self._extractive(models, snapshot, question, vector, items, deadline, timer, answer, reason):
                yield event
            return
        try:
            evidence, notes = items, ""
            if plan.uncertainty:
                with timer.stage("uncertainty"):
                    deliberation = await deliberate(
                        models("uncertainty"), question, items, self.settings.uncertainty, plan.evidence_k,
                        self._generation(plan), await self._budget(contracts.LLM.name, 0), decision.instruction,
                        self._answer_time(deadline), request_id,
                    )
                evidence, notes, answer.uncertainty = deliberation.evidence, deliberation.notes, deliberation.report
            async for event in self._generate(models("llm"), question, decision.instruction, evidence, plan, [], None, deadline, timer, answer, request_id, notes, decision.sub_questions):
                yield event
        except (TritonUnavailableError, ModelExecutionError, DeadlineExceededError) as error:
            produced = f" after {len(answer.parts)} streamed parts" if answer.parts else ""
            async for event in self._extractive(models, snapshot, question, vector, items, deadline, timer, answer, f"the LLM failed{produced}: {error}"):
                yield event

    async def _generate(
        self, models: StageModels, question, instruction, evidence, plan: QueryPlan, visual, snapshot, deadline, timer,
        answer: _Answer, request_id, notes: str = "", sub_questions: Sequence[str] = (),
    ):
        """Stream the LLM's (or, with images, the VLM's) answer; the deadline is checked at every chunk."""
        model = contracts.VLM.name if visual else contracts.LLM.name
        budget = await self._budget(model, plan.max_tokens)
        prompt, used = answer_prompt(question, evidence, budget, instruction, sub_questions, notes)
        images: list[bytes] = []
        if visual:
            loaded = await asyncio.to_thread(lambda: [load_image(snapshot, item) for item in visual])
            images = [image for image in loaded if image]
        started = time.monotonic()
        last = None
        async with models.generate(prompt, self._generation(plan), images, self._answer_time(deadline), request_id) as chunks:
            iterator = chunks.__aiter__()
            while True:
                try:
                    chunk = await asyncio.wait_for(iterator.__anext__(), self._answer_time(deadline))
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    raise DeadlineExceededError("the deadline would pass before the answer is complete") from None
                if last is None:
                    timer.record("llm_ttft", time.monotonic() - started)
                last = chunk
                answer.parts.append(chunk.text)
                tokens = tuple(TokenInfo(*t) for t in zip(chunk.token_ids, chunk.log_probs, chunk.normalized_entropy))
                if chunk.text or tokens:
                    timer.stages.setdefault("rag_ttft", timer.since_start_ms())
                    yield AnswerDeltaEvent(chunk.text, tokens)
        timer.record("llm_generation", time.monotonic() - started)
        answer.text = "".join(answer.parts).strip()
        answer.source = "vlm" if visual else "llm"
        answer.finish_reason = last.finish_reason if last else "length"

    # ------------------------------------------------------------------ helpers

    async def _optional(self, stage: str, answer: _Answer, work: Awaitable[T], budget_s: Optional[float] = None) -> Optional[T]:
        """An optional stage's result, or None when its model is down, fails, or it would run past `budget_s`:
        the query goes on without it and the final answer says what was skipped and why."""
        try:
            if budget_s is not None and budget_s <= 0:
                raise DeadlineExceededError(f"{budget_s + 0.0:.2f} s left for it")
            return await (asyncio.wait_for(work, budget_s) if budget_s is not None else work)
        except asyncio.TimeoutError:
            answer.degradations.append(f"{stage} skipped: it would have run past the deadline")
        except (TritonUnavailableError, ModelExecutionError, DeadlineExceededError) as error:
            answer.degradations.append(f"{stage} skipped: {error}")
        finally:
            if inspect.iscoroutine(work) and inspect.getcoroutinestate(work) == inspect.CORO_CREATED:
                work.close()  # never started (no time left): close it so it is not reported as never awaited
        return None

    def _generation(self, plan: QueryPlan) -> GenerationOptions:
        return GenerationOptions(plan.max_tokens, plan.temperature, plan.top_p, ANSWER_STOP, plan.seed)

    def _answer_time(self, deadline: float) -> float:
        """Time the answering model may take: what is left, less the reserve for the extractive fallback."""
        left = _left(deadline) - self.settings.answer.extractive_reserve_s
        if left <= 0:
            raise DeadlineExceededError("no time left for the answer before the deadline")
        return left

    async def _budget(self, model: str, max_tokens: int) -> int:
        """Prompt tokens the model can take: its declared context less the answer's tokens."""
        if model not in self._context:
            config = await self.models.client.model_config(model)
            parameter = config.parameters.get(contracts.CONTEXT_PARAMETER)
            if parameter is None:
                raise TritonUnavailableError(
                    f"model {model} does not declare its context length (config parameter "
                    f"{contracts.CONTEXT_PARAMETER!r}): rebuild the model repository"
                )
            self._context[model] = int(parameter.string_value)
        return self._context[model] - max_tokens


def _titles(snapshot: Snapshot, items: Sequence[EvidenceItem]) -> set[str]:
    """The headings inside the evidence (title blocks it spans): never an answer sentence."""
    titles = set()
    for item in items:
        if item.record.kind == "page":
            continue
        blocks = snapshot.segment(item.record.document_id).blocks
        titles.update(blocks[s.block].content for s in item.record.spans if 0 <= s.block < len(blocks) and blocks[s.block].type == "title")
    return titles


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _remaining(deadline: float) -> float:
    left = _left(deadline)
    if left <= 0:
        raise DeadlineExceededError("the request's deadline passed before the answer was complete")
    return left
