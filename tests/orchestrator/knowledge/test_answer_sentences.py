"""Answer sentences cut at commit time (knowledge/sentences.py) equal what a query would cut from the record,
survive a write and a load, and a file that cannot be read costs the query nothing but time."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from orchestrator.config import AnswerSettings
from orchestrator.knowledge.parsing.chunking import Span
from orchestrator.knowledge.storage.segments import EvidenceRecord, Segment
from orchestrator.knowledge.parsing.sentences import MAX_SENTENCE_CHARS, SENTENCES_FILE, cut_sentences, located_texts, record_sentences
from orchestrator.pipeline.accounting import QueryLedger, StageModels
from orchestrator.pipeline.events import EvidenceItem
from orchestrator.pipeline.extractive import candidate_sentences, extractive_answer
from orchestrator.models.tokens import PlainTokenizer
from tests.conftest import MODEL_REPOSITORY
from tests.segment_factory import make_segment

TOKENIZER_FILE = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"
LONG = "The committee reviewed " + " ".join(f"item{n}" for n in range(120)) + " in the end."
TEXTS = [
    "Financial results\n\nTotal revenue was 412 million euros in 2024. Net profit was 44 million euros. Short one.",
    "Letter from the chief executive\n\nTotal revenue was 412 million euros in 2024. It rose.",
    f"{LONG}\n\n- a list item that has enough words\n| a | table | row | with | cells |",
    "Dr. Smith met Contoso Inc. The deal was   signed\nacross two lines of text.",
]


@pytest.fixture(scope="module")
def tokenizer():
    if not TOKENIZER_FILE.exists():
        pytest.skip("run `make models` first")
    return PlainTokenizer(TOKENIZER_FILE, "ingest.tokenizer")


def two_block_record(text_a: str, text_b: str) -> EvidenceRecord:
    """A passage of two blocks on pages 3 and 4, each block's place in the text recorded."""
    text = f"{text_a}\n\n{text_b}"
    spans = (Span(7, 3, (0, 0, 500, 100), 0, len(text_a)), Span(8, 4, (0, 200, 500, 300), len(text_a) + 2, len(text)))
    return EvidenceRecord("d:t0", "d", "report.pdf", "passage", "text", text, "Report > Results", spans)


def test_stored_sentences_equal_the_ones_cut_at_query_time_after_a_write_and_a_load(tmp_path, tokenizer):
    segment = make_segment("report.pdf", TEXTS)
    segment.blocks = [replace(segment.blocks[0], type="title"), *segment.blocks[1:]]  # passage 0 spans a title block
    segment.cut_sentences(tokenizer.counts)
    folder = tmp_path / "seg"
    (folder / "assets").mkdir(parents=True)
    (folder / "pages").mkdir()
    segment.write(folder)
    loaded = Segment.load(folder)
    loaded.fault_in()  # what the warm-up does: the file's lines found, so a query's first row costs no scan
    assert loaded.sentences._lines is not None
    for row, record in enumerate(loaded.evidence):
        stored = loaded.answer_sentences(row).sentences
        at_query_time = record_sentences([record], loaded.blocks)[0].sentences
        assert [(s.text, s.key, s.span, s.terms) for s in stored] == [(s.text, s.key, s.span, s.terms) for s in at_query_time]
        assert [s.tokens for s in stored] == [tokenizer.count(s.text) for s in stored]
        assert all(s.tokens is None for s in at_query_time)
    assert loaded.answer_sentences(0).titles == (TEXTS[0],) and loaded.answer_sentences(1).titles == ()
    assert [loaded.answer_sentences(row).titles for row in range(len(TEXTS))] == [
        cut.titles for cut in record_sentences(list(loaded.evidence), loaded.blocks)]
    long = [s for s in loaded.answer_sentences(2).sentences if s.text.startswith("The committee")]
    assert len(long) == 1 and len(long[0].text) == MAX_SENTENCE_CHARS and long[0].key == LONG.casefold()  # cut, known by its whole
    assert "Short one." not in [s.text for s in loaded.answer_sentences(0).sentences]  # a fragment is no answer


def test_candidates_from_stored_sentences_equal_candidates_cut_from_the_records(tokenizer):
    records = [two_block_record("Revenue grew by nine percent in Asia.", "Margins fell in Europe this year."),
               EvidenceRecord("d:u0", "d", "report.pdf", "unit", "table", TEXTS[0], "Report", (Span(2, 1, (0, 0, 9, 9)),)),
               EvidenceRecord("d:c0", "d", "report.pdf", "chunk", "text", TEXTS[1], "", ())]
    items = [EvidenceItem(rank, 1.0, record, perception="The table lists revenue by region for three regions." if rank == 2 else "")
             for rank, record in enumerate(records, 1)]
    stored = {rank: cut.sentences for rank, cut in enumerate(record_sentences(records, [], tokenizer.counts), 1)}
    headings = {"Letter from the chief executive"}
    with_stored = candidate_sentences(items, headings, stored)
    cut_now = candidate_sentences(items, headings)
    assert with_stored == cut_now  # text, rank, position, span
    assert [s.terms for s in with_stored] == [s.terms for s in cut_now]
    assert [(s.text, s.span.page) for s in with_stored if s.rank == 1] == [
        ("Revenue grew by nine percent in Asia.", 3), ("Margins fell in Europe this year.", 4)]  # each cited on its block
    # the repeat in rank 3 is left to rank 2; the VLM's description is cut at query time, at the unit's block
    assert [s.text for s in with_stored if s.rank == 3] == []
    assert with_stored[-1].text.startswith("The table lists") and with_stored[-1].tokens is None and with_stored[-1].span.block == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from(["word", "Word", " ", ".", "\n", "\n\n", "|", "- ", "1,5%", "Dr.", " Inc. The ", "x" * 90]),
                         max_size=80).map("".join), min_size=1, max_size=3))
def test_any_text_cuts_the_same_stored_or_not(tokenizer, texts):
    record = EvidenceRecord("d:t0", "d", "x.pdf", "passage", "text", "\n\n".join(texts), "", ())
    (stored,) = record_sentences([record], [], tokenizer.counts)
    stored = stored.sentences
    assert [s.text for s in stored] == [s.text for s in cut_sentences(located_texts(record))]
    assert [s.tokens for s in stored] == tokenizer.counts([s.text for s in stored])


def test_a_damaged_sentences_file_is_logged_and_the_sentences_cut_at_query_time(tmp_path, tokenizer, caplog):
    segment = make_segment("report.pdf", TEXTS)
    segment.cut_sentences(tokenizer.counts)
    folder = tmp_path / "seg"
    (folder / "assets").mkdir(parents=True)
    (folder / "pages").mkdir()
    segment.write(folder)
    path = folder / SENTENCES_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated mid-line
    loaded = Segment.load(folder)
    with caplog.at_level(logging.WARNING, logger="thinkserve.knowledge"):
        got = [loaded.answer_sentences(row) for row in range(len(TEXTS))]
    assert got == record_sentences(list(loaded.evidence), loaded.blocks)  # every row answers, cut now
    assert sum("not usable" in r.getMessage() for r in caplog.records) == 1  # said once, not per query
    assert (folder / "evidence.jsonl").exists() and len(loaded.evidence) == len(TEXTS)  # nothing else lost


def test_a_segment_without_the_file_cuts_at_query_time(tmp_path):
    segment = make_segment("old.pdf", TEXTS)  # as written before the file existed: not cut
    folder = tmp_path / "seg"
    (folder / "assets").mkdir(parents=True)
    (folder / "pages").mkdir()
    segment.write(folder)
    assert not (folder / SENTENCES_FILE).exists()
    loaded = Segment.load(folder)
    assert loaded.sentences is None
    assert loaded.answer_sentences(0) == record_sentences([loaded.evidence[0]], loaded.blocks)[0]


class CountingEmbedder:
    async def embed(self, texts, timeout_s=None):
        return np.ones((len(texts), 4), np.float32) / 2


def test_the_embedders_token_count_is_the_same_with_stored_counts(tokenizer):
    items = [EvidenceItem(rank, 1.0, record) for rank, record in
             enumerate([two_block_record("Revenue grew by nine percent in Asia.", "Margins fell in Europe this year.")], 1)]
    stored = {1: record_sentences([items[0].record], [], tokenizer.counts)[0].sentences}

    def tokens_in(stored_sentences) -> int:
        ledger = QueryLedger()
        counted = []

        def count(texts):
            counted.append(list(texts))
            return tokenizer.total(texts)

        models = StageModels(CountingEmbedder(), ledger, "answer", count)
        asyncio.run(extractive_answer(models, "How did revenue grow?", np.ones(4, np.float32) / 2, items, AnswerSettings(), 5.0,
                                      stored=stored_sentences))
        (call,) = ledger.calls
        return call.tokens_in, counted

    with_stored, counted_stored = tokens_in(stored)
    cut_now, counted_now = tokens_in({})
    assert with_stored == cut_now == tokenizer.total(["Revenue grew by nine percent in Asia.", "Margins fell in Europe this year."])
    assert counted_stored == [[]] and counted_now == [["Revenue grew by nine percent in Asia.", "Margins fell in Europe this year."]]
