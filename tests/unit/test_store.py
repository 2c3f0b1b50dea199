"""Collections on disk: atomic commits, search, isolation, and refusals that leave stored data untouched."""

import numpy as np
import pytest

from orchestrator.errors import InvalidRequestError, NotFoundError
from orchestrator.knowledge.store import KnowledgeBase, PassageRecord, new_document


def vectors(n, dim=8, seed=0):
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def add(kb, collection, doc_id, n, dim=8, seed=0):
    records = [PassageRecord(f"{doc_id}:{i}", doc_id, f"{doc_id}.md", "", i, f"text {doc_id} {i}") for i in range(n)]
    target = kb.collection(collection, create=True)
    embeddings = vectors(n, dim, seed)
    target.commit_document(new_document(doc_id, f"{doc_id}.md", "text/markdown", n), records, embeddings)
    return embeddings


def test_committed_documents_are_found_and_survive_a_reload(tmp_path):
    kb = KnowledgeBase(tmp_path)
    first = add(kb, "alpha", "d1", 3, seed=1)
    add(kb, "alpha", "d2", 2, seed=2)
    reloaded = KnowledgeBase(tmp_path).collection("alpha").snapshot
    assert set(reloaded.documents) == {"d1", "d2"}
    best, score = reloaded.search(first[1], k=1)[0]
    assert best.passage_id == "d1:1" and score == pytest.approx(1.0, abs=1e-5)
    assert len(list((tmp_path / "collections" / "alpha").glob("snap-*"))) == 1  # old snapshots removed


def test_collections_do_not_see_each_other(tmp_path):
    kb = KnowledgeBase(tmp_path)
    add(kb, "alpha", "d1", 2)
    add(kb, "beta", "d2", 2)
    assert set(kb.collection("alpha").snapshot.documents) == {"d1"}
    assert set(kb.collection("beta").snapshot.documents) == {"d2"}
    assert kb.names() == ["alpha", "beta"]


def test_unknown_and_malformed_collection_names(tmp_path):
    kb = KnowledgeBase(tmp_path)
    with pytest.raises(NotFoundError, match="'missing' does not exist"):
        kb.collection("missing")
    for bad in ("", "../etc", "UPPER", "a" * 65):
        with pytest.raises(InvalidRequestError, match="must match"):
            kb.collection(bad, create=True)


def test_a_collection_whose_first_ingest_failed_still_does_not_exist(tmp_path):
    kb = KnowledgeBase(tmp_path)
    kb.collection("fresh", create=True)  # an ingest started, then failed before its commit
    with pytest.raises(NotFoundError):
        kb.collection("fresh")
    assert kb.names() == []


def test_a_commit_that_fails_midway_leaves_the_previous_snapshot(tmp_path, monkeypatch):
    kb = KnowledgeBase(tmp_path)
    add(kb, "alpha", "d1", 2)
    import faiss

    def broken_write(index, path):
        raise OSError("disk full")

    monkeypatch.setattr(faiss, "write_index", broken_write)
    with pytest.raises(OSError, match="disk full"):
        add(kb, "alpha", "d2", 2)
    monkeypatch.undo()
    fresh = KnowledgeBase(tmp_path).collection("alpha").snapshot
    assert set(fresh.documents) == {"d1"} and len(fresh.passages) == 2
    assert not list((tmp_path / "collections" / "alpha").glob(".snap-*"))  # scratch removed


def test_embeddings_of_another_width_are_refused_without_touching_the_collection(tmp_path):
    kb = KnowledgeBase(tmp_path)
    add(kb, "alpha", "d1", 2, dim=8)
    with pytest.raises(InvalidRequestError, match="8-d embeddings but the embedder now gives 16-d"):
        add(kb, "alpha", "d2", 2, dim=16)
    assert set(KnowledgeBase(tmp_path).collection("alpha").snapshot.documents) == {"d1"}
