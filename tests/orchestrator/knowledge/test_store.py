"""Collections on disk: atomic per-document commits, replace and delete without orphans, isolation."""

import numpy as np
import pytest

from orchestrator.errors import InvalidRequestError, NotFoundError
from orchestrator.knowledge.storage.manifest import MANIFEST
from orchestrator.knowledge.storage.registry import KnowledgeBase
from tests.segment_factory import commit, make_segment


def folders(kb, name):
    return sorted(p.name for p in (kb.root / name).iterdir() if p.is_dir())


def test_committed_documents_are_found_and_survive_a_reload(tmp_path):
    kb = KnowledgeBase(tmp_path)
    first = make_segment("a.md", ["alpha one", "alpha two", "alpha three"], seed=1)
    commit(kb.collection("docs", create=True), first)
    commit(kb.collection("docs"), make_segment("b.md", ["beta one"], seed=2))
    reloaded = KnowledgeBase(tmp_path).collection("docs").snapshot
    assert list(reloaded.documents) == ["a.md", "b.md"]
    best, score = reloaded.search_evidence(np.asarray(first.evidence_vectors[1]), k=1)[0]
    assert best.text == "alpha two" and score == pytest.approx(1.0, abs=1e-5)
    assert [e.text for e, _ in reloaded.search_lexical("beta", 5)] == ["beta one"]
    assert len(folders(kb, "docs")) == 2  # one segment per document, nothing else


def test_replace_changes_only_that_document_and_leaves_no_orphans(tmp_path):
    kb = KnowledgeBase(tmp_path)
    docs = kb.collection("docs", create=True)
    commit(docs, make_segment("a.md", ["old text of a"], seed=1))
    commit(docs, make_segment("b.md", ["text of b"], seed=2))
    before_b = docs.snapshot.documents["b.md"]
    replaced = commit(docs, make_segment("a.md", ["new text of a", "more of a"], seed=3))
    assert replaced is not None and replaced.chunks == 1
    snapshot = KnowledgeBase(tmp_path).collection("docs").snapshot
    assert snapshot.documents["b.md"] == before_b
    assert sorted(e.text for e in snapshot.evidence) == ["more of a", "new text of a", "text of b"]
    assert snapshot.evidence_index.size == 3
    assert len(folders(kb, "docs")) == 2


def test_delete_removes_the_segment_and_every_vector(tmp_path):
    kb = KnowledgeBase(tmp_path)
    docs = kb.collection("docs", create=True)
    a = make_segment("a.md", ["shared Acme text"], {"shared Acme text": ["Acme", "Globex"]}, seed=1)
    b = make_segment("b.md", ["Acme again"], {"Acme again": ["Acme", "Initech"]}, seed=2)
    commit(docs, a)
    commit(docs, b)
    assert docs.snapshot.entity_keys == ["acme", "globex", "initech"]
    removed = docs.delete("a.md")
    assert removed.name == "a.md"
    snapshot = KnowledgeBase(tmp_path).collection("docs").snapshot
    assert list(snapshot.documents) == ["b.md"]
    assert [e.text for e in snapshot.evidence] == ["Acme again"]
    assert snapshot.entity_keys == ["acme", "initech"]  # globex was only in a.md; acme is shared
    assert snapshot.entity_index.size == 2 and snapshot.relation_keys == [("acme", "initech")]
    assert folders(kb, "docs") == [b.folder.name]
    with pytest.raises(NotFoundError, match="no document named 'a.md'"):
        docs.delete("a.md")


def test_leftovers_of_interrupted_commits_are_removed_on_open(tmp_path):
    kb = KnowledgeBase(tmp_path)
    docs = kb.collection("docs", create=True)
    commit(docs, make_segment("a.md", ["a"]))
    root = kb.root / "docs"
    (root / ".staging-dead").mkdir()
    (root / "seg-never-committed").mkdir()
    (root / f".{MANIFEST}.abcd").write_text("{")
    snapshot = KnowledgeBase(tmp_path).collection("docs").snapshot
    assert list(snapshot.documents) == ["a.md"]
    assert sorted(p.name for p in root.iterdir()) == sorted([MANIFEST, snapshot.segments[0].folder.name])


def test_collections_do_not_see_each_other(tmp_path):
    kb = KnowledgeBase(tmp_path)
    commit(kb.collection("alpha", create=True), make_segment("a.md", ["a"]))
    commit(kb.collection("beta", create=True), make_segment("b.md", ["b"]))
    assert list(kb.collection("alpha").snapshot.documents) == ["a.md"]
    assert list(kb.collection("beta").snapshot.documents) == ["b.md"]
    assert kb.names() == ["alpha", "beta"]


def test_unknown_and_malformed_collection_names(tmp_path):
    kb = KnowledgeBase(tmp_path)
    with pytest.raises(NotFoundError, match="'missing' does not exist"):
        kb.collection("missing")
    for bad in ("", "../etc", "UPPER", "a" * 65):
        with pytest.raises(InvalidRequestError, match="must match"):
            kb.collection(bad, create=True)


def test_embedding_width_mismatch_is_refused_and_changes_nothing(tmp_path):
    kb = KnowledgeBase(tmp_path)
    docs = kb.collection("docs", create=True)
    commit(docs, make_segment("a.md", ["a"], dim=8))
    with pytest.raises(InvalidRequestError, match="holds 8-d embeddings but the embedder now gives 16-d"):
        commit(docs, make_segment("b.md", ["b"], dim=16))
    assert list(KnowledgeBase(tmp_path).collection("docs").snapshot.documents) == ["a.md"]


def test_a_running_query_keeps_its_snapshot(tmp_path):
    kb = KnowledgeBase(tmp_path)
    docs = kb.collection("docs", create=True)
    commit(docs, make_segment("a.md", ["a1", "a2"]))
    held = docs.snapshot
    commit(docs, make_segment("b.md", ["b1"], seed=5))
    docs.delete("a.md")
    assert [e.text for e in held.evidence] == ["a1", "a2"] and held.evidence_index.size == 2
    assert [e.text for e in docs.snapshot.evidence] == ["b1"]
