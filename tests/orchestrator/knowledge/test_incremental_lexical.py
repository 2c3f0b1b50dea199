"""The collection's BM25 indexes are assembled from each document's token counts: after any sequence of adds,
replacements and deletes they equal indexes built from scratch over the same texts, and a commit tokenises
only the document it adds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.lexical import BM25Index, TermCounts
from orchestrator.knowledge.parsing.text import lexical_terms
from orchestrator.knowledge.storage.snapshot import Snapshot
from tests.segment_factory import make_segment

WORDS = ["revenue", "grew", "north", "south", "2024", "1,200", "cost", "fell", "the", "report", "4.5%", "Ünïcode"]
QUERIES = ["revenue 2024", "north cost fell", "report", "ünïcode south 1,200", "unknown words only"]

texts = st.lists(st.lists(st.sampled_from(WORDS), min_size=0, max_size=12).map(" ".join), min_size=1, max_size=6)
operations = st.lists(
    st.tuples(st.sampled_from(["add", "delete"]), st.integers(0, 3), texts, st.lists(st.integers(0, 3), min_size=6, max_size=6),
              st.booleans()),
    min_size=1, max_size=12,
)


def assert_same(assembled: BM25Index, scratch: BM25Index) -> None:
    assert assembled.size == scratch.size
    for term in {t for word in WORDS for t in lexical_terms(word)}:
        assert assembled.document_frequency(term) == scratch.document_frequency(term)
        assert np.isclose(assembled.idf(term), scratch.idf(term))
    for query in QUERIES:
        assert np.allclose(assembled.scores(query), scratch.scores(query), atol=1e-6)
        assert assembled.query_weight(query) == scratch.query_weight(query)


@settings(max_examples=80, deadline=None)
@given(operations)
def test_incremental_indexes_equal_from_scratch_after_any_adds_replacements_and_deletes(steps):
    """Each snapshot's indexes are built from the previous snapshot's runs (or, when that one was never built,
    from the runs it would have been built from): tombstones, merges and rebuilt runs all score as a fresh index."""
    snapshot = Snapshot(0, [], IndexSpec())
    for generation, (operation, number, document_texts, pages, look) in enumerate(steps, 1):
        name = f"doc{number}.md"
        kept = [s for s in snapshot.segments if s.document.name != name]
        if operation == "add":  # a name already present is replaced
            segment = make_segment(name, document_texts, dim=4, seed=generation, content=f"{name}{generation}",
                                   pages=pages[: len(document_texts)])
            snapshot = Snapshot(generation, kept + [segment], IndexSpec(), base=snapshot)
        else:
            snapshot = Snapshot(generation, kept, IndexSpec(), previous=snapshot)
        if look or generation == len(steps):  # a snapshot nobody queried is superseded unbuilt
            assert_same(snapshot.lexical, BM25Index([e.text for e in snapshot.evidence]))
            page_texts = ["\n".join(snapshot.evidence[row].text for row in page) for page in snapshot.page_rows]
            assert_same(snapshot.page_lexical, BM25Index(page_texts))


def test_a_commit_reuses_the_previous_runs_and_merges_like_a_binary_counter():
    segments = [make_segment(f"d{i}.md", [f"revenue {i}", "cost fell"], dim=4, seed=i) for i in range(8)]
    snapshot = Snapshot(1, segments[:1], IndexSpec())
    sizes = [snapshot.lexical.run_sizes]
    for count in range(2, 9):
        snapshot = Snapshot(count, segments[:count], IndexSpec(), base=snapshot)
        sizes.append(snapshot.lexical.run_sizes)
    assert sizes == [[2], [4], [4, 2], [8], [8, 2], [8, 4], [8, 4, 2], [16]]
    first_runs = snapshot.lexical._runs
    deleted = Snapshot(9, segments[1:], IndexSpec(), previous=snapshot)
    assert deleted.lexical.run_sizes == [14] and deleted.lexical._runs[0].run is first_runs[0].run  # a tombstone
    assert deleted.lexical.document_frequency("0") == 0 and deleted.lexical.document_frequency("cost") == 7
    emptied = Snapshot(10, segments[5:], IndexSpec(), previous=deleted)
    assert emptied.lexical.run_sizes == [6] and emptied.lexical._runs[0].run is not first_runs[0].run  # rebuilt


def test_a_commit_tokenises_only_the_document_it_adds(monkeypatch):
    first = make_segment("a.md", ["revenue grew", "cost fell"], dim=4)
    before = Snapshot(1, [first], IndexSpec())
    before.lexical, before.page_lexical
    tokenised: list[int] = []
    original = TermCounts.of.__func__
    monkeypatch.setattr(TermCounts, "of", classmethod(lambda cls, texts: tokenised.append(len(texts)) or original(cls, texts)))
    second = make_segment("b.md", ["north report", "south report", "2024"], dim=4, seed=1)
    after = Snapshot(2, [first, second], IndexSpec(), base=before)
    after.lexical, after.page_lexical
    assert tokenised == [3]  # the new document's three texts, once for both indexes
    assert after.lexical.search("report", 5) == [(2, after.lexical.scores("report")[2]), (3, after.lexical.scores("report")[3])]
