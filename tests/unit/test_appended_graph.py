"""Appending documents to a graph merges only theirs: after any sequence of appends the graph equals one built
from scratch over the same documents, table for table, and every older graph is left as it was."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import given, settings, strategies as st

from orchestrator.knowledge.graph import DocumentGraph, KnowledgeGraph, MultimodalUnit, appended_graph, build_graph
from orchestrator.knowledge.segments import EntityMention, RelationMention

KEYS = ["alpha", "beta", "gamma", "delta", ""]
NAMES = ["Alpha", "ALPHA", "Beta", ""]
TYPES = ["organization", "concept", "location"]

mentions = st.builds(EntityMention, st.sampled_from(KEYS), st.sampled_from(NAMES), st.sampled_from(TYPES),
                     st.sampled_from(["", "a description", "another"]), st.sampled_from(["c0", "c1", "u0"]))
relations = st.builds(RelationMention, st.sampled_from(KEYS), st.sampled_from(KEYS + ["ghost"]),
                      st.sampled_from(["", "works with"]), st.sampled_from(["", "a, b", "b"]),
                      st.sampled_from([1.0, 2.5, float("nan"), -1.0]), st.sampled_from(["c0", "c1"]))
documents = st.lists(
    st.tuples(st.lists(mentions, max_size=6), st.lists(relations, max_size=5), st.booleans(),
              st.lists(st.tuples(st.sampled_from(KEYS + ["linked only"]), st.sampled_from(["u0", "u9"])), max_size=2)),
    min_size=1, max_size=5,
)


def document(number: int, entities, relations_, with_unit: bool, links) -> DocumentGraph:
    doc = f"d{number}"
    units = [MultimodalUnit(f"{doc}:u0", "table", "a table")] if with_unit else []
    made = DocumentGraph.from_mentions(
        doc, [EntityMention(m.key, m.name, m.type, m.description, f"{doc}:{m.evidence_id}") for m in entities],
        [RelationMention(r.source, r.target, r.description, r.keywords, r.weight, f"{doc}:{r.evidence_id}") for r in relations_],
        units,
    )
    return DocumentGraph(doc, made.entities, made.relations, made.units,
                         list(made.belongs_to) + [(key, f"{doc}:{unit}") for key, unit in links])


def tables(graph: KnowledgeGraph) -> dict:
    nodes, edges = graph.nodes, graph.edges
    return {
        "nodes": (nodes.kind, nodes.key, nodes.name, nodes.type, nodes.description, nodes.documents, nodes.evidence),
        "edges": (edges.src.tolist(), edges.dst.tolist(), edges.kind, edges.weight.tolist(), edges.description,
                  edges.keywords, edges.documents, edges.evidence),
        "adjacency": graph.adjacency.toarray().tolist(), "entries": graph._edge_of_entry.tolist(),
        "indexes": (dict(graph.entity_index), dict(graph.unit_index)), "documents": graph.documents,
    }


@settings(max_examples=80, deadline=None)
@given(documents)
def test_appending_documents_equals_building_from_scratch(steps):
    graphs = [document(number, *step) for number, step in enumerate(steps)]
    grown = build_graph(graphs[:1])
    before = [copy.deepcopy(tables(grown))]
    history = [grown]
    for count in range(2, len(graphs) + 1):
        grown = appended_graph(grown, graphs[count - 1 : count])
        assert tables(grown) == tables(build_graph(graphs[:count]))
        history.append(grown)
        before.append(copy.deepcopy(tables(grown)))
    for graph, snapshot in zip(history, before):  # appending never changed an older graph
        assert tables(graph) == snapshot
    for number in range(1, len(graphs)):  # nor what it keeps to append to: every older graph can branch
        assert tables(appended_graph(history[0], graphs[number:])) == tables(build_graph(graphs[:1] + graphs[number:]))
    assert np.array_equal(grown.degree, build_graph(graphs).degree)
