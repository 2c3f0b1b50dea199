"""A snapshot's lazy structures (BM25 indexes, graph) are built once, by whichever thread asks first; a serving
knowledge base builds an opened snapshot in the background, and publishes a commit's only once it is built."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from orchestrator.config import Settings
from orchestrator.knowledge.storage import incremental
from orchestrator.knowledge.storage import snapshot as snapshots
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.segments import Segment
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.knowledge.storage.snapshot import Snapshot
from orchestrator.pipeline.plan import QueryOptions, make_plan
from orchestrator.pipeline.retrieval import retrieve
from tests.segment_factory import commit, make_segment

ENTITIES = {"alpha revenue": ["Alpha Corp", "Beta Ltd"]}


def segment(name="a.md", seed=0):
    return make_segment(name, ["alpha revenue", "beta growth", "gamma site"], ENTITIES, dim=4, seed=seed)


def built(snapshot: Snapshot) -> set[str]:
    return {part for part in ("lexical", "page_lexical", "graph", "node_evidence") if part in snapshot.__dict__}


def wait_until(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.02)
    return condition()


def test_threads_asking_at_once_build_the_graph_once(monkeypatch):
    calls = []
    original = snapshots.build_graph

    def slow_build(inputs):
        calls.append(1)
        time.sleep(0.2)
        return original(inputs)

    monkeypatch.setattr(snapshots, "build_graph", slow_build)
    snapshot = Snapshot(1, [segment()], IndexSpec())
    graphs = []
    threads = [threading.Thread(target=lambda: graphs.append(snapshot.graph)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(graphs) == 6 and all(graph is graphs[0] for graph in graphs)


ALL_PARTS = {"lexical", "page_lexical", "graph", "node_evidence"}


def slow_graph_builds(monkeypatch, seconds: float) -> list[int]:
    """Make every graph build take `seconds`; returns the list that counts them."""
    calls = []
    original = snapshots.build_graph

    def slow_build(inputs):
        calls.append(1)
        time.sleep(seconds)
        return original(inputs)

    monkeypatch.setattr(snapshots, "build_graph", slow_build)
    return calls


def test_a_serving_knowledge_base_publishes_a_commit_once_it_is_built(tmp_path, monkeypatch):
    slow_graph_builds(monkeypatch, 0.3)
    collection = KnowledgeBase(tmp_path, warm=True).collection("docs", create=True)
    empty = collection.snapshot
    commit(collection, segment())
    head = collection.head()
    assert head.generation == 1 and "a.md" in head.documents
    assert collection.snapshot is empty  # queries read the previous snapshot while the new one is built
    asyncio.run(collection.visible(1))
    assert collection.snapshot is head and built(head) == ALL_PARTS  # no query on it waits for a build
    reopened = KnowledgeBase(tmp_path, warm=True)
    reopened.preload()  # what a server starts in the background: the opened snapshot is published at once
    snapshot = reopened.collection("docs").snapshot
    assert "a.md" in snapshot.documents
    assert wait_until(lambda: built(snapshot) == ALL_PARTS)
    # tools and read-only readers build nothing ahead and publish each commit at once
    tool = KnowledgeBase(tmp_path).collection("docs")
    commit(tool, segment("b.md", seed=1))
    assert tool.snapshot is tool.head() and "b.md" in tool.snapshot.documents
    time.sleep(0.3)
    assert built(tool.snapshot) == set()


def test_commits_during_a_build_are_published_together(tmp_path, monkeypatch):
    builds = slow_graph_builds(monkeypatch, 0.4)
    collection = KnowledgeBase(tmp_path, warm=True).collection("docs", create=True)
    for number in range(4):
        commit(collection, segment(f"d{number}.md", seed=number))
    assert collection.head().generation == 4
    asyncio.run(collection.visible(4))
    assert set(collection.snapshot.documents) == {"d0.md", "d1.md", "d2.md", "d3.md"}
    assert len(builds) < 4  # the first commit's build, then one for the three that came during it


def test_a_deleted_documents_files_stay_while_the_published_snapshot_reads_them(tmp_path, monkeypatch):
    collection = KnowledgeBase(tmp_path, warm=True).collection("docs", create=True)
    commit(collection, segment("a.md"))
    commit(collection, segment("b.md", seed=1))
    asyncio.run(collection.visible(2))
    folder = collection.snapshot.segments[0].folder
    slow_graph_builds(monkeypatch, 0.4)
    collection.delete("a.md")
    assert collection.snapshot.documents.keys() == {"a.md", "b.md"} and folder.is_dir()  # still read by queries
    asyncio.run(collection.visible(3))
    assert collection.snapshot.documents.keys() == {"b.md"} and wait_until(lambda: not folder.exists())


def test_a_snapshot_whose_build_fails_is_published_unbuilt(tmp_path, monkeypatch, caplog):
    def broken(inputs):
        raise RuntimeError("graph build failed")

    monkeypatch.setattr(snapshots, "build_graph", broken)
    collection = KnowledgeBase(tmp_path, warm=True).collection("docs", create=True)
    commit(collection, segment())
    with caplog.at_level(logging.ERROR):
        asyncio.run(asyncio.wait_for(collection.visible(1), 20))
    assert "a.md" in collection.snapshot.documents and "graph" not in collection.snapshot.__dict__
    assert "building snapshot 1 failed" in caplog.text


def test_a_superseded_snapshot_stops_warming():
    snapshot = Snapshot(1, [segment()], IndexSpec())
    snapshot.warm(current=lambda: False)
    assert built(snapshot) == set()
    answers = iter([True, False])
    snapshot.warm(current=lambda: next(answers, False))
    assert built(snapshot) == {"lexical"}


def test_a_built_snapshot_is_prepared_before_it_is_published(tmp_path):
    knowledge = KnowledgeBase(tmp_path, warm=True)
    prepared = []

    def prepare(snapshot):
        prepared.append((snapshot.generation, built(snapshot), collection.snapshot.generation))

    knowledge.prepare = prepare
    collection = knowledge.collection("docs", create=True)
    commit(collection, segment())
    asyncio.run(asyncio.wait_for(collection.visible(1), 20))
    assert prepared == [(1, ALL_PARTS, 0)]  # built, and queries still read generation 0 while it ran


def test_warming_faults_in_every_segments_stored_vectors(tmp_path, monkeypatch):
    knowledge = KnowledgeBase(tmp_path)
    collection = knowledge.collection("docs", create=True)
    commit(collection, segment("a.md", seed=1))
    commit(collection, segment("b.md", seed=2))
    stored = KnowledgeBase(tmp_path).collection("docs").snapshot  # opened from disk: its vectors are mapped
    before = stored.evidence_vectors(list(range(len(stored.evidence))))
    faulted = []
    monkeypatch.setattr(Segment, "fault_in", lambda self, original=Segment.fault_in: (faulted.append(self.document.name), original(self)))
    stored.warm()
    assert sorted(faulted) == ["a.md", "b.md"]
    assert (stored.evidence_vectors(list(range(len(stored.evidence)))) == before).all()  # read, not changed
    faulted.clear()
    Snapshot(2, [segment()], IndexSpec()).warm(current=lambda: False)
    assert faulted == []  # a superseded snapshot stops before


def test_queries_after_an_opening_go_without_the_graph_until_the_background_build_has_it(tmp_path, monkeypatch):
    commit(KnowledgeBase(tmp_path).collection("docs", create=True), segment())
    builds = slow_graph_builds(monkeypatch, 1.0)
    snapshot = KnowledgeBase(tmp_path, warm=True).collection("docs").snapshot  # opened: built in the background
    plan = make_plan("moderate", QueryOptions(), Settings())  # a route that expands the graph
    vectors = snapshot.evidence_vectors([0])

    started = time.monotonic()
    during = retrieve(snapshot, ["alpha revenue"], vectors, plan, Settings().retrieval)
    assert time.monotonic() - started < 0.5  # did not wait for the graph
    assert during.skipped == ["graph skipped: the collection's graph is still being built"]
    assert "graph" not in during.timings_ms and during.expansion.nodes.size == 0 and during.candidates

    assert wait_until(lambda: not snapshot.building_in_background) and builds == [1]
    after = retrieve(snapshot, ["alpha revenue"], vectors, plan, Settings().retrieval)
    assert after.skipped == [] and "graph" in after.timings_ms and after.entity_seeds
    # a snapshot nobody builds in the background builds its graph for the query that needs it
    fresh = Snapshot(1, snapshot.segments, IndexSpec())
    assert retrieve(fresh, ["alpha revenue"], vectors, plan, Settings().retrieval).skipped == [] and builds == [1, 1]


def test_a_large_collections_graph_is_made_from_the_previous_before_publication_and_built_after_it_otherwise(tmp_path, monkeypatch):
    """publish_before_graph_rows: an appended or deleted document's graph costs about the document (made from the
    previous graph) and is there when the snapshot is published; a graph built from every document (here: the
    removal cannot be done in place) is built after publication, its queries going without it meanwhile."""
    collection = KnowledgeBase(tmp_path, warm=True, publish_before_graph_rows=0).collection("docs", create=True)
    commit(collection, segment("a.md"))
    asyncio.run(asyncio.wait_for(collection.visible(1), 20))
    assert wait_until(lambda: collection.snapshot.built("graph_built"))
    release = threading.Event()
    original = snapshots.build_graph
    monkeypatch.setattr(snapshots, "build_graph", lambda inputs: (release.wait(20), original(inputs))[1])
    plan = make_plan("moderate", QueryOptions(), Settings())  # a route that expands the graph

    def query(snapshot):
        return retrieve(snapshot, ["alpha revenue"], snapshot.evidence_vectors([0]), plan, Settings().retrieval)

    commit(collection, make_segment("b.md", ["delta report", "alpha revenue"], ENTITIES, dim=4, seed=1))
    asyncio.run(asyncio.wait_for(collection.visible(2), 20))  # build_graph waits: the graph was extended
    appended = collection.snapshot
    assert appended.built("graph_built") and appended.graph.carried_from is not None
    assert not appended.building_in_background and query(appended).skipped == []
    commit(collection, make_segment("c.md", ["gamma notes", "alpha revenue"], ENTITIES, dim=4, seed=2))
    asyncio.run(asyncio.wait_for(collection.visible(3), 20))

    collection.delete("b.md")
    asyncio.run(asyncio.wait_for(collection.visible(4), 20))  # build_graph waits: the document was taken out
    deleted = collection.snapshot
    assert deleted.built("graph_built") and deleted.graph.carried_from is not None
    assert not deleted.building_in_background and query(deleted).skipped == []

    monkeypatch.setattr(incremental, "removable", lambda *args: False)  # as where a removal cannot be done in place
    removed = deleted.documents["a.md"].document_id
    collection.delete("a.md")
    asyncio.run(asyncio.wait_for(collection.visible(5), 20))  # published while its graph waits
    rebuilt = collection.snapshot
    assert rebuilt.building_in_background and not rebuilt.built("graph")
    assert rebuilt.graph_view() is None  # the previous graph holds the deleted document: not read
    during = query(rebuilt)
    assert during.skipped == ["graph skipped: the collection's graph is still being built"] and during.candidates
    release.set()
    assert wait_until(lambda: not rebuilt.building_in_background) and rebuilt.graph_view().generation == 5
    assert rebuilt.graph.node_count and all(removed not in documents for documents in rebuilt.graph.nodes.documents)
    assert query(rebuilt).skipped == []


def test_a_small_collections_commit_is_published_with_its_graph(tmp_path):
    collection = KnowledgeBase(tmp_path, warm=True).collection("docs", create=True)  # default: 20,000 rows
    commit(collection, segment("a.md"))
    asyncio.run(asyncio.wait_for(collection.visible(1), 20))
    assert collection.snapshot.built("graph_built") and not collection.snapshot.building_in_background


def test_publications_do_not_queue_behind_graph_builds_and_a_finished_graph_is_lent_to_newer_snapshots(tmp_path, monkeypatch):
    collection = KnowledgeBase(tmp_path, warm=True, publish_before_graph_rows=0).collection("docs", create=True)
    release = threading.Event()
    original = snapshots.build_graph
    monkeypatch.setattr(snapshots, "build_graph", lambda inputs: (release.wait(20), original(inputs))[1])
    commit(collection, segment("a.md"))
    asyncio.run(asyncio.wait_for(collection.visible(1), 20))
    first = collection.snapshot
    commit(collection, segment("b.md", seed=1))  # while the first graph's build waits
    asyncio.run(asyncio.wait_for(collection.visible(2), 5))
    second = collection.snapshot
    assert not first.built("graph") and second.graph_view() is None  # nothing built to expand over yet
    release.set()
    assert wait_until(lambda: second.built("graph_built") and not second.building_in_background)
    assert first.built("graph_built") and second.graph_view().generation == 2
    assert second.graph.carried_from is not None  # lent the first graph, it extended it


def test_a_graph_is_lent_only_to_snapshots_that_extend_its_own_by_appending():
    a, b = segment("a.md"), segment("b.md", seed=1)
    first = Snapshot(1, [a], IndexSpec())
    appended = Snapshot(2, [a, b], IndexSpec(), base=first)
    replaced = Snapshot(3, [b], IndexSpec(), previous=first)
    for snapshot in (appended, replaced):
        snapshot.building_in_background = True
        assert snapshot.graph_view() is None  # the first graph was not built when they were made
    first.warm_graph()
    appended.lend_graph(first)
    replaced.lend_graph(first)
    assert appended.graph_view().graph is first.graph and appended.graph_view().node_evidence.shape[1] == 6
    assert replaced.graph_view() is None


def test_what_queries_derive_from_a_graph_view_is_made_once_per_view():
    a, b = segment("a.md"), segment("b.md", seed=1)
    first = Snapshot(1, [a], IndexSpec())
    first.warm_graph()
    view = first.graph_view()
    made = []
    masks = [view.derived(("hubs", 0.5), lambda: made.append(1) or view.node_evidence.getnnz(axis=1) >= 2) for _ in range(3)]
    assert made == [1] and all(mask is masks[0] for mask in masks) and first.graph_view() is view
    appended = Snapshot(2, [a, b], IndexSpec(), base=first)
    appended.building_in_background = True
    appended.lend_graph(first)
    widened = appended.graph_view()  # the first graph over the rows of both documents: a view of its own
    assert widened is not view and widened.derived(("hubs", 0.5), lambda: "its own") == "its own"
