"""Citations name the page and region of what they quote, not of the chunk it came from."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.knowledge.parsing.chunking import Span, chunk_blocks
from orchestrator.knowledge.parsing.documents import Block
from orchestrator.knowledge.graph.extraction import Entity, Extraction, Relation
from orchestrator.knowledge.ingest import _mentions
from orchestrator.knowledge.parsing.passages import passages_of
from orchestrator.knowledge.storage.segments import EvidenceRecord
from orchestrator.pipeline.events import EvidenceItem
from orchestrator.pipeline.extractive import candidate_sentences, choose, sentence_citations
from orchestrator.pipeline.query import evidence_citations
from orchestrator.models.tokens import PlainTokenizer
from tests.conftest import MODEL_REPOSITORY

TOKENIZER_FILE = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"
FACT = "The Halvorsen turbine contract was signed for 7.4 million kroner."
FACT_BBOX = (120, 410, 880, 470)


@pytest.fixture(scope="module")
def tokenizer():
    if not TOKENIZER_FILE.exists():
        pytest.skip("run `make models` first")
    return PlainTokenizer(TOKENIZER_FILE, "ingest.tokenizer")


def report_blocks() -> list[Block]:
    """Pages 1-3 (0-based) of prose; the fact is the second paragraph of page 2."""
    filler = "The depot maintenance schedule was reviewed by the committee during the quarter."
    blocks = [Block("title", "Operations review", page=1, bbox=(100, 60, 900, 90), level=1)]
    for page in (1, 2, 3):
        blocks.append(Block("text", f"{filler} Page {page} notes.", page=page, bbox=(120, 200, 880, 380)))
        if page == 2:
            blocks.append(Block("text", FACT, page=2, bbox=FACT_BBOX))
        blocks.append(Block("text", f"{filler} More on page {page}.", page=page, bbox=(120, 500, 880, 680)))
    return blocks


def passage_items(blocks, tokenizer) -> list[EvidenceItem]:
    passages = passages_of(blocks, tokenizer, 128)
    return [
        EvidenceItem(rank, 1.0, EvidenceRecord(f"d:t{rank}", "d", "review.pdf", "passage", "text", p.text, p.section, p.spans))
        for rank, p in enumerate(passages, 1)
    ]


def test_a_sentence_on_page_two_of_a_chunk_spanning_pages_one_to_three_is_cited_on_page_two_with_its_bbox(tokenizer):
    blocks = report_blocks()
    (chunk,) = chunk_blocks(blocks, tokenizer, 1200, 100)  # what the extractor reads: one chunk over three pages
    assert sorted({span.page for span in chunk.spans}) == [1, 2, 3]
    items = passage_items(blocks, tokenizer)
    assert [item.record.page for item in items] == [1, 2, 3]  # passages never cross a page
    sentences = candidate_sentences(items)
    similarities = np.array([0.9 if s.text == FACT else 0.1 for s in sentences])
    chosen = choose("What was the turbine contract signed for?", sentences, similarities, 3, 0.3, 0.15)
    (citation,) = sentence_citations(chosen, {item.rank: item.record for item in items})
    assert (citation.evidence_rank, citation.passage_id, citation.page, citation.quote) == (2, "d:t2", 2, FACT)
    assert citation.regions == (Span(4, 2, FACT_BBOX, citation.regions[0].start, citation.regions[0].end),)
    assert items[1].record.text[citation.regions[0].start : citation.regions[0].end] == FACT


def test_a_generated_answer_cites_every_region_of_the_evidence_it_names():
    record = EvidenceRecord("d:t1", "d", "review.pdf", "passage", "text", "a\n\nb", "", (Span(4, 2, (1, 2, 3, 4), 0, 1), Span(5, 2, (5, 6, 7, 8), 3, 4)))
    unit = EvidenceRecord("d:u0", "d", "review.pdf", "unit", "table", "Table", "", (Span(6, 3, (0, 0, 9, 9)),))
    citations = evidence_citations("It rose [2], as [1] says [2].", {1: record, 2: unit})
    assert [(c.evidence_rank, c.page, [s.bbox for s in c.regions], c.quote) for c in citations] == [
        (2, 3, [(0, 0, 9, 9)], ""), (1, 2, [(1, 2, 3, 4), (5, 6, 7, 8)], ""),
    ]
    text_only = EvidenceRecord("m:t0", "m", "notes.md", "passage", "text", "x", "", (Span(0, -1, (0, 0, 0, 0), 0, 1),))
    assert evidence_citations("[1]", {1: text_only})[0].regions == ()  # no pages, no regions (page -1)


def test_what_the_extractor_finds_in_a_chunk_is_filed_under_the_passages_that_name_it():
    passages = [EvidenceRecord(f"d:t{i}", "d", "r.pdf", "passage", "text", text, "", ()) for i, text in enumerate(
        ["Halvorsen signed the contract.", "The turbine came from Brno.", "Halvorsen and Brno met again."])]
    unit = EvidenceRecord("d:u0", "d", "r.pdf", "unit", "table", "Table: Brno output", "", ())
    extraction = Extraction(
        entities=[Entity("Halvorsen", "organization", ""), Entity("Brno", "location", ""), Entity("the Vendor", "organization", "")],
        relations=[Relation("Halvorsen", "Brno", "supplied", "", 1.0)],
    )
    entities, relations = _mentions([passages, [unit]], [extraction, Extraction([Entity("Brno", "location", "")], [])])
    filed = sorted((m.key, m.evidence_id) for m in entities)
    assert filed == [
        ("brno", "d:t1"), ("brno", "d:t2"), ("brno", "d:u0"), ("halvorsen", "d:t0"), ("halvorsen", "d:t2"),
        ("vendor", "d:t0"),  # named in no passage (the extractor paraphrased): the chunk's first passage
    ]
    assert [(r.source, r.target, r.evidence_id) for r in relations] == [("brno", "halvorsen", "d:t2")]  # both names
