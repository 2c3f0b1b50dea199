"""A snapshot that appends documents extends its base's entity and relation tables and vector indexes instead of
rereading every document: after any sequence of appends they equal a snapshot made from scratch, including an
entity whose first vector comes from a later document (ingest.entity_min_mentions leaves zeros before)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings, strategies as st

from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.segments import PageRecord
from orchestrator.knowledge.storage.snapshot import Snapshot
from tests.segment_factory import make_segment

NAMES = ["Alpha", "Beta", "Gamma", "Delta", "Epsilon"]

documents = st.lists(
    st.tuples(st.lists(st.lists(st.sampled_from(NAMES), max_size=3, unique=True), min_size=1, max_size=3),
              st.lists(st.booleans(), min_size=5, max_size=5)),
    min_size=1, max_size=6,
)


def segment(number: int, names_per_text: list[list[str]], embedded: list[bool]):
    texts = [f"text {number} {i}" for i in range(len(names_per_text))]
    made = make_segment(f"d{number}.md", texts, dict(zip(texts, names_per_text)), dim=4, seed=number)
    vectors = np.asarray(made.entity_vectors).copy()
    for row in range(len(vectors)):
        if not embedded[row % len(embedded)]:
            vectors[row] = 0  # an entity named too rarely here to get a vector
    return dataclasses.replace(made, entity_vectors=vectors)


@settings(max_examples=60, deadline=None)
@given(documents)
def test_appended_snapshots_equal_snapshots_made_from_scratch(steps):
    segments = [segment(number, names, embedded) for number, (names, embedded) in enumerate(steps)]
    snapshot = Snapshot(1, segments[:1], IndexSpec())
    for count in range(2, len(segments) + 1):
        snapshot = Snapshot(count, segments[:count], IndexSpec(), base=snapshot)
    scratch = Snapshot(99, segments, IndexSpec())
    assert snapshot.entity_keys == scratch.entity_keys and snapshot.relation_keys == scratch.relation_keys
    for table in ("entity", "relation", "evidence"):
        assert np.array_equal(snapshot.vector_tables[table].vectors(), scratch.vector_tables[table].vectors()), table


@settings(max_examples=60, deadline=None)
@given(documents, st.lists(st.booleans(), min_size=6, max_size=6))
def test_appended_graphs_and_node_tables_equal_those_made_from_scratch(steps, built):
    """Each snapshot's graph, evidence rows and node x evidence table extend the previous snapshot's (or, when
    that one was never built, the newest built before it)."""
    segments = [segment(number, names, embedded) for number, (names, embedded) in enumerate(steps)]
    snapshot = Snapshot(1, segments[:1], IndexSpec())
    earlier = False  # whether an earlier snapshot built its graph
    for count in range(1, len(segments) + 1):
        if count > 1:
            snapshot = Snapshot(count, segments[:count], IndexSpec(), base=snapshot)
        if built[count - 1] or count == len(segments):
            scratch = Snapshot(99, segments[:count], IndexSpec())
            assert (snapshot.graph.carried_from is not None) == earlier  # extended, not rebuilt
            earlier = True
            assert snapshot.graph.nodes == scratch.graph.nodes and snapshot.graph.entity_index == scratch.graph.entity_index
            assert snapshot.evidence_rows == scratch.evidence_rows
            assert (snapshot.node_evidence != scratch.node_evidence).nnz == 0
            assert snapshot.node_evidence.shape == scratch.node_evidence.shape
            assert np.array_equal(snapshot.nodes_per_evidence, scratch.nodes_per_evidence)


operations = st.lists(st.tuples(st.sampled_from(["add", "delete", "replace"]), st.integers(0, 10)), min_size=1, max_size=8)


def with_pages(made, number: int):
    """The segment with two page images, embedded by one encoder family."""
    vectors = np.random.default_rng(1000 + number).normal(size=(2, 4)).astype(np.float32)
    pages = [PageRecord(made.document.document_id, page, f"pages/page-{page:04d}.jpg") for page in range(2)]
    return dataclasses.replace(made, pages=pages, page_vectors={"clip": vectors / np.linalg.norm(vectors, axis=1, keepdims=True)})


@settings(max_examples=60, deadline=None)
@given(documents, operations, st.lists(st.booleans(), min_size=8, max_size=8))
def test_snapshots_after_deletes_and_replacements_equal_snapshots_made_from_scratch(steps, ops, built):
    """As a collection chains them (a delete: previous; a replacement: base), whatever the order of adds, deletes
    and replacements, and whichever snapshots built their graph: the vector indexes less the removed documents'
    rows equal indexes built from what is left, and so do the graph, evidence rows and node x evidence table
    made from the newest built ones."""
    made = iter(with_pages(segment(number, names, embedded), number) for number, (names, embedded) in enumerate(steps * 3))
    snapshot = Snapshot(1, [next(made)], IndexSpec())
    queries = np.random.default_rng(7).normal(size=(3, 4)).astype(np.float32)
    for generation, (operation, pick) in enumerate(ops, start=2):
        current = list(snapshot.segments)
        new = next(made, None)
        if operation == "add" and new is not None:
            snapshot = Snapshot(generation, current + [new], IndexSpec(), base=snapshot)
        elif operation == "delete" and len(current) > 1:
            snapshot = Snapshot(generation, current[: pick % len(current)] + current[pick % len(current) + 1 :], IndexSpec(),
                                previous=snapshot)
        elif operation == "replace" and new is not None:
            kept = current[: pick % len(current)] + current[pick % len(current) + 1 :]
            snapshot = Snapshot(generation, kept + [new], IndexSpec(), base=snapshot)
        else:
            continue
        scratch = Snapshot(99, snapshot.segments, IndexSpec())
        assert snapshot.entity_keys == scratch.entity_keys and snapshot.relation_keys == scratch.relation_keys
        if built[generation - 2]:
            graph, expected = snapshot.graph, scratch.graph
            assert (graph.nodes, graph.entity_index, graph.unit_index) == (expected.nodes, expected.entity_index, expected.unit_index)
            assert graph.edges.src.tolist() == expected.edges.src.tolist() and graph.edges.documents == expected.edges.documents
            assert (graph.adjacency != expected.adjacency).nnz == 0
            assert snapshot.evidence_rows == scratch.evidence_rows
            assert snapshot.node_evidence.shape == scratch.node_evidence.shape
            assert (snapshot.node_evidence != scratch.node_evidence).nnz == 0
        for table, index in scratch.vector_tables.items():
            mine = snapshot.vector_tables[table]
            assert np.array_equal(mine.vectors(), index.vectors()), table
            if index.size:  # rows too where no ties are expected (entities without a vector have zeros)
                (scores, rows), (expected_scores, expected_rows) = mine.search(queries, 5), index.search(queries, 5)
                assert np.allclose(scores, expected_scores, atol=1e-6), table
                assert table not in ("evidence", "page-clip") or np.array_equal(rows, expected_rows), table
