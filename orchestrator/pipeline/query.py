"""The query pipeline: route -> hybrid retrieval (+ page images) -> rerank -> adjacent context -> perception ->
answer (extractive, LLM with the uncertainty loop, or the VLM end to end) -> final answer with citations.

Every model call goes through Triton and is recorded in the query's ledger (its cost); every stage reports its
wall time. The page-image path runs concurrently with text retrieval and reranking. Optional stages are
skipped, and the answer degrades to the extractive one, flagged with the cause, when a model is down or the
deadline would pass; a question the evidence cannot answer gets a refusal instead of a guess. When the question
cannot be embedded (the text embedder down, Triton restarting), retrieval goes on in lexical mode (BM25, the
entities the question names) and the answer says so, rather than failing: a Triton restart on a GPU node takes
minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Awaitable, Optional, Sequence, TypeVar

import numpy as np
from opentelemetry import trace
from opentelemetry.context import Context

from ..config import ROUTE_NAMES, Settings
from ..errors import DeadlineExceededError, InvalidRequestError, ModelExecutionError, TritonUnavailableError
from ..knowledge.graph.pagerank import compiled_kernels, limit_gpu_pool
from ..knowledge.storage.segments import EvidenceRecord
from ..knowledge.storage.registry import KnowledgeBase
from ..knowledge.storage.snapshot import Snapshot
from ..prompts import CITATION_MARK, Conversation, answer_prompt, cited_ranks, reader_prompt, states_no_answer
from ..models.tokens import PlainTokenizer
from ..models import contracts
from ..models.chat_template import chat_template_of
from ..models.protocol import GenerationOptions, Models
from .accounting import QueryLedger, StageModels, own_time_by_stage
from .answer_types import expected_type
from ..models.answerability import load_models
from .answerability import answerability_features
from .events import (
    AnswerabilityReport,
    AnswerDeltaEvent,
    Citation,
    EvidenceEvent,
    EvidenceItem,
    FinalAnswerEvent,
    QueryEvent,
    RouteEvent,
    ShortAnswer,
    TokenInfo,
    UncertaintyReport,
    Usage,
)
from .evidence import answering_order, evidence_items
from .extractive import ExtractiveAnswer, extractive_answer, sentence_citations
from .fusion import ScoredCandidate, blend_rerank
from .hybrid import candidate_settings, grounded, reader_lines
from .pages import PageHit, filter_pages, search_pages
from .perception import load_image, perceive, visual_items
from .plan import QueryOptions, QueryPlan, lexical_plan, make_plan, router_mode
from .retrieval import start_retrieval
from .router import RouteDecision, decide, query_features
from .timing import StageTimer
from .uncertainty import deliberate

T = TypeVar("T")
log = logging.getLogger(__name__)
REFUSAL = "The documents in this collection do not contain enough evidence to answer this question."
NO_SENTENCE = "No sentence of the retrieved evidence answers this question closely enough."
# Model failures an optional stage survives (it is skipped) and the LLM answer survives (the extractive one stands in).
SURVIVABLE = (TritonUnavailableError, ModelExecutionError, DeadlineExceededError)


@dataclass(frozen=True)
class QueryInput:
    collection: str
    question: str
    options: QueryOptions = QueryOptions()
    conversation: Conversation = Conversation()  # a chat client's system prompt and earlier turns (the LLM reads them)


@dataclass(frozen=True)
class CheckedQuery:
    """A query whose question, options and collection were checked (QueryPipeline.validate): run() takes it as
    it is, so a request is checked once, before it waits for a slot."""

    query: QueryInput


@dataclass
class _Query:
    """One query in flight: what it asks, what the stages found so far, its clock, ledger and answer."""

    question: str
    snapshot: Snapshot
    deadline: float  # on the monotonic clock
    request_id: str
    timer: StageTimer = field(default_factory=StageTimer)
    ledger: QueryLedger = field(default_factory=QueryLedger)
    decision: Optional[RouteDecision] = None
    plan: Optional[QueryPlan] = None
    vector: Optional[np.ndarray] = None  # the question's embedding (None in lexical mode)
    items: list[EvidenceItem] = field(default_factory=list)
    rows: dict[int, int] = field(default_factory=dict)  # an item's evidence row in the snapshot, by rank
    # the answer, as whichever answerer produces it
    text: str = ""
    source: str = ""
    finish_reason: str = ""
    citations: tuple[Citation, ...] = ()  # set by an answerer that knows what it quotes (the extractive one)
    parts: list[str] = field(default_factory=list)  # streamed text
    degradations: list[str] = field(default_factory=list)  # stages skipped or replaced, and why
    uncertainty: Optional[UncertaintyReport] = None
    short_answer: Optional[ShortAnswer] = None  # the extractive answer's value of the asked-for type
    answerability: Optional[AnswerabilityReport] = None
    conversation: Conversation = Conversation()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def remaining(self) -> float:
        """Time left for a model call; past the deadline the query ends with DEADLINE_EXCEEDED."""
        left = self.left()
        if left <= 0:
            raise DeadlineExceededError("the request's deadline passed before the answer was complete")
        return left

    def first_text(self, text: str, tokens: tuple[TokenInfo, ...] = ()) -> AnswerDeltaEvent:
        self.timer.since_start("rag_ttft")
        return AnswerDeltaEvent(text, tokens)


class QueryPipeline:
    def __init__(
        self, settings: Settings, models: Models, knowledge: KnowledgeBase, tokenizer: PlainTokenizer,
        tracer: trace.Tracer = trace.NoOpTracer(),
    ):
        self.settings = settings
        self.tracer = tracer  # one span per stage, under the request's span (trace_context)
        self.models = models
        self.knowledge = knowledge
        self.tokenizer = tokenizer  # the embedder's: encoder inputs are counted in its tokens
        # prompts are fitted to the answering model's context in its own tokens
        self.prompt_tokenizers = {
            model: PlainTokenizer(settings.generator_tokenizer_file(model), f"generation.{model}_tokenizer")
            for model in (contracts.LLM.name, contracts.VLM.name)
        }
        # retrieval runs in these threads, and so does the warm-up's (exercise): a thread's first retrieval
        # faults in fresh memory for its allocator (about 400 page faults at 100,000 chunks, 2-4 ms on a VM),
        # which asyncio's default executor left to the first query after start
        self.retrieval_pool = ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="retrieval")
        # the graph's side of retrieval runs here beside the passage searches (retrieval.start_retrieval)
        self.search_pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="graph-search")
        knowledge.prepare = self.exercise  # each new snapshot is retrieved from once before queries see it
        if settings.retrieval.answerability == "model":  # a missing or malformed file stops the start, not a query
            load_models(settings.retrieval.answerability_file)

    def close(self) -> None:
        self.retrieval_pool.shutdown(wait=False, cancel_futures=True)
        self.search_pool.shutdown(wait=False, cancel_futures=True)

    def warm_up(self) -> None:
        """Load the compiled kernels, open every collection, build its snapshot and retrieve once from it on every
        route (no model is called), so that the first user's query finds the code paths and the indexes' memory
        warm: a server runs it in the background at start (on 100,000 chunks the first query was 1.5x a steady
        one)."""
        compiled_kernels()
        limit_gpu_pool(self.settings.retrieval.pagerank_gpu_memory_mb)
        self.knowledge.preload()
        for name in self.knowledge.names():
            try:
                snapshot = self.knowledge.collection(name).snapshot
                snapshot.warm()
                self.exercise(snapshot)
            except Exception:  # the collection's own queries report what is wrong with it
                log.exception("warming up collection %s failed", name)

    def exercise(self, snapshot: Snapshot) -> None:
        """Retrieve from the snapshot once on every route, with its first passage for a question (no model is
        called), as queries do (start_retrieval, its parts in the pools' threads): the first query on it then
        finds the code paths, its indexes' memory and the threads it runs in warm."""
        if not snapshot.evidence:
            return
        vectors = snapshot.evidence_vectors([0])
        for route in ROUTE_NAMES:
            plan = make_plan(route, QueryOptions(), self.settings)
            embedded: Future = Future()
            started = start_retrieval(snapshot, [snapshot.evidence[0].text[:200]], embedded, plan, self.settings.retrieval,
                                      (), {}, self.retrieval_pool, self.search_pool)
            embedded.set_result(vectors)  # while the BM25 side runs, as a query's vectors come
            started.result()

    def validate(self, query: QueryInput) -> CheckedQuery:
        """Reject bad requests before any model work (the collection must exist, limits hold)."""
        question = query.question.strip()
        if not question:
            raise InvalidRequestError("question is empty")
        limit = self.settings.server.max_question_chars
        if len(query.question) > limit:
            raise InvalidRequestError(f"question has {len(query.question)} characters; the limit is {limit} (server.max_question_chars)")
        query.options.check(self.settings)
        self.knowledge.collection(query.collection)  # NotFoundError for an unknown collection
        return CheckedQuery(query)

    async def run(
        self, query: QueryInput | CheckedQuery, deadline: float, request_id: str = "", answer: bool = True,
        trace_context: Optional[Context] = None,
    ) -> AsyncIterator[QueryEvent]:
        """Stream the events of one query (checked here unless validate() did); `deadline` is on the monotonic
        clock. Without `answer` the query stops after the evidence (Retrieve) and its final event carries only
        timings and cost. The collection is looked up again: it may have been deleted while the query waited."""
        query = (query if isinstance(query, CheckedQuery) else self.validate(query)).query
        snapshot = self.knowledge.collection(query.collection).snapshot
        q = _Query(" ".join(query.question.split()), snapshot, deadline, request_id, StageTimer(self.tracer, trace_context))
        q.conversation = query.conversation
        with q.timer.stage("route"):
            await self._route(q, query.options)
        yield RouteEvent(q.decision)

        ranked, pages, best_similarity = await self._retrieve(q)
        with q.timer.stage("context"):
            selected = ranked[: q.plan.evidence_k]
            q.items = evidence_items(snapshot, selected, pages, self.settings.retrieval.context_blocks)
            q.rows = {rank: candidate.row for rank, candidate in enumerate(selected, 1)}
        with q.timer.stage("answerability"):
            q.answerability = self._answerability(q, ranked, best_similarity)
        answerable = q.answerability.answerable or any(
            (hit.relevance or 0.0) >= self.settings.pages.min_relevance for hit in pages
        )
        visual = visual_items(q.items, q.plan.perception_items) if q.plan.perception != "off" else []
        if answerable and q.plan.perception == "dpr" and visual:
            await self._perceive(q, visual)
        yield EvidenceEvent(tuple(q.items))

        if not answer:
            q.source, q.finish_reason = "none", "retrieval"
            yield self._final(q)
            return
        if not answerable:
            q.text, q.source, q.finish_reason = REFUSAL, "refusal", "refusal"
            answer = self._refuse(q)
        elif q.plan.perception == "end_to_end" and visual:
            answer = self._generate(q, self._models(q, "vlm_answer"), q.items, visual=visual)
        elif q.plan.answerer == "llm":
            answer = self._llm_answer(q)
        elif q.plan.answerer == "hybrid":
            answer = self._hybrid(q)
        else:
            answer = self._extractive(q)
        # Every generator that iterates another closes it (aclosing), here and up to the transport: closing the
        # outer one does not close the one it was iterating, which then waits for the garbage collector, and with it
        # the model stream it holds open and unread: the LLM's sends block and it stops serving everyone (CI, when
        # a client left while the query waited to hand over an event). Closed, the stream is cancelled at once.
        async with contextlib.aclosing(answer):
            async for event in answer:
                yield event
        yield self._final(q)

    # ------------------------------------------------------------------ stages

    def _models(self, q: _Query, stage: str) -> StageModels:
        return StageModels(self.models, q.ledger, stage, self._count_tokens)

    async def _route(self, q: _Query, options: QueryOptions) -> None:
        settings = self.settings
        features = query_features(q.question, q.snapshot.entity_key_set)
        mode = router_mode(options, settings)
        probabilities = None
        if mode == "model":
            routed = await self._optional(q, "route", self._models(q, "route").route([q.question], q.remaining()))
            mode, probabilities = ("features", None) if routed is None else ("model", routed[0])
        q.decision = decide(
            q.question, features, mode,
            fixed_route=options.route or settings.router.fixed_route,
            moderate_at=settings.router.moderate_at,
            complex_at=settings.router.complex_at,
            model_probabilities=probabilities,
            max_sub_questions=settings.router.max_sub_questions,
            decompose={route: settings.routes.policy(route).decompose for route in ROUTE_NAMES},
        )
        q.plan = make_plan(q.decision.label, options, settings)

    async def _retrieve(self, q: _Query) -> tuple[list[ScoredCandidate], list[PageHit], float]:
        """Ranked candidates, kept pages and the best cosine of any candidate; pages are searched meanwhile."""
        plan, settings, features = q.plan, self.settings, q.decision.features
        page_search = asyncio.create_task(self._pages(q)) if plan.page_images and q.snapshot.pages else None
        try:
            questions = [q.question, *q.decision.sub_questions]
            started = time.monotonic()
            # retrieval starts now: its BM25 searches need only the text, so they run while the embedder works
            embedded: Future = Future()
            retrieving = asyncio.wrap_future(start_retrieval(
                q.snapshot, questions, embedded, plan, settings.retrieval, features.entities, features.modalities,
                self.retrieval_pool, self.search_pool,
                max(plan.evidence_k, settings.retrieval.rerank_candidates),  # what is read of the ranking
            ))
            try:
                vectors = None if plan.lexical else await self._embed(q, questions)
            except BaseException:
                embedded.cancel()
                retrieving.cancel()  # what it did without the vectors is dropped, not reported
                raise
            embedded.set_result(vectors)  # None: the retrieval goes on in lexical mode
            q.vector = vectors[0] if vectors is not None else None
            plan = q.plan
            retrieval = await retrieving
            q.timer.merge(retrieval.timings_ms, retrieval.starts)
            q.timer.record("retrieval", time.monotonic() - started)
            q.degradations += retrieval.skipped
            ranked = retrieval.candidates
            if plan.rerank and ranked:
                head = ranked[: max(settings.retrieval.rerank_candidates, plan.evidence_k)]
                with q.timer.stage("rerank"):
                    passages = [q.snapshot.evidence[c.row].text for c in head]
                    scores = await self._optional(q, "rerank", self._models(q, "rerank").rerank(q.question, passages, q.remaining()))
                if scores is not None:
                    ranked = blend_rerank(head, scores, plan.rerank_weight)
            pages = (await self._optional(q, "page images", page_search) or []) if page_search is not None else []
        finally:
            if page_search is not None and not page_search.done():
                page_search.cancel()
        return ranked, pages, retrieval.best_semantic

    def _answerability(self, q: _Query, ranked: Sequence[ScoredCandidate], best_similarity: float) -> AnswerabilityReport:
        """Whether the text evidence can answer: the answerability model's probability against min_answerability
        (its lexical model in lexical mode), or under the similarity rule some candidate close enough to the
        question (its cosine; in lexical mode, the share of the question's BM25 weight it matches)."""
        retrieval = self.settings.retrieval
        lexical = q.snapshot.lexical
        features = answerability_features(q.question, ranked, best_similarity, q.snapshot, q.decision.label,
                                          lexical.idf, lexical.document_frequency)
        mode = "lexical" if q.plan.lexical else "full"
        if retrieval.answerability == "model":
            shipped = load_models(retrieval.answerability_file)
            model = shipped.model(mode)
            probability = model.probability(features)
            threshold = model.threshold if retrieval.min_answerability is None else retrieval.min_answerability
            return AnswerabilityReport(probability >= threshold, probability, threshold, f"{shipped.version}/{mode}", features)
        if q.plan.lexical:
            floor, best = retrieval.min_lexical_match, features["best_lexical"]
        else:
            floor, best = retrieval.min_similarity, best_similarity
        return AnswerabilityReport(best >= floor, -1.0, floor, "similarity", features)

    async def _embed(self, q: _Query, questions: Sequence[str]) -> Optional[np.ndarray]:
        """The question's and sub-questions' vectors, or None for lexical mode: the embedder
        was unavailable, failed, or did not answer in the time the rest of the query can spare (the plan becomes
        lexical and the answer says why). Any other error, or no time left at all, fails the query."""
        reserve = self.settings.answer.extractive_reserve_s
        wait = q.left() - reserve if q.left() > 2 * reserve else q.remaining()
        try:
            with q.timer.stage("embed"):
                vectors = await self._models(q, "embed").embed(questions, wait)
        except SURVIVABLE as error:
            if not self.settings.retrieval.lexical_fallback or q.left() <= 0:
                raise
            cause = (f"it did not answer within {wait:.2f} s" if isinstance(error, DeadlineExceededError)
                     else str(error))
            q.degradations.append(f"lexical mode (BM25 and named entities): the question could not be embedded: {cause}")
            q.plan = lexical_plan(q.plan)
            return None
        return vectors

    async def _pages(self, q: _Query) -> list[PageHit]:
        with q.timer.stage("page_images"):
            hits = await search_pages(self._models(q, "page_images"), q.snapshot, q.question, q.plan.page_top_m, q.remaining())
        with q.timer.stage("vlm_filter"):
            return await filter_pages(
                self._models(q, "vlm_filter"), q.snapshot, q.question, hits, q.plan.page_top_k,
                self.settings.pages.min_relevance, q.remaining(),
            )

    async def _perceive(self, q: _Query, visual: Sequence[EvidenceItem]) -> None:
        """DPR: descriptions may use the time the answer does not need; past that they are skipped, not waited for."""
        answer = self.settings.answer
        budget = q.left() - (answer.llm_reserve_s if q.plan.answerer == "llm" else answer.extractive_reserve_s)
        work = perceive(
            self._models(q, "perception"), q.snapshot, q.question, visual, self.settings.perception.max_tokens, budget, q.request_id
        )
        with q.timer.stage("perception"):
            described = await self._optional(q, "perception", work, budget)
        if described:
            q.items = [replace(item, perception=described.get(item.rank, "")) for item in q.items]

    # ------------------------------------------------------------------ answers

    async def _refuse(self, q: _Query) -> AsyncIterator[AnswerDeltaEvent]:
        yield q.first_text(q.text)

    async def _extracted(self, q: _Query, settings, short: bool) -> ExtractiveAnswer:
        """The extractive answerer's choice of evidence sentences under `settings` (AnswerSettings)."""
        with q.timer.stage("answer"):
            stored = {rank: q.snapshot.evidence.answer_sentences(row) for rank, row in q.rows.items()}
            return await extractive_answer(
                self._models(q, "answer"), q.question, q.vector, q.items, settings, max(0.05, q.left()),
                {title for cut in stored.values() for title in cut.titles}, {rank: cut.sentences for rank, cut in stored.items()},
                q.snapshot.lexical.idf, short,
            )

    async def _extractive(self, q: _Query, standing_in_because: str = "") -> AsyncIterator[AnswerDeltaEvent]:
        extracted = await self._extracted(q, self.settings.answer, self.settings.answer.short_answer)
        q.short_answer = extracted.short
        q.text, q.source, q.finish_reason = extracted.text or NO_SENTENCE, "extractive", "extracted"
        q.citations = sentence_citations(extracted.sentences, {item.rank: item.record for item in q.items})
        # in lexical mode the sentences are chosen by shared words by design (the degradation, if any, is said)
        note = "" if q.plan.lexical else extracted.note
        q.degradations += [reason for reason in (standing_in_because, note) if reason]
        # one event: the sentences are all there at once, and each event is a message the client waits for
        yield q.first_text("".join(f"{sentence.text} [{sentence.rank}] " for sentence, _ in extracted.sentences) or q.text)

    async def _llm_answer(self, q: _Query) -> AsyncIterator[AnswerDeltaEvent]:
        reserve = self.settings.answer.llm_reserve_s
        if q.left() < reserve:
            async for event in self._extractive(q, f"{q.left():.2f} s left before the deadline, less than answer.llm_reserve_s ({reserve} s)"):
                yield event
            return
        try:
            evidence, notes = q.items, ""
            if q.plan.uncertainty:
                with q.timer.stage("uncertainty"):
                    deliberation = await deliberate(
                        self._models(q, "uncertainty"), q.question, q.items, self.settings.uncertainty, q.plan.evidence_k,
                        self._generation(q.plan), await self._budget(contracts.LLM.name, 0),
                        self.prompt_tokenizers[contracts.LLM.name].count, q.decision.instruction, self._answer_time(q),
                        q.request_id,
                    )
                evidence, notes, q.uncertainty = deliberation.evidence, deliberation.notes, deliberation.report
            async with contextlib.aclosing(self._generate(q, self._models(q, "llm"), evidence, notes=notes)) as events:
                async for event in events:
                    yield event
        except SURVIVABLE as error:
            produced = f" after {len(q.parts)} streamed parts" if q.parts else ""
            async for event in self._extractive(q, f"the LLM failed{produced}: {error}"):
                yield event

    async def _hybrid(self, q: _Query) -> AsyncIterator[AnswerDeltaEvent]:
        """The LLM answers from the sentences the extractive answerer chose (pipeline/hybrid.py); its citations quote
        the sentences it rests on. The extractive answer stands in when there is no time, no sentence, or no LLM."""
        reserve, settings = self.settings.answer.llm_reserve_s, self.settings.answer
        if q.left() < reserve:
            async for event in self._extractive(q, f"{q.left():.2f} s left before the deadline, less than answer.llm_reserve_s ({reserve} s)"):
                yield event
            return
        extracted = await self._extracted(q, candidate_settings(settings), False)
        if not extracted.sentences:
            async for event in self._extractive(q):
                yield event
            return
        try:
            chat = chat_template_of(await self.models.generator_facts(contracts.LLM.name), contracts.LLM.name)
            prompt = reader_prompt(chat, q.question, reader_lines(extracted.sentences))
            generation = replace(self._generation(q.plan), max_tokens=min(q.plan.max_tokens, settings.hybrid_max_tokens))
            generated = self._generate(q, self._models(q, "llm"), q.items, prompt=prompt, generation=generation)
            async with contextlib.aclosing(generated):
                async for event in generated:
                    yield event
        except SURVIVABLE as error:
            produced = f" after {len(q.parts)} streamed parts" if q.parts else ""
            q.parts.clear()
            async for event in self._extractive(q, f"the LLM failed{produced}: {error}"):
                yield event
            return
        q.source = "hybrid"
        q.citations = sentence_citations(grounded(q.text, extracted.sentences), {item.rank: item.record for item in q.items})

    async def _generate(
        self, q: _Query, models: StageModels, evidence: Sequence[EvidenceItem], notes: str = "",
        visual: Sequence[EvidenceItem] = (), prompt: str = "", generation: Optional[GenerationOptions] = None,
    ) -> AsyncIterator[AnswerDeltaEvent]:
        """Stream the LLM's answer, or with images the VLM's; the deadline is checked at every chunk. `prompt`:
        written by the caller (the hybrid answerer's), else the answer prompt over `evidence`."""
        model = contracts.VLM.name if visual else contracts.LLM.name
        images: list[bytes] = []
        if visual:
            loaded = await asyncio.to_thread(lambda: [load_image(q.snapshot, item) for item in visual])
            images = [image for image in loaded if image]
        if not prompt:
            budget = await self._budget(model, q.plan.max_tokens, len(images))
            chat = chat_template_of(await self.models.generator_facts(model), model)
            count = self.prompt_tokenizers[model].count
            prompt, _ = answer_prompt(
                chat, q.question, answering_order(evidence), budget, count, q.decision.instruction, q.decision.sub_questions,
                notes, q.conversation,
            )
        generation = generation or self._generation(q.plan)
        started, last = time.monotonic(), None
        async with models.generate(prompt, generation, images, self._answer_time(q), q.request_id) as chunks:
            iterator = chunks.__aiter__()
            while True:
                try:
                    # not asyncio.wait_for: in Python 3.11 a cancellation that meets a chunk arriving is lost there,
                    # and the generation would go on for a client that is gone
                    async with asyncio.timeout(self._answer_time(q)):
                        chunk = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    raise DeadlineExceededError("the deadline would pass before the answer is complete") from None
                if last is None:
                    q.timer.record("llm_ttft", time.monotonic() - started)
                last = chunk
                q.parts.append(chunk.text)
                tokens = tuple(TokenInfo(*t) for t in zip(chunk.token_ids, chunk.log_probs, chunk.normalized_entropy))
                if chunk.text or tokens:
                    yield q.first_text(chunk.text, tokens)
        q.timer.record("llm_generation", time.monotonic() - started)
        q.text, q.source = "".join(q.parts).strip(), "vlm" if visual else "llm"
        q.finish_reason = last.finish_reason if last else "length"
        if states_no_answer(q.text):  # the model's own refusal is reported as one (its text stands)
            q.finish_reason = "refusal"

    def _final(self, q: _Query) -> FinalAnswerEvent:
        citations = q.citations or evidence_citations(q.text, {item.rank: item.record for item in q.items})
        timings = q.timer.report()
        cost = q.ledger.report(timings["total"])
        cost = replace(cost, orchestrator_ms_by_stage=own_time_by_stage(q.timer, q.ledger, cost.orchestrator_ms))
        answering = [c for c in q.ledger.calls if c.model in (contracts.LLM.name, contracts.VLM.name) and c.stage != "perception"]
        return FinalAnswerEvent(
            text=q.text,
            citations=citations,
            finish_reason=q.finish_reason,
            answer_source=q.source,
            timings_ms=timings,
            stage_starts_ms=q.timer.starts_ms(),
            usage=Usage(len(q.ledger.calls), sum(c.tokens_in for c in answering), sum(c.tokens_out for c in answering)),
            cost=cost,
            degraded=bool(q.degradations),
            degraded_reason="; ".join(q.degradations),
            uncertainty=q.uncertainty,
            short_answer=None if not self.settings.answer.short_answer
            else q.short_answer if q.source == "extractive" else self._generated_short_answer(q),
            retrieval_mode="lexical" if q.plan.lexical else "full",
            answerability=q.answerability,
        )

    @staticmethod
    def _generated_short_answer(q: _Query) -> Optional[ShortAnswer]:
        """A generated answer is its own short answer (no quoted sentence holds it)."""
        if q.source not in ("llm", "vlm", "hybrid") or not q.text.strip():
            return None
        text = " ".join(CITATION_MARK.sub(" ", q.text).split())
        return ShortAnswer(text, expected_type(q.question), -1, 0, 0) if text else None

    # ------------------------------------------------------------------ helpers

    async def _optional(self, q: _Query, stage: str, work: Awaitable[T], budget_s: Optional[float] = None) -> Optional[T]:
        """An optional stage's result, or None when its model is down, fails, or it would run past `budget_s`:
        the query goes on without it and the final answer says what was skipped and why."""
        try:
            if budget_s is not None and budget_s <= 0:
                raise DeadlineExceededError(f"{budget_s + 0.0:.2f} s left for it")
            async with asyncio.timeout(budget_s):  # None: no limit (not wait_for, which can lose a cancellation)
                return await work
        except asyncio.TimeoutError:
            q.degradations.append(f"{stage} skipped: it would have run past the deadline")
        except SURVIVABLE as error:
            q.degradations.append(f"{stage} skipped: {error}")
        finally:
            if inspect.iscoroutine(work) and inspect.getcoroutinestate(work) == inspect.CORO_CREATED:
                work.close()  # never started (no time left): close it so it is not reported as never awaited
        return None

    def _count_tokens(self, texts: Sequence[str]) -> int:
        return self.tokenizer.total(texts)

    def _generation(self, plan: QueryPlan) -> GenerationOptions:
        return GenerationOptions(plan.max_tokens, plan.temperature, plan.top_p, (), plan.seed)

    def _answer_time(self, q: _Query) -> float:
        """Time the answering model may take: what is left, less the reserve for the extractive fallback."""
        left = q.left() - self.settings.answer.extractive_reserve_s
        if left <= 0:
            raise DeadlineExceededError("no time left for the answer before the deadline")
        return left

    async def _budget(self, model: str, max_tokens: int, images: int = 0) -> int:
        """Prompt tokens the model can take: its declared context less the answer's tokens and the images'."""
        facts = await self.models.generator_facts(model)
        return facts.context_tokens - max_tokens - images * facts.image_tokens


def evidence_citations(text: str, records: dict[int, EvidenceRecord]) -> tuple[Citation, ...]:
    """The evidence a generated answer cites ([n]), in order of first mention: its page and every region of it."""
    return tuple(
        Citation(rank, records[rank].evidence_id, records[rank].document_name, records[rank].page,
                 tuple(span for span in records[rank].spans if span.page >= 0))
        for rank in cited_ranks(text, set(records))
    )
