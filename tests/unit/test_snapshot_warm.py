"""A snapshot's lazy structures (BM25 indexes, graph) are built once, by whichever thread asks first, and a
serving knowledge base builds them in the background after each commit and open."""

from __future__ import annotations

import threading
import time

from orchestrator.knowledge import store
from orchestrator.knowledge.indexes import IndexSpec
from orchestrator.knowledge.store import KnowledgeBase, Snapshot
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
    original = store.build_graph

    def slow_build(inputs):
        calls.append(1)
        time.sleep(0.2)
        return original(inputs)

    monkeypatch.setattr(store, "build_graph", slow_build)
    snapshot = Snapshot(1, [segment()], IndexSpec())
    graphs = []
    threads = [threading.Thread(target=lambda: graphs.append(snapshot.graph)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(graphs) == 6 and all(graph is graphs[0] for graph in graphs)


def test_a_serving_knowledge_base_warms_each_new_snapshot_in_the_background(tmp_path):
    collection = KnowledgeBase(tmp_path, warm=True).collection("docs", create=True)
    commit(collection, segment())
    first = collection.snapshot
    assert wait_until(lambda: built(first) == {"lexical", "page_lexical", "graph", "node_evidence"})
    reopened = KnowledgeBase(tmp_path, warm=True)
    reopened.preload()  # what a server starts in the background
    snapshot = reopened.collection("docs").snapshot
    assert wait_until(lambda: built(snapshot) == {"lexical", "page_lexical", "graph", "node_evidence"})
    # tools and read-only readers do not
    cold = KnowledgeBase(tmp_path).collection("docs").snapshot
    time.sleep(0.3)
    assert built(cold) == set()


def test_a_superseded_snapshot_stops_warming():
    snapshot = Snapshot(1, [segment()], IndexSpec())
    snapshot.warm(current=lambda: False)
    assert built(snapshot) == set()
    answers = iter([True, False])
    snapshot.warm(current=lambda: next(answers, False))
    assert built(snapshot) == {"lexical"}
