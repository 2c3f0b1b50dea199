"""Recorded answers: work moved off the query path must not change what a query returns.

A small synthetic collection (benchmarks/thinkserve_bench/scripts/synthetic_collection.py, exact Flat indexes) is asked 20 questions on
each route through the query pipeline the server runs, with the own-time benchmark's stand-in models
(deterministic vectors, no time). The evidence list of each (ids, order, every signal to 6 decimals) and the
extractive answer with its citations must equal what tests/orchestrator/pipeline/recorded_answers.json holds: it was recorded
before the own-time work of issue 21 (from commit 3c80897) and is rewritten only on purpose. Once so far: when
the Simple route stopped expanding the graph, its 20 entries lost the "graph" in `found_by` and their
structural signal (weight 0), and nothing else changed (same evidence, order, other signals, answers, citations).
To rewrite it:

    THINKSERVE_RECORD_ANSWERS=1 .venv/bin/python -m pytest tests/orchestrator/pipeline/test_recorded_answers.py
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from thinkserve_bench.scripts.own_time import COLLECTION, InstantModels
from thinkserve_bench.scripts.synthetic_collection import CollectionShape, SyntheticCorpus, write_collection
from orchestrator.config import ROUTE_NAMES, Settings
from orchestrator.knowledge.storage.indexes import index_spec
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.pipeline.events import EvidenceEvent, FinalAnswerEvent
from orchestrator.pipeline.plan import QueryOptions
from orchestrator.pipeline.query import QueryInput, QueryPipeline
from orchestrator.models.tokens import PlainTokenizer
from tests.conftest import MODEL_REPOSITORY

RECORDED = Path(__file__).with_name("recorded_answers.json")
SHAPE = CollectionShape(documents=6, chunks_per_document=60, vocabulary=3000, entity_pool=400, seed=3)


def _pipeline(data_dir: Path, models, sentences_stored: bool = True) -> QueryPipeline:
    """`sentences_stored`: the segments' answer sentences cut when written (as the ingest does), or not (as
    segments written before that were: a query cuts them)."""
    settings = Settings.load(overrides={"triton": {"model_repository": str(MODEL_REPOSITORY)}})
    tokenizer = PlainTokenizer(settings.tokenizer_file, "ingest.tokenizer")
    write_collection(SyntheticCorpus(SHAPE).segments(), data_dir, COLLECTION, tokenizer.counts if sentences_stored else None)
    knowledge = KnowledgeBase(data_dir, index_spec(settings.index))
    return QueryPipeline(settings, models, knowledge, tokenizer)


def _answers(data_dir: Path, sentences_stored: bool) -> list[dict]:
    models = InstantModels(SHAPE.dimension)
    pipeline = _pipeline(data_dir, models, sentences_stored)

    async def ask_all() -> list[dict]:
        out = []
        for route in ROUTE_NAMES:
            for question in SyntheticCorpus(SHAPE).questions(20):
                models.question = question
                evidence, final = None, None
                query = QueryInput(COLLECTION, question.text, QueryOptions(route=route))
                async for event in pipeline.run(query, time.monotonic() + 60):
                    evidence = event if isinstance(event, EvidenceEvent) else evidence
                    final = event
                assert isinstance(evidence, EvidenceEvent) and isinstance(final, FinalAnswerEvent)
                out.append({
                    "route": route,
                    "question": question.text,
                    "evidence": [
                        [item.record.evidence_id, list(item.signals.found_by)]
                        + [round(getattr(item.signals, name), 6) for name in ("semantic", "lexical", "page_lexical", "structural", "fused", "final")]
                        for item in evidence.items
                    ],
                    "answer": final.text,
                    "citations": [[c.evidence_rank, c.passage_id, c.page, len(c.quote)] for c in final.citations],  # the quotes are in the answer
                })
        return out

    try:
        return asyncio.run(ask_all())
    finally:
        pipeline.close()


@pytest.mark.parametrize("sentences_stored", [True, False], ids=["sentences-stored", "sentences-cut-at-query-time"])
def test_every_route_returns_the_recorded_evidence_and_answers(tmp_path, sentences_stored):
    answers = _answers(tmp_path, sentences_stored)
    if os.environ.get("THINKSERVE_RECORD_ANSWERS") and sentences_stored:
        RECORDED.write_text(json.dumps(answers, indent=0) + "\n")
    recorded = json.loads(RECORDED.read_text())
    assert len(answers) == len(recorded) == 60
    assert sum(bool(a["citations"]) for a in answers) >= 30  # the answers quote the evidence: the check has teeth
    for got, expected in zip(answers, recorded):
        assert same_answer(got, expected), f"{got['route']} route, question {got['question']!r} changed"


# Signals are recorded to 6 decimals; another CPU's SIMD paths (numpy, FAISS) move a sum by ~1e-7 and so its
# 6th decimal (seen: an Intel Xeon against the AMD EPYC that recorded them). Ids, order, what found each item,
# answers and citations must be equal; a signal may differ by rounding only.
SIGNAL_TOLERANCE = 2e-6


def same_answer(got: dict, expected: dict) -> bool:
    evidence, recorded_evidence = got["evidence"], expected["evidence"]
    if {k: v for k, v in got.items() if k != "evidence"} != {k: v for k, v in expected.items() if k != "evidence"}:
        return False
    return len(evidence) == len(recorded_evidence) and all(
        item[:2] == recorded[:2] and all(abs(a - b) <= SIGNAL_TOLERANCE for a, b in zip(item[2:], recorded[2:]))
        for item, recorded in zip(evidence, recorded_evidence)
    )


class NoModels:
    def __getattr__(self, name):
        raise AssertionError(f"warm-up called the model method {name}")


def test_the_servers_warm_up_builds_every_collection_without_calling_a_model(tmp_path):
    pipeline = _pipeline(tmp_path, NoModels())
    try:
        pipeline.warm_up()
        snapshot = pipeline.knowledge.collection(COLLECTION).snapshot
        assert {"lexical", "page_lexical", "graph", "node_evidence"} <= set(snapshot.__dict__)
    finally:
        pipeline.close()


def test_the_warm_up_retrieves_in_the_threads_queries_retrieve_in(tmp_path, monkeypatch):
    """A thread's first retrieval faults in fresh memory for its allocator: the warm-up pays it, not the first query
    (whose BM25 side starts before its vectors exist, its dense side beside it once they do, then fusion)."""
    from orchestrator.pipeline import retrieval as retrieval_module

    threads: list[tuple[str, str, str]] = []
    phase = ["warm-up"]

    def recording(name):
        original = getattr(retrieval_module, name)

        def record(*args, **kwargs):
            threads.append((phase[0], name, threading.current_thread().name))
            return original(*args, **kwargs)

        monkeypatch.setattr(retrieval_module, name, record)

    for part in ("_lexical_side", "_dense_side", "_fused"):
        recording(part)
    models = InstantModels(SHAPE.dimension)
    pipeline = _pipeline(tmp_path, models)
    try:
        pipeline.warm_up()
        phase[0] = "query"
        question = SyntheticCorpus(SHAPE).questions(1)[0]
        models.question = question

        async def ask() -> None:
            async for _ in pipeline.run(QueryInput(COLLECTION, question.text, QueryOptions(route="simple")), time.monotonic() + 60):
                pass

        asyncio.run(ask())
    finally:
        pipeline.close()
    warm_up = {thread for kind, _, thread in threads if kind == "warm-up"}
    assert warm_up and all(thread.startswith(("retrieval", "graph-search")) for thread in warm_up)  # every route, in the pools
    query = [(part, thread) for kind, part, thread in threads if kind == "query"]
    assert sorted(part for part, _ in query) == ["_dense_side", "_fused", "_lexical_side"]
    assert {thread for _, thread in query} <= warm_up  # the query's parts ran in threads the warm-up ran in


class TextVectorModels(InstantModels):
    """The stand-in models with every text's vector its own (a question's from the corpus, any other text's from
    its hash), not tied to the question being asked: many questions can be in flight at once."""

    def __init__(self, dimension: int, questions, latency_s: float):
        super().__init__(dimension, latency_s)
        self.by_text = {question.text: question for question in questions}

    def _vector(self, text: str):
        self.question = self.by_text.get(text)
        return super()._vector(text)


def test_queries_in_flight_at_once_return_what_they_return_one_by_one(tmp_path, caplog):
    """Retrieval's parts run in shared pools and meet in whichever thread ends last: 24 queries on every route at
    once (each model call 2 ms, so their parts interleave) give each the evidence and answer it gets alone."""
    questions = SyntheticCorpus(SHAPE).questions(8)
    models = TextVectorModels(SHAPE.dimension, questions, latency_s=0.002)
    pipeline = _pipeline(tmp_path, models)
    asks = [(route, question) for route in ROUTE_NAMES for question in questions]

    async def ask(route: str, question) -> tuple:
        evidence, final = None, None
        async for event in pipeline.run(QueryInput(COLLECTION, question.text, QueryOptions(route=route)), time.monotonic() + 60):
            evidence = event if isinstance(event, EvidenceEvent) else evidence
            final = event
        return [(item.record.evidence_id, item.signals.fused) for item in evidence.items], final.text, final.citations

    async def one_by_one() -> list:
        return [await ask(route, question) for route, question in asks]

    async def at_once() -> list:
        return list(await asyncio.gather(*(ask(route, question) for route, question in asks)))

    try:
        pipeline.warm_up()
        alone = asyncio.run(one_by_one())
        together = asyncio.run(at_once())
    finally:
        pipeline.close()
    assert sum(bool(evidence) for evidence, _, _ in alone) == len(asks)
    assert together == alone
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []
