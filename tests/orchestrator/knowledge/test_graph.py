from __future__ import annotations

import importlib.util

import networkx as nx
import numpy as np
import pytest

from orchestrator.knowledge.graph.graph import (
    BELONGS_TO,
    ENTITY,
    RELATED,
    UNIT,
    DocumentGraph,
    KnowledgeGraph,
    MultimodalUnit,
)
from orchestrator.knowledge.graph.merge import build_graph
from orchestrator.knowledge.graph.pagerank import gpu_available
from orchestrator.knowledge.storage.segments import EntityMention, RelationMention


def _report() -> DocumentGraph:
    """Northwind's report: two chunks and a table whose description names Aurora and Northwind."""
    return DocumentGraph.from_mentions(
        "d1",
        [
            EntityMention("northwind", "Northwind", "organization", "Maker of instruments.", "d1:c0"),
            EntityMention("lyon", "Lyon", "location", "A city.", "d1:c0"),
            EntityMention("northwind", "Northwind", "organization", "Maker of instruments.", "d1:c1"),
            EntityMention("aurora", "Aurora", "product", "A spectrometer.", "d1:c1"),
            EntityMention("aurora", "Aurora line", "product", "Revenue 187 M.", "d1:u0"),
            EntityMention("northwind", "NORTHWIND", "concept", "", "d1:u0"),
        ],
        [
            RelationMention("lyon", "northwind", "Northwind opened a lab in Lyon.", "lab, expansion", 2.0, "d1:c0"),
            RelationMention("aurora", "northwind", "Northwind makes Aurora.", "product", 3.0, "d1:c1"),
            RelationMention("aurora", "northwind", "Aurora sells well.", "product, sales", 1.0, "d1:u0"),
        ],
        [MultimodalUnit("d1:u0", "table", "Table: Revenue by product")],
    )


def _press() -> DocumentGraph:
    """A press release: Northwind again (another written form), and Berlin."""
    return DocumentGraph.from_mentions(
        "d2",
        [
            EntityMention("northwind", "Northwind Inc", "organization", "Listed company.", "d2:c0"),
            EntityMention("berlin", "Berlin", "location", "", "d2:c0"),
            EntityMention("lyon", "Lyon", "location", "French city.", "d2:c0"),
        ],
        [
            RelationMention("berlin", "northwind", "Northwind opened an office in Berlin.", "office", 1.0, "d2:c0"),
            RelationMention("lyon", "northwind", "Northwind ships from Lyon.", "logistics", 4.0, "d2:c0"),
        ],
        [],
    )


def test_two_documents_give_exact_node_and_edge_tables():
    graph = build_graph([_report(), _press()])
    nodes = graph.nodes  # numbered as first seen, so that appending documents only adds rows
    assert nodes.kind == [ENTITY, ENTITY, ENTITY, UNIT, ENTITY]
    assert nodes.key == ["northwind", "lyon", "aurora", "d1:u0", "berlin"]
    assert nodes.name == ["Northwind", "Lyon", "Aurora", "d1:u0", "Berlin"]
    assert nodes.type == ["organization", "location", "product", "table", "location"]
    assert nodes.description == [
        "Maker of instruments.\nListed company.",
        "A city.\nFrench city.",
        "A spectrometer.\nRevenue 187 M.",
        "Table: Revenue by product",
        "",
    ]
    assert nodes.documents == [("d1", "d2"), ("d1", "d2"), ("d1",), ("d1",), ("d2",)]
    assert nodes.evidence == [
        ("d1:c0", "d1:c1", "d1:u0", "d2:c0"),
        ("d1:c0", "d2:c0"),
        ("d1:c1", "d1:u0"),
        ("d1:u0",),
        ("d2:c0",),
    ]
    assert graph.entity_index == {"northwind": 0, "lyon": 1, "aurora": 2, "berlin": 4}
    assert graph.unit_index == {"d1:u0": 3}
    assert graph.documents == ("d1", "d2")

    edges = graph.edges
    assert edges.src.tolist() == [1, 2, 2, 0, 4]
    assert edges.dst.tolist() == [0, 0, 3, 3, 0]
    assert edges.kind == [RELATED, RELATED, BELONGS_TO, BELONGS_TO, RELATED]
    assert edges.weight.tolist() == [6.0, 4.0, 1.0, 1.0, 1.0]
    assert edges.description == [
        "Northwind opened a lab in Lyon.\nNorthwind ships from Lyon.",
        "Northwind makes Aurora.\nAurora sells well.",
        "",
        "",
        "Northwind opened an office in Berlin.",
    ]
    assert edges.keywords == ["lab, expansion, logistics", "product, sales", "", "", "office"]
    assert edges.documents == [("d1", "d2"), ("d1",), ("d1",), ("d1",), ("d2",)]
    assert edges.evidence == [("d1:c0", "d2:c0"), ("d1:c1", "d1:u0"), (), (), ("d2:c0",)]


def test_adjacency_is_the_symmetric_weighted_edge_table():
    graph = build_graph([_report(), _press()])
    expected = np.zeros((5, 5))
    for s, d, w in zip(graph.edges.src, graph.edges.dst, graph.edges.weight):
        expected[s, d] = expected[d, s] = w
    assert np.array_equal(graph.adjacency.toarray(), expected)
    assert graph.degree.tolist() == [4, 1, 2, 2, 1]
    assert graph.weighted_degree.tolist() == [12.0, 6.0, 5.0, 2.0, 1.0]
    assert graph.neighbors(0).tolist() == [1, 2, 3, 4]
    assert [graph.edges.kind[e] for e in graph.incident_edges(0)] == [RELATED, RELATED, BELONGS_TO, RELATED]
    assert graph.edge_between(1, 0) == 0 and graph.edge_between(0, 1) == 0
    assert graph.edge_between(2, 4) is None
    assert graph.node("northwind") == 0 and graph.node("d1:u0") == 3 and graph.node("paris") is None
    with pytest.raises(IndexError):
        graph.neighbors(5)


def test_belongs_to_links_the_entities_extracted_from_a_unit():
    graph = build_graph([_report()])
    unit = graph.node("d1:u0")
    links = [e for e in range(len(graph.edges)) if graph.edges.kind[e] == BELONGS_TO]
    assert sorted((graph.nodes.key[graph.edges.src[e]], graph.nodes.key[graph.edges.dst[e]]) for e in links) == [
        ("aurora", "d1:u0"),
        ("northwind", "d1:u0"),
    ]
    assert [graph.nodes.key[n] for n in graph.neighbors(unit)] == ["northwind", "aurora"]
    # explicit links, and links to undeclared units, are taken as given
    explicit = build_graph([DocumentGraph("d9", belongs_to=[("chart entity", "d9:u7")])])
    assert explicit.nodes.key == ["chart entity", "d9:u7"]
    assert explicit.nodes.type == ["concept", "unknown"]
    assert explicit.edges.kind == [BELONGS_TO]


def test_records_are_sanitised_not_trusted():
    document = DocumentGraph(
        "d1",
        [EntityMention("", "Empty", "x", "", "d1:c0"), EntityMention("a", "", "concept", "", "d1:c0")],
        [
            RelationMention("a", "a", "self", "", 1.0, "d1:c0"),
            RelationMention("a", "ghost", "to an entity no mention names", "", float("nan"), "d1:c0"),
            RelationMention("ghost", "a", "", "", -3.0, "d1:c1"),
        ],
    )
    graph = build_graph([document])
    assert graph.nodes.key == ["a", "ghost"]
    assert graph.nodes.name == ["a", "ghost"]  # no written form: the key
    assert graph.nodes.type == ["concept", "concept"]
    assert graph.edges.weight.tolist() == [2.0]  # NaN and -3 count as 1.0 each
    assert graph.nodes.evidence[1] == ("d1:c0", "d1:c1")
    with pytest.raises(ValueError):
        build_graph([document, document])


def test_empty_graph():
    graph = build_graph([])
    assert graph.node_count == 0 and len(graph.edges) == 0 and graph.adjacency.shape == (0, 0)
    assert graph.k_hop([], 2) == []
    assert graph.personalized_pagerank({}).shape == (0,)


def _no_orphans(graph: KnowledgeGraph) -> None:
    live = set(graph.documents)
    assert all(docs and set(docs) <= live for docs in graph.nodes.documents)
    assert all(docs and set(docs) <= live for docs in graph.edges.documents)
    assert all(d for d in graph.degree[[graph.unit_index[u] for u in graph.unit_index]])  # units keep an entity


def test_deleting_a_document_removes_its_own_entities_and_keeps_shared_ones():
    report, press = _report(), _press()
    both = build_graph([report, press])
    _no_orphans(both)

    without_report = build_graph([press])  # deleting d1 is building from what remains
    _no_orphans(without_report)
    assert without_report.nodes.key == ["northwind", "berlin", "lyon"]  # aurora and the table were only in d1
    northwind = without_report.node("northwind")
    assert without_report.nodes.documents[northwind] == ("d2",)
    assert without_report.nodes.evidence[northwind] == ("d2:c0",)
    assert without_report.nodes.name[northwind] == "Northwind Inc"
    assert without_report.nodes.description[northwind] == "Listed company."
    lyon = without_report.edge_between(without_report.node("lyon"), northwind)
    assert without_report.edges.weight[lyon] == 4.0
    assert without_report.edges.documents[lyon] == ("d2",)
    assert without_report.edges.description[lyon] == "Northwind ships from Lyon."

    without_press = build_graph([report])
    _no_orphans(without_press)
    assert without_press.nodes.key == ["northwind", "lyon", "aurora", "d1:u0"]  # berlin was only in d2
    assert without_press.nodes.documents[without_press.node("lyon")] == ("d1",)
    assert without_press.nodes.description[without_press.node("lyon")] == "A city."


def _chain_graph() -> KnowledgeGraph:
    """a - b - c - d - e, plus f hanging off b with a heavier edge than b - c, and an isolated g."""
    keys = ["a", "b", "c", "d", "e", "f", "g"]
    pairs = [("a", "b", 1.0), ("b", "c", 1.0), ("c", "d", 1.0), ("d", "e", 1.0), ("b", "f", 5.0)]
    return build_graph(
        [
            DocumentGraph(
                "d",
                [EntityMention(k, k.upper(), "concept", "", "d:c0") for k in keys],
                [RelationMention(s, t, "", "", w, "d:c0") for s, t, w in pairs],
            )
        ]
    )


def test_k_hop_distances_and_order():
    graph = _chain_graph()
    a, b, c, d, e, f, g = range(7)
    assert graph.k_hop([a], 0) == [(a, 0)]
    assert graph.k_hop([a], 1) == [(a, 0), (b, 1)]
    assert graph.k_hop([a], 2) == [(a, 0), (b, 1), (f, 2), (c, 2)]  # f first: heavier edge to the frontier
    assert graph.k_hop([a], 10) == [(a, 0), (b, 1), (f, 2), (c, 2), (d, 3), (e, 4)]
    assert graph.k_hop([e, a, e], 1) == [(e, 0), (a, 0), (b, 1), (d, 1)]  # seeds deduplicated, in given order
    assert graph.k_hop([a], 10, max_nodes=3) == [(a, 0), (b, 1), (f, 2)]
    assert graph.k_hop([g], 3) == [(g, 0)]
    assert graph.k_hop([a, b], 1, max_nodes=1) == [(a, 0)]
    with pytest.raises(IndexError):
        graph.k_hop([99], 1)


def test_k_hop_matches_networkx_bfs_on_a_random_graph():
    graph, reference = _random_graph(400, 1200, seed=3)
    rng = np.random.default_rng(5)
    for _ in range(5):
        seeds = rng.choice(400, 3, replace=False).tolist()
        for hops in (1, 2, 3):
            expected = {}
            for distance, layer in enumerate(nx.bfs_layers(reference, seeds)):
                if distance > hops:
                    break
                expected.update({node: distance for node in layer})
            found = graph.k_hop(seeds, hops)
            assert dict(found) == expected
            assert [h for _, h in found] == sorted(h for _, h in found)


def _random_graph(n: int, m: int, seed: int) -> tuple[KnowledgeGraph, nx.Graph]:
    """A weighted random graph (with some isolated nodes) built both ways; node i has key f"n{i:05d}"."""
    rng = np.random.default_rng(seed)
    pairs = rng.integers(0, n - 10, size=(m, 2))  # the last ten nodes stay isolated (dangling)
    pairs = np.unique(np.sort(pairs[pairs[:, 0] != pairs[:, 1]], axis=1), axis=0)
    weights = rng.uniform(0.5, 5.0, size=len(pairs))
    keys = [f"n{i:05d}" for i in range(n)]
    graph = build_graph(
        [
            DocumentGraph(
                "d",
                [EntityMention(k, k, "concept", "", "d:c0") for k in keys],
                [RelationMention(keys[a], keys[b], "", "", float(w), "d:c0") for (a, b), w in zip(pairs.tolist(), weights)],
            )
        ]
    )
    reference = nx.Graph()
    reference.add_nodes_from(range(n))
    reference.add_weighted_edges_from((int(a), int(b), float(w)) for (a, b), w in zip(pairs, weights))
    return graph, reference


def test_personalized_pagerank_matches_networkx():
    graph, reference = _random_graph(300, 900, seed=11)
    seeds = {4: 1.0, 17: 3.0, 295: 2.0}  # 295 is isolated: a dangling seed
    scores = graph.personalized_pagerank(seeds, backend="cpu")
    expected = nx.pagerank(reference, alpha=0.85, personalization=seeds, tol=1e-6, weight="weight")
    assert np.abs(scores - np.array([expected[i] for i in range(300)])).max() < 1e-6
    assert scores.sum() == pytest.approx(1.0)

    scores = graph.personalized_pagerank(seeds, damping=0.5, tol=1e-10, max_iter=500, backend="cpu")
    expected = nx.pagerank(reference, alpha=0.5, personalization=seeds, tol=1e-10, max_iter=500)
    assert np.abs(scores - np.array([expected[i] for i in range(300)])).max() < 1e-9

    scores = graph.personalized_pagerank(None, backend="cpu")  # no seeds: global PageRank
    expected = nx.pagerank(reference)
    assert np.abs(scores - np.array([expected[i] for i in range(300)])).max() < 1e-6


def test_personalized_pagerank_on_a_neighbourhood_matches_networkx_on_the_subgraph():
    graph, reference = _random_graph(300, 900, seed=12)
    seeds = {10: 1.0, 20: 1.0}
    neighbourhood = [node for node, _ in graph.k_hop(seeds, 2)]
    scores = graph.personalized_pagerank({**seeds, 299: 5.0}, restrict_to=neighbourhood, backend="cpu")  # 299 outside
    expected = nx.pagerank(reference.subgraph(neighbourhood), personalization=seeds)
    outside = np.setdiff1d(np.arange(300), neighbourhood)
    assert np.all(scores[outside] == 0)
    assert max(abs(scores[node] - expected[node]) for node in neighbourhood) < 1e-6


def test_personalized_pagerank_validates_its_inputs():
    graph = _chain_graph()
    with pytest.raises(ValueError):
        graph.personalized_pagerank({0: -1.0})
    with pytest.raises(ValueError):
        graph.personalized_pagerank({0: 1.0}, damping=1.0)
    with pytest.raises(IndexError):
        graph.personalized_pagerank({99: 1.0})
    with pytest.raises(IndexError):
        graph.personalized_pagerank({0: 1.0}, restrict_to=[0, 99])
    assert graph.personalized_pagerank({0: 1.0}, restrict_to=[]).tolist() == [0.0] * 7


def test_gpu_check_is_cached_and_false_without_a_gpu_library():
    assert gpu_available() is gpu_available()
    if importlib.util.find_spec("cupy") is None:
        assert gpu_available() is False
