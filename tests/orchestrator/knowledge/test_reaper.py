"""Replaced snapshots are emptied on the reaper's thread a slice at a time: what nothing else holds is emptied,
what a newer snapshot shares or a running query holds is left alone, and the published snapshot's answers stay
those of a snapshot made from scratch."""

from __future__ import annotations

import sys
import time
import weakref

import numpy as np
import pytest

from orchestrator.knowledge.storage import incremental, reaper
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.knowledge.storage.snapshot import Snapshot
from tests.segment_factory import commit, make_segment


class Holder:
    pass


def test_dismantle_empties_in_slices_what_holds_its_items_alone_and_leaves_what_others_hold(monkeypatch):
    emptied = []

    def recorded(real):
        def empty(container):
            emptied.append(len(container))
            real(container)

        return empty

    for name in ("_empty_list", "_empty_dict"):
        monkeypatch.setattr(reaper, name, recorded(getattr(reaper, name)))
    shared_list, shared_dict, common = [object()], {"a": object()}, object()
    owner = Holder()
    owner.alone = [object() for _ in range(5001)]  # its items are its alone: emptied in slices
    owner.table = {n: object() for n in range(5002)}
    owner.refs = [common] * 5003  # its items are shared: freeing it is quick, not worth slicing
    owner.shared_list, owner.shared_dict = shared_list, shared_dict  # also held here: left alone
    owner.view = Holder()
    owner.view.graph = owner.graph = Holder()  # held by the view only once the view is gone: a second pass
    owner.graph.nodes = [object() for _ in range(5004)]
    also = owner.kept = Holder()  # held elsewhere: not entered
    also.items = [object()]
    reaper.dismantle(owner, depth=1)
    assert sorted(emptied) == [5001, 5002, 5004] and vars(owner) == {}
    assert len(shared_list) == 1 and len(shared_dict) == 1 and len(also.items) == 1


def wait_until(condition, limit_s: float = 20.0) -> None:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < limit_s, "the reaper did not get to it"
        time.sleep(0.02)


def segment(number: int):
    texts = [f"text {number} {i} about alpha and beta" for i in range(20)]
    return make_segment(f"d{number}.md", texts, {texts[0]: ["Alpha Corp", f"Beta {number}"]}, dim=8, seed=number)


def test_a_replaced_snapshot_is_emptied_once_no_query_holds_it_and_the_new_one_is_intact(tmp_path, monkeypatch):
    """When the new snapshot's graph is built from every document (here: the delete cannot be done in place), the
    replaced one shares nothing with it and goes to the reaper."""
    monkeypatch.setattr(incremental, "removable", lambda *args: False)
    collection = KnowledgeBase(tmp_path, IndexSpec(), warm=True).collection("docs", create=True)
    for number in range(4):
        commit(collection, segment(number))
    wait_until(lambda: collection.snapshot is collection.head() and collection.snapshot.built("graph_built"))
    held = collection.snapshot  # a query still running on it
    merged = weakref.ref(held.graph._merged)
    entities = len(merged().entities)
    freed = reaper.REAPER.freed
    collection.delete("d1.md")  # the new graph is built from every document: nothing shared with the old one
    wait_until(lambda: collection.snapshot is collection.head() and collection.snapshot.built("graph_built"))
    time.sleep(3 * reaper.RETRY_S)
    assert len(merged().entities) == entities and held.graph_view() is not None  # still whole for its query
    assert held.search_evidence(held.evidence_vectors([0]), 3)[0][0].evidence_id == held.evidence[0].evidence_id
    del held
    wait_until(lambda: reaper.REAPER.freed > freed and merged() is None)  # emptied, then freed, once let go
    published = collection.snapshot
    scratch = Snapshot(99, published.segments, IndexSpec())
    assert published.graph.nodes == scratch.graph.nodes and published.entity_keys == scratch.entity_keys
    assert (published.node_evidence != scratch.node_evidence).nnz == 0
    queries = published.evidence_vectors([0, 25, 50])
    assert np.array_equal(published.evidence_index.search(queries, 5)[1], scratch.evidence_index.search(queries, 5)[1])


@pytest.mark.parametrize("change", ["append", "delete"])
def test_taking_apart_a_snapshot_whose_graph_a_newer_one_is_made_from_leaves_what_they_share(tmp_path, change):
    """After an append or a delete the collection frees the replaced snapshot itself (it shares most of its graph
    with the new one, so that is quick); taken apart all the same, the newer graph is untouched."""
    collection = KnowledgeBase(tmp_path, IndexSpec(), warm=True).collection("docs", create=True)
    for number in range(3):
        commit(collection, segment(number))
        wait_until(lambda: collection.snapshot is collection.head() and collection.snapshot.built("graph_built"))
    older = collection.snapshot
    if change == "append":  # its graph extends the published one's, sharing its records
        commit(collection, segment(3))
    else:  # its graph is the published one's less the document's share, sharing the rest
        collection.delete("d1.md")
    wait_until(lambda: collection.snapshot is collection.head() and collection.snapshot.built("graph_built"))
    published = collection.snapshot
    assert published.graph.carried_from is not None and published is not older
    assert sys.getrefcount(older) == 2  # nothing but this test holds it now
    reaper.dismantle(older, reaper.DEPTH)
    assert vars(older) == {}
    scratch = Snapshot(99, published.segments, IndexSpec())
    assert published.graph.nodes == scratch.graph.nodes and published.graph.edges.src.tolist() == scratch.graph.edges.src.tolist()
    assert published.graph.entity_index == scratch.graph.entity_index and published.entity_keys == scratch.entity_keys
    assert (published.node_evidence != scratch.node_evidence).nnz == 0
