"""Appending documents to a graph merges only theirs: after any sequence of appends the graph equals one built
from scratch over the same documents, table for table, and every older graph is left as it was."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import given, settings, strategies as st

from orchestrator.knowledge.graph.graph import DocumentGraph, KnowledgeGraph, MultimodalUnit

from orchestrator.knowledge.graph.merge import appended_graph, build_graph, graph_without
from orchestrator.knowledge.storage.segments import EntityMention, RelationMention

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


@settings(max_examples=150, deadline=None)
@given(documents, st.data())
def test_removing_documents_equals_building_from_scratch_over_the_rest(steps, data):
    graphs = [document(number, *step) for number, step in enumerate(steps)]
    records = {graph.document_id: graph for graph in graphs}
    whole = build_graph(graphs)
    before = copy.deepcopy(tables(whole))
    removed = data.draw(st.lists(st.sampled_from(graphs), unique_by=lambda g: g.document_id, max_size=len(graphs)))
    appended = data.draw(st.sampled_from([[], [document(len(graphs), *steps[0])]]))
    left = [graph for graph in graphs if graph not in removed] + appended

    def read(document_id: str) -> DocumentGraph:
        assert document_id not in {graph.document_id for graph in removed}, "a removed document was read"
        return records[document_id]

    made = graph_without(whole, removed, read, appended)
    assert tables(made) == tables(build_graph(left))
    assert tables(whole) == before  # the graph removed from is left as it was
    origin, kept = made.carried_from
    assert origin == whole.documents
    for node in np.flatnonzero(kept >= 0).tolist():  # a kept row is the older graph's row of the same node
        old = int(kept[node])
        assert made.nodes.key[node] == whole.nodes.key[old] and made.nodes.evidence[node] == whole.nodes.evidence[old]
        assert made.nodes.documents[node] == whole.nodes.documents[old]
    if left:  # and what it keeps can still be appended to and removed from
        again = graph_without(made, [left[-1]], {g.document_id: g for g in left}.__getitem__,
                              [document(len(graphs) + 1, *steps[-1])])
        if again is not None:
            assert tables(again) == tables(build_graph(left[:-1] + [document(len(graphs) + 1, *steps[-1])]))


def test_a_document_named_first_what_the_next_one_names_in_another_order():
    """The nodes a removed document named first take the places the next document naming them gives them."""
    first = DocumentGraph("d0", [EntityMention("beta", "Beta", "concept", "", "d0:c0"), EntityMention("alpha", "Alpha", "concept", "", "d0:c0")])
    second = DocumentGraph("d1", [EntityMention("gamma", "Gamma", "concept", "", "d1:c0"), EntityMention("alpha", "Alpha", "concept", "", "d1:c0"),
                                  EntityMention("beta", "Beta", "concept", "", "d1:c0")],
                           [RelationMention("alpha", "beta", "", "", 1.0, "d1:c0")])
    made = graph_without(build_graph([first, second]), [first], {"d1": second}.__getitem__)
    assert made.nodes.key == ["gamma", "alpha", "beta"] == build_graph([second]).nodes.key
    assert made.edges.src.tolist() == [1] and made.edges.dst.tolist() == [2]


def test_an_entity_only_relations_name_takes_their_evidence_in_the_order_they_are_now_first_seen():
    first = DocumentGraph("d0", [], [RelationMention("alpha", "ghost", "", "", 1.0, "d0:c1")])
    second = DocumentGraph("d1", [], [RelationMention("beta", "ghost", "", "", 1.0, "d1:c0"),
                                      RelationMention("alpha", "ghost", "", "", 1.0, "d1:c1")])
    made = graph_without(build_graph([first, second]), [first], {"d1": second}.__getitem__)
    assert tables(made) == tables(build_graph([second]))
    assert made.nodes.evidence[made.entity_index["ghost"]] == ("d1:c0", "d1:c1")


def test_a_unit_whose_record_came_from_the_removed_document_and_another_names_it_is_left_to_a_build():
    """A unit keeps the type and description of the document that named it first; what the next one gave is not
    kept, so that removal is not done in place (the caller builds from scratch)."""
    first = DocumentGraph("d0", units=[MultimodalUnit("shared:u0", "table", "a table")])
    second = DocumentGraph("d1", [EntityMention("alpha", "Alpha", "concept", "", "d1:c0")], belongs_to=[("alpha", "shared:u0")])
    whole = build_graph([first, second])
    assert graph_without(whole, [first], {"d1": second}.__getitem__) is None
    assert tables(graph_without(whole, [second], {"d0": first}.__getitem__)) == tables(build_graph([first]))
