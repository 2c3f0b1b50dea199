"""The collection's BM25 indexes are assembled from each document's token counts: after any sequence of adds,
replacements and deletes they equal indexes built from scratch over the same texts, and a commit tokenises
only the document it adds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from orchestrator.knowledge.indexes import BM25Index, IndexSpec, TermCounts
from orchestrator.knowledge.store import Snapshot
from tests.segment_factory import make_segment

WORDS = ["revenue", "grew", "north", "south", "2024", "1,200", "cost", "fell", "the", "report", "4.5%", "Ünïcode"]
QUERIES = ["revenue 2024", "north cost fell", "report", "ünïcode south 1,200", "unknown words only"]

texts = st.lists(st.lists(st.sampled_from(WORDS), min_size=0, max_size=12).map(" ".join), min_size=1, max_size=6)
operations = st.lists(
    st.tuples(st.sampled_from(["add", "delete"]), st.integers(0, 3), texts, st.lists(st.integers(0, 3), min_size=6, max_size=6)),
    min_size=1, max_size=8,
)


def assert_same(assembled: BM25Index, scratch: BM25Index) -> None:
    assert assembled.size == scratch.size and set(assembled.vocabulary) == set(scratch.vocabulary)
    for term, column in scratch.vocabulary.items():  # column order may differ (a page's words come in its order)
        assert np.isclose(assembled.idf[assembled.vocabulary[term]], scratch.idf[column])
    for query in QUERIES:
        assert np.allclose(assembled.scores(query), scratch.scores(query), atol=1e-6)
        assert assembled.query_weight(query) == scratch.query_weight(query)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_assembled_indexes_equal_from_scratch_after_any_adds_replacements_and_deletes(steps):
    snapshot = Snapshot(0, [], IndexSpec())
    for generation, (operation, number, document_texts, pages) in enumerate(steps, 1):
        name = f"doc{number}.md"
        if operation == "add":  # a name already present is replaced
            segment = make_segment(name, document_texts, dim=4, seed=generation, content=f"{name}{generation}",
                                   pages=pages[: len(document_texts)])
            kept = [s for s in snapshot.segments if s.document.name != name]
            snapshot = Snapshot(generation, kept + [segment], IndexSpec(), base=snapshot)
        else:
            snapshot = Snapshot(generation, [s for s in snapshot.segments if s.document.name != name], IndexSpec())
        assert_same(snapshot.lexical, BM25Index([e.text for e in snapshot.evidence]))
        page_texts = ["\n".join(snapshot.evidence[row].text for row in page) for page in snapshot.page_rows]
        assert_same(snapshot.page_lexical, BM25Index(page_texts))


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
