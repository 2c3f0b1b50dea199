"""Adjacent context by bbox, the cost ledger, stage start times, page similarity averaging and the VLM relevance arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.knowledge.parsing.documents import NO_PAGE, Block
from orchestrator.pipeline.accounting import QueryLedger, busy_ms, own_time_by_stage
from orchestrator.pipeline.context import adjacent_blocks, context_texts, vertical_gap
from orchestrator.pipeline.pages import average_similarity
from orchestrator.pipeline.timing import StageTimer
from thinkserve_backend.relevance import first_token_ids, group_by_length, relevance_prompt, yes_probability


def page_blocks() -> list[Block]:
    """Page 1: a title, two paragraphs above a table, a footnote-like paragraph below it; page 2: one paragraph."""
    return [
        Block("title", "Results", page=1, bbox=(100, 50, 900, 80)),
        Block("text", "Sales rose in every region.", page=1, bbox=(100, 100, 900, 200)),
        Block("text", "Table 2 shows the regions.", page=1, bbox=(100, 210, 900, 260)),
        Block("table", "North 1250", page=1, bbox=(100, 280, 900, 600)),
        Block("text", "Figures in thousands of euros.", page=1, bbox=(100, 620, 900, 650)),
        Block("text", "Other page.", page=2, bbox=(100, 100, 900, 200)),
    ]


def test_adjacent_context_is_the_nearest_text_above_and_below_on_the_same_page():
    blocks = page_blocks()
    assert vertical_gap(blocks[2].bbox, blocks[3].bbox) == 20 and vertical_gap(blocks[3].bbox, blocks[3].bbox) == 0
    assert adjacent_blocks(blocks, 3, 1) == [2, 4]
    assert adjacent_blocks(blocks, 3, 2) == [1, 2, 4]  # the title counts as text; only one block below
    assert adjacent_blocks(blocks, 3, 1, exclude=frozenset({2})) == [1, 4]
    assert adjacent_blocks(blocks, 3, 0) == [] and adjacent_blocks(blocks, 99, 1) == []
    assert context_texts(blocks, [2, 4]) == ("Table 2 shows the regions.", "Figures in thousands of euros.")


def test_without_pages_the_context_is_the_neighbours_in_reading_order():
    blocks = [Block("text", "A."), Block("image", "", caption="Logo"), Block("text", "B."), Block("text", "C.")]
    assert all(b.page == NO_PAGE for b in blocks)
    assert adjacent_blocks(blocks, 1, 1) == [0, 2]


def test_overlapping_model_calls_count_once_in_the_model_time():
    assert busy_ms([(0.0, 1.0), (0.5, 2.0), (3.0, 3.5), (3.1, 3.2)]) == pytest.approx(2500.0)
    assert busy_ms([]) == 0.0
    ticks = iter([0.0, 0.05, 0.15, 0.2, 0.3, 0.35])  # embed [0, 0.2] holds rerank [0.05, 0.15]; embed [0.3, 0.35]
    ledger = QueryLedger(clock=lambda: next(ticks))
    with ledger.record("text_embedder", "embed", items=2, tokens_in=10):
        with ledger.record("reranker", "rerank", items=5, tokens_in=100) as call:
            call.tokens_out = 0
    with ledger.record("text_embedder", "embed", items=1, tokens_in=4):
        pass
    report = ledger.report(total_ms=500.0)
    usage = {(u.model, u.stage): u for u in report.usage}
    assert usage[("text_embedder", "embed")].calls == 2 and usage[("text_embedder", "embed")].items == 3
    assert usage[("text_embedder", "embed")].tokens_in == 14
    assert usage[("text_embedder", "embed")].model_ms == pytest.approx(200.0 + 50.0)
    assert usage[("reranker", "rerank")].model_ms == pytest.approx(100.0)
    assert report.model_ms == pytest.approx(250.0) and report.orchestrator_ms == pytest.approx(250.0)
    assert report.model_calls == 3 and report.tokens("reranker") == (100, 0)


def test_the_orchestrators_own_time_is_split_by_stage_outside_each_stages_model_calls():
    ticks = iter([1.00, 1.03, 1.50, 1.52])  # embed's call [1.00, 1.03]; the LLM's [1.50, 1.52]
    ledger = QueryLedger(clock=lambda: next(ticks))
    with ledger.record("text_embedder", "embed"):
        pass
    with ledger.record("llm", "llm"):
        pass
    timer = StageTimer()
    timer.intervals = {
        "embed": [(0.99, 1.04)],  # 50 ms, 30 of them waiting on the embedder
        "answer": [(1.10, 1.12)],  # no model call of its own: all 20 ms are the orchestrator's
        "llm_generation": [(1.49, 1.53)],  # the LLM's calls are recorded under "llm"
        "retrieval": [(0.99, 1.10)], "llm_ttft": [(1.49, 1.50)],  # an umbrella and a moment: not stages
    }
    timer.merged = {"dense": 2.0, "fusion": 1.0}  # timed in retrieval's worker thread, no model calls
    own = own_time_by_stage(timer, ledger, orchestrator_ms=60.0)
    assert own == pytest.approx({"dense": 2.0, "fusion": 1.0, "embed": 20.0, "answer": 20.0, "llm_generation": 20.0,
                                 "unattributed": 0.0})
    assert own_time_by_stage(timer, ledger, orchestrator_ms=100.0)["unattributed"] == pytest.approx(37.0)
    # a stage that ran twice counts both runs; a call outside the stage's intervals is not subtracted
    timer.intervals = {"embed": [(0.99, 1.01), (1.02, 1.04)]}
    timer.merged = {}
    assert own_time_by_stage(timer, ledger, 100.0)["embed"] == pytest.approx(40.0 - 20.0)


def test_stage_starts_are_offsets_of_each_stages_first_run_merged_ones_included_when_given():
    timer = StageTimer()
    timer.started = 10.0
    timer.intervals = {"embed": [(10.002, 10.010)], "rerank": [(10.050, 10.060), (10.020, 10.030)]}
    timer.merge({"dense": 2.0, "graph": 1.0}, {"dense": 10.004})  # the graph's start was not given
    timer.merge({"dense": 1.0}, {"dense": 10.003})  # the graph side's dense search began first
    timer.since_start("rag_ttft")
    timer.since_start("rag_ttft")  # a moment: recorded once
    assert timer.starts_ms() == pytest.approx({"total": 0.0, "embed": 2.0, "rerank": 20.0, "dense": 3.0, "rag_ttft": 0.0})
    assert timer.stages["dense"] == 3.0 and len(timer.intervals["rag_ttft"]) == 1


def test_page_similarities_are_averaged_across_encoder_families():
    average = average_similarity({"clip": np.array([0.2, 0.8]), "siglip": np.array([0.6, 0.0])})
    assert average.tolist() == pytest.approx([0.4, 0.4])
    assert average_similarity({}).size == 0


def test_relevance_is_p_yes_among_yes_and_no():
    logits = np.array([[2.0, 0.0, 1.0, -1.0], [0.0, 3.0, 0.0, 0.0]])
    yes, no = [0, 2], [1]
    p = yes_probability(logits, yes, no)
    expected = (math.exp(2) + math.exp(1)) / (math.exp(2) + math.exp(1) + math.exp(0))
    assert p[0] == pytest.approx(expected, rel=1e-6)
    assert p[1] == pytest.approx(2 / (2 + math.exp(3)), rel=1e-6)
    assert yes_probability(np.array([[1000.0, 999.0]]), [0], [1])[0] == pytest.approx(1 / (1 + math.exp(-1)), rel=1e-6)


def test_relevance_prompt_tokens_and_length_groups():
    vocabulary = {"yes": [5], "Yes": [6], " yes": [5, 9], "no": [7], "No": [7], "": []}
    assert first_token_ids(lambda text: vocabulary.get(text, []), ["yes", "Yes", " yes", "YES"]) == [5, 6]
    assert first_token_ids(lambda text: vocabulary.get(text, []), ["no", "No"]) == [7]
    assert relevance_prompt("{image} Q: {question}", "Why?", "<image>") == "<image> Q: Why?"
    assert group_by_length([5, 7, 5, 5, 7]) == {5: [0, 2, 3], 7: [1, 4]}


def test_page_search_averages_every_encoder_familys_similarity(tmp_path):
    """Three families (clip, siglip, openclip) embedded the pages; the question goes through each family's text
    tower, and each page's similarity is the mean of its three cosines, each computed exactly."""
    import asyncio

    from orchestrator.knowledge.storage.segments import PageRecord
    from orchestrator.knowledge.storage.registry import KnowledgeBase
    from orchestrator.pipeline.accounting import QueryLedger, StageModels
    from orchestrator.pipeline.pages import search_pages
    from orchestrator.models.contracts import PAGE_ENCODER_FAMILIES
    from tests.model_double import InProcessModels, bag_of_words
    from tests.segment_factory import commit, make_segment, unit_vectors

    assert len(PAGE_ENCODER_FAMILIES) == 3
    question = "revenue by region"
    segment = make_segment("report.pdf", ["page one", "page two", "page three"])
    segment.pages = [PageRecord(segment.document.document_id, page, f"pages/page-{page:04d}.jpg") for page in range(3)]
    segment.page_vectors = {family: unit_vectors(3, 64, seed) for seed, family in enumerate(PAGE_ENCODER_FAMILIES)}
    knowledge = KnowledgeBase(tmp_path)
    commit(knowledge.collection("c", create=True), segment)
    snapshot = knowledge.collection("c").snapshot
    models = InProcessModels()
    hits = asyncio.run(search_pages(StageModels(models, QueryLedger(), "page_images", lambda t: 0), snapshot, question, 3, 10.0))

    asked = bag_of_words(question, 64)
    expected = {page: np.mean([segment.page_vectors[f][page] @ asked for f in PAGE_ENCODER_FAMILIES]) for page in range(3)}
    assert sorted(models.calls) == sorted(f"page_text_{f}" for f in PAGE_ENCODER_FAMILIES)
    assert [hit.page.page for hit in hits] == sorted(expected, key=lambda page: -expected[page])
    for hit in hits:
        assert set(hit.per_family) == set(PAGE_ENCODER_FAMILIES)
        assert hit.similarity == pytest.approx(expected[hit.page.page], abs=1e-5)
        assert hit.similarity == pytest.approx(np.mean(list(hit.per_family.values())), abs=1e-6)
