"""A built snapshot's objects are kept out of the garbage collector's walks (knowledge/collector.py), and the
query path makes no reference cycles that freezing would keep for good."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest

from orchestrator.knowledge.collector import building_long_lived
from orchestrator.knowledge.graph.merge import build_graph
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.knowledge.storage.snapshot import Snapshot
from orchestrator.pipeline.plan import QueryOptions
from orchestrator.pipeline.query import QueryInput
from tests.segment_factory import commit, make_segment
from tests.orchestrator.pipeline.test_recorded_answers import COLLECTION, SHAPE, InstantModels, SyntheticCorpus, _pipeline


def tracked(obj) -> bool:
    """Whether obj is in one of the collector's generations (walked by its collections), not frozen."""
    return any(candidate is obj for candidate in gc.get_objects())


@pytest.fixture
def collector_restored():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()  # what this test froze goes back to the collector
    (gc.enable if enabled else gc.disable)()


def test_what_is_built_long_lived_is_frozen_and_the_collector_runs_again(collector_restored):
    gc.enable()
    with building_long_lived():
        assert not gc.isenabled()  # paused while building
        built = [[number] for number in range(1000)]
    assert gc.isenabled() and not tracked(built) and not tracked(built[0])
    gc.disable()
    with building_long_lived():
        also = [[1]]
    assert not gc.isenabled() and not tracked(also)  # a collector someone else paused stays paused


def test_a_warmed_snapshot_and_its_graph_are_out_of_the_collections(collector_restored):
    texts = ["alpha revenue report", "beta growth plan", "gamma factory site"]
    snapshot = Snapshot(1, [make_segment("a.md", texts, {texts[0]: ["Alpha Corp", "Beta Ltd"]}, dim=4)], IndexSpec())
    assert tracked(snapshot.evidence[0])
    snapshot.warm()
    assert not tracked(snapshot) and not tracked(snapshot.evidence[0]) and not tracked(snapshot.graph)
    graph = build_graph([])  # a graph build on its own (a commit's, published before its graph)
    assert not tracked(graph)


def test_queries_leave_no_reference_cycles(tmp_path):
    """Cycles made per query would be kept for good by the next freeze (each commit makes one): every route's
    query must leave its objects to reference counting."""
    models = InstantModels(SHAPE.dimension)
    pipeline = _pipeline(tmp_path, models)
    questions = SyntheticCorpus(SHAPE).questions(6)

    async def ask_all() -> None:
        for question in questions:
            models.question = question
            for route in ("simple", "moderate", "complex"):
                async for _ in pipeline.run(QueryInput(COLLECTION, question.text, QueryOptions(route=route)), time.monotonic() + 60):
                    pass

    try:
        pipeline.warm_up()
        asyncio.run(ask_all())  # the first queries make what lives on (caches, pools' threads)
        enabled = gc.isenabled()
        gc.disable()
        try:
            gc.collect()
            asyncio.run(ask_all())
            time.sleep(0.1)  # the pools' last callbacks
            assert gc.collect() == 0
        finally:
            if enabled:
                gc.enable()
    finally:
        pipeline.close()


def test_every_replaced_snapshot_is_freed_by_reference_counting(tmp_path):
    """Appends, a replacement and a delete, each published, warmed and retrieved from (so frozen, as a server's are),
    by the writer and by a replica following it: with the collector off, every snapshot they replaced is freed. A reference cycle through one would keep it, and
    all it holds, for good once frozen: a collection's worth of memory per commit."""
    enabled = gc.isenabled()
    gc.disable()
    knowledge = KnowledgeBase(tmp_path, IndexSpec(), warm=True)
    replica = KnowledgeBase(tmp_path, IndexSpec(), read_only=True, warm=True)  # follows the writer (follow())
    try:
        docs = knowledge.collection("docs", create=True)
        exercised = []
        knowledge.prepare = replica.prepare = exercised.append  # a server's pipeline retrieves from each new snapshot here
        replaced = []

        def step(change, generation: int) -> None:
            replaced.append(weakref.ref(docs.snapshot))
            if generation > 1:
                replaced.append(weakref.ref(replica.collection("docs").snapshot))
            change()
            deadline = time.monotonic() + 30
            while docs.snapshot.generation < generation or not docs.snapshot.graph_built:
                assert time.monotonic() < deadline, "the commit was not published and built"
                time.sleep(0.01)
            assert replica.collection("docs").follow() or generation == 1  # warmed (frozen) and published

        def document(name: str, version: int = 0):
            texts = [f"{name} version {version} passage {j} about Alpha Corp" for j in range(5)]
            return make_segment(name, texts, {texts[0]: ["Alpha Corp", f"{name} Ltd"]}, dim=8, seed=version * 7 + len(name))

        step(lambda: commit(docs, document("a.md")), 1)
        step(lambda: commit(docs, document("b.md")), 2)  # appended: the new graph extends the old
        step(lambda: commit(docs, document("a.md", version=1)), 3)  # replaced: built from every document
        step(lambda: docs.delete("b.md"), 4)
        step(lambda: commit(docs, document("c.md")), 5)
        assert not tracked(docs.snapshot) and not tracked(replica.collection("docs").snapshot)  # published ones are frozen
        exercised.clear()
        deadline = time.monotonic() + 30  # the reaper empties some of them on its own thread
        while any(ref() is not None for ref in replaced) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [ref() is None for ref in replaced] == [True] * 9
    finally:
        knowledge.close()
        replica.close()
        gc.unfreeze()
        if enabled:
            gc.enable()
