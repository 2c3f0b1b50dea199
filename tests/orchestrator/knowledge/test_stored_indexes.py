"""Vector indexes written with each commit and loaded at open; anything missing, stale or corrupt is rebuilt."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.manifest import MANIFEST
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.knowledge.storage.stored_indexes import META, PREFIX
from tests.segment_factory import commit, make_segment, unit_vectors

HNSW = IndexSpec(kind="hnsw", hnsw_neighbors=8, hnsw_ef_search=32)
ENTITIES = {"alpha text 0": ["Alpha Corp", "Beta Ltd"]}


def fill(data_dir, spec=HNSW, documents=2):
    collection = KnowledgeBase(data_dir, spec).collection("docs", create=True)
    for number in range(documents):
        texts = [f"{'alpha' if number == 0 else 'beta'} text {j}" for j in range(40)]
        commit(collection, make_segment(f"doc{number}.md", texts, ENTITIES, dim=16, seed=number))
    return collection


def index_folders(data_dir):
    return sorted((data_dir / "collections" / "docs").glob(f"{PREFIX}*"))


def results(snapshot, queries):
    return [table.search(queries, 5) for table in (snapshot.evidence_index, snapshot.entity_index, snapshot.relation_index)]


def same(a, b):
    return all(np.array_equal(x[1], y[1]) and np.allclose(x[0], y[0]) for x, y in zip(a, b))


def test_a_restart_loads_the_indexes_its_last_commit_wrote(tmp_path, caplog):
    written = fill(tmp_path).snapshot
    (folder,) = index_folders(tmp_path)  # the first commit's folder was replaced by the second's
    meta = json.loads((folder / META).read_text())
    manifest = json.loads((tmp_path / "collections" / "docs" / MANIFEST).read_text())
    assert meta["segments"] == [entry["segment"] for entry in manifest["documents"]] and meta["generation"] == 2
    assert meta["tables"]["evidence"]["size"] == 80 and meta["tables"]["evidence"]["kind"] == "hnsw"

    with caplog.at_level(logging.INFO, logger="thinkserve.knowledge"):
        reopened = KnowledgeBase(tmp_path, HNSW).collection("docs").snapshot
    assert f"vector indexes loaded from {folder.name}: evidence, entity, relation" in caplog.text
    assert "built from" not in caplog.text
    queries = unit_vectors(3, 16, seed=99)
    assert same(results(reopened, queries), results(written, queries))
    assert reopened.evidence_index.kind == "hnsw" and reopened.evidence_index._index.hnsw.efSearch == 32
    assert index_folders(tmp_path) == [folder]  # opening kept it


def test_flat_indexes_are_not_written(tmp_path):
    fill(tmp_path, IndexSpec())
    fill(tmp_path / "ivf", IndexSpec(kind="ivf"))  # below ivf_min_vectors an IVF is Flat
    assert index_folders(tmp_path) == [] and index_folders(tmp_path / "ivf") == []


def test_a_truncated_index_file_is_rebuilt_with_a_log_line_and_nothing_lost(tmp_path, caplog):
    written = fill(tmp_path).snapshot
    (folder,) = index_folders(tmp_path)
    evidence = folder / "evidence.faiss"
    evidence.write_bytes(evidence.read_bytes()[:1000])
    with caplog.at_level(logging.INFO, logger="thinkserve.knowledge"):
        reopened = KnowledgeBase(tmp_path, HNSW).collection("docs").snapshot
    assert "vector indexes built from the documents: evidence (" in caplog.text
    assert f"{folder.name}/evidence.faiss is not usable: 1000 bytes where" in caplog.text
    assert len(reopened.evidence) == 80 and reopened.evidence_index.size == 80
    queries = unit_vectors(3, 16, seed=5)
    assert same(results(reopened, queries)[1:], results(written, queries)[1:])  # the entity index was loaded
    (rewritten,) = index_folders(tmp_path)  # written again, so the next start loads it
    assert rewritten != folder
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="thinkserve.knowledge"):
        KnowledgeBase(tmp_path, HNSW).collection("docs").snapshot
    assert "built from" not in caplog.text and f"loaded from {rewritten.name}: evidence, entity, relation" in caplog.text


def test_a_corrupt_file_of_the_right_length_is_rebuilt(tmp_path, caplog):
    fill(tmp_path)
    (folder,) = index_folders(tmp_path)
    evidence = folder / "evidence.faiss"
    evidence.write_bytes(b"\0" * evidence.stat().st_size)
    with caplog.at_level(logging.WARNING, logger="thinkserve.knowledge"):
        reopened = KnowledgeBase(tmp_path, HNSW).collection("docs").snapshot
    assert "evidence.faiss is not usable" in caplog.text and reopened.evidence_index.size == 80


@pytest.mark.parametrize("change", ["manifest", "settings"])
def test_indexes_of_another_manifest_or_other_settings_are_not_used(tmp_path, caplog, change):
    fill(tmp_path)
    root = tmp_path / "collections" / "docs"
    spec = HNSW
    if change == "manifest":  # as if the process died between the manifest switch and the index write
        manifest = json.loads((root / MANIFEST).read_text())
        manifest["documents"] = manifest["documents"][:1]
        (root / MANIFEST).write_text(json.dumps(manifest))
        expected = "no stored indexes were written for this manifest's 1 documents"
    else:
        spec = IndexSpec(kind="hnsw", hnsw_neighbors=16, hnsw_ef_search=32)
        expected = "was built with other index settings"
    with caplog.at_level(logging.WARNING, logger="thinkserve.knowledge"):
        reopened = KnowledgeBase(tmp_path, spec).collection("docs").snapshot
    assert expected in caplog.text and "vector indexes built from the documents: evidence, entity, relation" in caplog.text
    assert reopened.evidence_index.size == len(reopened.evidence) == (40 if change == "manifest" else 80)
    (folder,) = index_folders(tmp_path)  # the stale folder is gone, the rebuilt indexes written
    assert json.loads((folder / META).read_text())["segments"] == [s.folder.name for s in reopened.segments]


def test_a_read_only_reader_loads_but_never_writes_or_removes(tmp_path, caplog):
    fill(tmp_path)
    (folder,) = index_folders(tmp_path)
    (folder / "entity.faiss").unlink()
    reader = KnowledgeBase(tmp_path, HNSW, read_only=True).collection("docs").snapshot
    assert reader.entity_index.size == 2 and index_folders(tmp_path) == [folder]


def test_indexes_are_written_once_enough_vectors_were_appended_and_a_restart_adds_the_rest(tmp_path, caplog):
    collection = KnowledgeBase(tmp_path, HNSW, index_write_vectors=100).collection("docs", create=True)

    def add(number):
        texts = [f"{'alpha' if number == 0 else 'beta'} text {j}" for j in range(40)]
        commit(collection, make_segment(f"doc{number}.md", texts, ENTITIES, dim=16, seed=number, content=str(number)))

    add(0), add(1)
    assert index_folders(tmp_path) == []  # 80 vectors appended: below 100, nothing written
    add(2)
    (folder,) = index_folders(tmp_path)  # 120: written, holding the three documents
    held = json.loads((folder / META).read_text())["segments"]
    add(3)
    assert index_folders(tmp_path) == [folder]  # 40 appended since: not written again
    names = [s.folder.name for s in collection.head().segments]
    assert held == names[:3]

    with caplog.at_level(logging.INFO, logger="thinkserve.knowledge"):
        reopened = KnowledgeBase(tmp_path, HNSW, index_write_vectors=100).collection("docs").snapshot
    assert (f"vector indexes loaded from {folder.name}: evidence, entity, relation (the vectors of the 1 documents "
            "appended since added to them)") in caplog.text and "built from" not in caplog.text
    assert reopened.evidence_index.size == len(reopened.evidence) == 160 and reopened.evidence_index.kind == "hnsw"
    queries = unit_vectors(4, 16, seed=7)
    assert same(results(reopened, queries), results(collection.head(), queries))
    assert index_folders(tmp_path) == [folder]  # the restart wrote nothing: 40 vectors appended since

    collection.delete("doc0.md")  # the stored indexes hold a document that is gone: written at once
    (rewritten,) = index_folders(tmp_path)
    assert rewritten != folder and json.loads((rewritten / META).read_text())["segments"] == names[1:]


def test_a_replica_adds_what_was_appended_since_the_stored_indexes_to_them(tmp_path):
    collection = KnowledgeBase(tmp_path, HNSW, index_write_vectors=60).collection("docs", create=True)
    for number in range(3):  # the indexes are written at the second commit (80 vectors) and not at the third
        commit(collection, make_segment(f"doc{number}.md", [f"text {j} of {number}" for j in range(40)], dim=16, seed=number))
    (folder,) = index_folders(tmp_path)
    assert len(json.loads((folder / META).read_text())["segments"]) == 2
    replica = KnowledgeBase(tmp_path, HNSW, read_only=True).collection("docs").snapshot
    queries = unit_vectors(4, 16, seed=3)
    assert replica.evidence_index.size == 120 and same(results(replica, queries), results(collection.head(), queries))


def test_a_delete_writes_the_indexes_with_the_removed_ids_and_a_restart_loads_them(tmp_path, caplog):
    """Deleting a document does not rebuild the HNSW index: its vectors stay in it, skipped, and are written so
    (`<table>.removed.npy`); a restart loads that index instead of building one, with the same answers."""
    fill(tmp_path, documents=4)
    collection = KnowledgeBase(tmp_path, HNSW).collection("docs")  # one index of all four (none in a tail)
    before = collection.snapshot.evidence_index
    collection.delete("doc1.md")
    after = collection.snapshot
    assert after.evidence_index._index is before._index and after.evidence_index.size == 120  # shared, 40 skipped
    (folder,) = index_folders(tmp_path)
    meta = json.loads((folder / META).read_text())
    assert meta["tables"]["evidence"]["removed"] == 40 and meta["tables"]["evidence"]["size"] == 120
    assert np.array_equal(np.load(folder / "evidence.removed.npy"), np.arange(40, 80))
    with caplog.at_level(logging.INFO, logger="thinkserve.knowledge"):
        reopened = KnowledgeBase(tmp_path, HNSW).collection("docs").snapshot
    assert f"vector indexes loaded from {folder.name}" in caplog.text and "built from" not in caplog.text
    queries = unit_vectors(3, 16, seed=98)
    assert same(results(reopened, queries), results(after, queries))
    (folder / "evidence.removed.npy").write_bytes(b"\x93NUMPY broken")  # a damaged list: that table is rebuilt
    with caplog.at_level(logging.WARNING, logger="thinkserve.knowledge"):
        rebuilt = KnowledgeBase(tmp_path, HNSW).collection("docs").snapshot
    assert "evidence.faiss is not usable" in caplog.text and rebuilt.evidence_index.size == 120
    assert same(results(rebuilt, queries)[:1], results(after, queries)[:1])
