"""One writer per data folder, any number of read replicas: the writer's lock (released however its process
ends), and replicas that follow the writer's commits, deletes and collection changes without writing a byte."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from orchestrator.errors import DataFolderLockedError, ReadOnlyError
from orchestrator.knowledge.storage import writer_lock
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.registry import KnowledgeBase
from tests.conftest import ROOT
from tests.segment_factory import commit, make_segment

HOLDER = r"""
import sys, pathlib, time
from orchestrator.knowledge.storage.registry import KnowledgeBase
kb = KnowledgeBase(pathlib.Path(sys.argv[1]))
print("holding", flush=True)
time.sleep(600)
"""


def document(name: str, version: int = 0):
    return make_segment(name, [f"{name} version {version} passage {j}" for j in range(6)], dim=8, seed=version * 31 + len(name))


@pytest.fixture
def folder(tmp_path):
    """A writer of tmp_path and a replica of it, closed after the test."""
    writer, reader = KnowledgeBase(tmp_path), KnowledgeBase(tmp_path, read_only=True)
    yield writer, reader
    writer.close()
    reader.close()


def eventually(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.02)


def files_of(folder) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def test_a_second_writer_is_refused_naming_the_holder_until_the_holder_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(DataFolderLockedError) as refused:
            KnowledgeBase(tmp_path)
        assert f"process {holder.pid} on " in str(refused.value)
        assert "--read-only" in str(refused.value)
        assert writer_lock.holder(tmp_path)["pid"] == holder.pid
        KnowledgeBase(tmp_path, read_only=True).close()  # a replica takes no lock
        holder.send_signal(signal.SIGKILL)  # no orderly release: the kernel drops the lock with the process
        holder.wait(30)
        taken = KnowledgeBase(tmp_path)
        assert writer_lock.holder(tmp_path)["pid"] == os.getpid()
        taken.close()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_one_process_may_open_its_folder_twice_and_releases_it_with_the_last(tmp_path):
    first, second = KnowledgeBase(tmp_path), KnowledgeBase(tmp_path)
    first.close()
    probe = [sys.executable, "-c", "import sys, pathlib; from orchestrator.knowledge.storage.registry import KnowledgeBase; "
             "KnowledgeBase(pathlib.Path(sys.argv[1]))", str(tmp_path)]
    def run():
        return subprocess.run(probe, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})

    assert "DataFolderLockedError" in run().stderr  # the second still holds it
    second.close()
    assert run().returncode == 0


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_a_replica_follows_adds_replaces_and_deletes_and_never_writes(tmp_path, kind, caplog):
    spec = IndexSpec(kind=kind, hnsw_neighbors=8)
    writer = KnowledgeBase(tmp_path, spec)
    docs = writer.collection("docs", create=True)
    commit(docs, document("a.md"))
    reader = KnowledgeBase(tmp_path, spec, read_only=True)
    followed = reader.collection("docs")
    assert list(followed.snapshot.documents) == ["a.md"]
    assert not followed.follow()  # nothing new

    commit(docs, document("b.md"))  # appended: the replica extends what it has
    first = followed.snapshot
    assert followed.follow()
    assert list(followed.snapshot.documents) == ["a.md", "b.md"]
    assert followed.snapshot.segments[0] is first.segments[0]  # segments it had are not read again
    commit(docs, document("a.md", version=1))  # replaced: read with the writer's stored indexes
    docs.delete("b.md")
    before = files_of(tmp_path)
    caplog.set_level(logging.INFO, "thinkserve.knowledge")
    assert followed.follow()
    assert "built from the documents" not in caplog.text  # HNSW: the writer's stored indexes were read
    assert ("loaded from indexes-" in caplog.text) == (kind == "hnsw")
    snapshot = followed.snapshot
    assert snapshot.generation == docs.head().generation
    assert list(snapshot.documents) == ["a.md"] and "version 1" in snapshot.evidence[0].text
    vector = np.asarray(snapshot.evidence_vectors([0]))
    assert snapshot.search_evidence(vector, 1)[0][0].evidence_id == snapshot.evidence[0].evidence_id
    assert snapshot.evidence_index.size == len(snapshot.evidence) == 6
    assert files_of(tmp_path) == before, "the replica changed the folder"

    with pytest.raises(ReadOnlyError):
        followed.staging_folder()
    with pytest.raises(ReadOnlyError):
        followed.delete("a.md")
    with pytest.raises(ReadOnlyError):
        reader.delete("docs")
    with pytest.raises(ReadOnlyError):
        reader.create("other")
    assert files_of(tmp_path) == before
    writer.close()
    reader.close()


def test_the_following_thread_forgets_a_deleted_collection_and_finds_it_made_again(folder):
    writer, reader = folder
    commit(writer.collection("docs", create=True), document("a.md"))
    assert list(reader.collection("docs").snapshot.documents) == ["a.md"]
    reader.follow(0.05)
    commit(writer.collection("docs"), document("b.md"))
    eventually(lambda: len(reader.collection("docs").snapshot.documents) == 2)
    assert list(reader.collection("docs").snapshot.documents) == ["a.md", "b.md"]

    writer.delete("docs")
    eventually(lambda: "docs" not in reader._collections)
    assert reader.names() == []
    commit(writer.collection("docs", create=True), document("c.md"))  # generation 1 again, another folder
    assert list(reader.collection("docs").snapshot.documents) == ["c.md"]


def test_a_dropped_segment_stays_readable_for_the_retention_time(folder):
    writer, reader = folder
    writer.retain_dropped_s = 3600  # for the collections it opens from now on
    docs = writer.collection("docs", create=True)
    commit(docs, document("a.md"))
    served = reader.collection("docs").snapshot  # a replica still serving this generation
    docs.delete("a.md")
    commit(docs, document("b.md"))
    assert served.asset_file(f"{served.evidence[0].document_id}/assets/note.txt") is not None  # still on disk
    docs.retain_dropped_s = 0  # past the retention: the next clean-up removes it
    commit(docs, document("c.md"))
    assert served.asset_file(f"{served.evidence[0].document_id}/assets/note.txt") is None


def test_a_collection_made_again_at_the_same_generation_is_followed(folder):
    writer, reader = folder
    commit(writer.collection("docs", create=True), document("a.md"))
    followed = reader.collection("docs")
    generation = followed.snapshot.generation
    writer.delete("docs")
    commit(writer.collection("docs", create=True), document("c.md"))  # between two steps of the replica
    assert writer.collection("docs").head().generation == generation
    assert followed.follow()
    assert list(followed.snapshot.documents) == ["c.md"]
