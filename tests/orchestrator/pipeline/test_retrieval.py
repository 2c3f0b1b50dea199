"""Hybrid retrieval and graph expansion on a hand-built collection whose every score can be worked out by hand."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from scipy import sparse

from orchestrator.config import Settings
from orchestrator.knowledge.graph.graph import DocumentGraph
from orchestrator.knowledge.graph.merge import build_graph
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.lexical import BM25Index
from orchestrator.knowledge.storage.segments import EntityMention, RelationMention
from orchestrator.knowledge.storage.snapshot import Snapshot
from orchestrator.pipeline.graph_search import expand, hubs, mean_divisors, seed_nodes
from orchestrator.pipeline.plan import QueryOptions, make_plan
from orchestrator.pipeline import retrieval as retrieval_module
from orchestrator.pipeline.retrieval import retrieve, start_retrieval
from tests.segment_factory import make_segment

TEXTS = ["alpha revenue report", "beta growth plan", "gamma factory site", "alpha beta merger"]
E = np.eye(4, dtype=np.float32)


def snapshot() -> Snapshot:
    """Chunk i has vector e_i, except chunk 3 = (e0 + e1) / sqrt(2). Alpha Corp is named in chunks 0 and 3,
    Beta Ltd in 1 and 3 (so they are related through chunk 3), Gamma Site in chunk 2."""
    entities = {TEXTS[0]: ["Alpha Corp"], TEXTS[1]: ["Beta Ltd"], TEXTS[2]: ["Gamma Site"], TEXTS[3]: ["Alpha Corp", "Beta Ltd"]}
    segment = make_segment("report.pdf", TEXTS, entities, dim=4)
    assert segment.entity_keys == ["alpha corp", "beta ltd", "gamma site"] and segment.relation_keys == [("alpha corp", "beta ltd")]
    segment = replace(
        segment,
        evidence_vectors=np.stack([E[0], E[1], E[2], (E[0] + E[1]) / np.sqrt(2)]),
        entity_vectors=E[:3].copy(),  # alpha ~ e0, beta ~ e1, gamma ~ e2
        relation_vectors=E[3:4].copy(),  # the relation matches no question below
    )
    return Snapshot(1, [segment], IndexSpec())


def plan(**options):
    return make_plan("moderate", QueryOptions(chunk_top_k=2, **options), Settings())  # a route that expands the graph


def two_node_pagerank(damping: float = 0.85) -> tuple[float, float]:
    """PPR on alpha - beta teleporting to alpha: x_a = d x_b + (1 - d), x_b = d x_a."""
    alpha = (1 - damping) / (1 - damping * damping)
    return alpha, damping * alpha


def test_dense_sparse_and_graph_candidates_fuse_with_every_signal():
    collection = snapshot()
    result = retrieve(collection, ["alpha revenue"], E[:1], plan(), Settings().retrieval)
    by_row = {c.row: c for c in result.candidates}
    # dense: chunks 0 and 3; BM25: 0 and 3 (both say alpha); the graph adds chunk 1 (Beta Ltd, one hop from Alpha)
    # (every chunk is a page of its own, so BM25 over pages finds chunks 0 and 3 again)
    assert set(by_row) == {0, 1, 3}
    assert by_row[0].found_by == ("dense", "graph", "page_lexical", "sparse") and by_row[1].found_by == ("graph",)
    assert result.entity_seeds == {"alpha corp": pytest.approx(1.0)}

    alpha, beta = two_node_pagerank()  # the neighbourhood's PageRank sums to 1
    assert by_row[0].structural == pytest.approx(alpha, abs=1e-5)  # chunk 0 names Alpha only
    assert by_row[3].structural == pytest.approx((alpha + beta) / 2, abs=1e-5)  # the mean of its two entities
    assert by_row[1].structural == pytest.approx(beta, abs=1e-5)
    assert by_row[1].semantic == 0.0  # found by the graph only: its cosine comes from the stored vector
    assert by_row[3].semantic == pytest.approx(1 / np.sqrt(2))

    index = BM25Index(TEXTS)
    scores, weight = dict(index.search("alpha revenue", 4)), index.query_weight("alpha revenue")
    assert weight == pytest.approx(sum(index.idf(t) for t in ("alpha", "revenue")))
    assert by_row[0].lexical == pytest.approx(min(1.0, scores[0] / weight)) and by_row[3].lexical == pytest.approx(scores[3] / weight)
    assert by_row[3].lexical < by_row[0].lexical < 1.0 + 1e-9  # chunk 3 matches "alpha" only
    assert [c.page_lexical for c in result.candidates] == pytest.approx([c.lexical for c in result.candidates])  # a page = a chunk
    # the default fusion: semantic 1, each lexical signal 0.5 and squared; structural weight 0 (reported, not weighed)
    for c in result.candidates:
        assert c.fused == pytest.approx((c.semantic + 0.5 * c.lexical**2 + 0.5 * c.page_lexical**2) / 2.0)
    assert [c.row for c in result.candidates] == [0, 3, 1]
    assert set(result.timings_ms) == {"dense", "sparse", "page_lexical", "graph", "fusion"}
    assert result.best_semantic == max(c.semantic for c in result.candidates)

    # a limit hands out the best candidates only; the best cosine is still over all of them
    best = retrieve(collection, ["alpha revenue"], E[:1], plan(), Settings().retrieval, limit=1)
    assert best.candidates == result.candidates[:1] and best.best_semantic == result.best_semantic

    # reciprocal rank fusion: chunk 0 is first by all three signals, chunk 3 second by all three, chunk 1 by none
    rrf = Settings.load(None, {"retrieval.fusion": "rrf"}).retrieval
    ranked = retrieve(collection, ["alpha revenue"], E[:1], plan(), rrf).candidates
    assert [(c.row, c.fused) for c in ranked] == [(0, pytest.approx(1.0)), (3, pytest.approx(61 / 62)), (1, 0.0)]

    weighted = Settings.load(None, {"retrieval.semantic_weight": 0.5, "retrieval.lexical_weight": 0.2, "retrieval.lexical_exponent": 1,
                                    "retrieval.page_lexical_weight": 0.0, "retrieval.structural_weight": 0.2}).retrieval
    for c in retrieve(collection, ["alpha revenue"], E[:1], plan(), weighted).candidates:
        assert c.fused == pytest.approx((0.5 * c.semantic + 0.2 * c.lexical + 0.2 * c.structural) / 0.9)


def test_each_switch_takes_its_signal_out():
    collection = snapshot()
    settings = Settings().retrieval
    dense_only = retrieve(collection, ["alpha revenue"], E[:1], plan(sparse=False, graph=False, page_lexical=False), settings)
    assert {c.row: c.found_by for c in dense_only.candidates} == {0: ("dense",), 3: ("dense",)}
    assert all(c.lexical == 0 and c.page_lexical == 0 and c.structural == 0 for c in dense_only.candidates)

    bm25_only = retrieve(collection, ["alpha revenue"], E[:1], plan(dense=False, graph=False), settings)
    assert {c.row: c.found_by for c in bm25_only.candidates} == {0: ("page_lexical", "sparse"), 3: ("page_lexical", "sparse")}
    assert bm25_only.candidates[1].semantic == pytest.approx(1 / np.sqrt(2))  # still reported ...
    # ... but not weighed: the two lexical signals alone (equal here: every chunk is a page of its own), squared
    assert [(c.row, c.fused) for c in bm25_only.candidates] == [(c.row, pytest.approx(c.lexical**2)) for c in bm25_only.candidates]
    assert [c.row for c in bm25_only.candidates] == [0, 3]

    no_seed = retrieve(collection, ["delta"], -E[:1], plan(), settings)  # similar to no entity: the graph stays out
    assert no_seed.entity_seeds == {} and all("graph" not in c.found_by for c in no_seed.candidates)


def test_the_best_pages_bring_all_their_passages_and_lend_them_their_score():
    texts = ["fiscal year totals", "net revenue 412 million", "alpha beta", "unrelated words here", "revenue footnote"]
    segment = replace(make_segment("filing.pdf", texts, dim=4, pages=[0, 0, 1, 1, 2]),
                      evidence_vectors=np.stack([E[2], E[3], E[1], E[1], E[0]]))
    collection = Snapshot(1, [segment], IndexSpec())
    assert [rows.tolist() for rows in collection.page_rows] == [[0, 1], [2, 3], [4]]
    question = "fiscal year net revenue"
    only_pages = retrieve(collection, [question], E[:1], plan(dense=False, sparse=False, graph=False), Settings().retrieval)
    by_row = {c.row: c for c in only_pages.candidates}
    # page 0 holds every word of the question, page 2 only "revenue"; page 1 none: its passages stay out
    assert set(by_row) == {0, 1, 4} and all(c.found_by == ("page_lexical",) for c in by_row.values())
    pages = BM25Index(["fiscal year totals\nnet revenue 412 million", "alpha beta\nunrelated words here", "revenue footnote"])
    expected = pages.scores(question) / pages.query_weight(question)
    assert by_row[0].page_lexical == by_row[1].page_lexical == pytest.approx(min(1.0, expected[0]))
    assert by_row[4].page_lexical == pytest.approx(expected[2]) and expected[2] < expected[0]
    assert [c.row for c in only_pages.candidates] == [0, 1, 4]  # the tie between 0 and 1 keeps row order
    one_page = Settings.load(None, {"retrieval.page_lexical_top_k": 1})
    top1 = retrieve(collection, [question], E[:1], make_plan("simple", QueryOptions(dense=False, sparse=False, graph=False), one_page),
                    one_page.retrieval)
    assert {c.row for c in top1.candidates} == {0, 1}


def test_relations_seed_their_entities_when_asked():
    collection = snapshot()  # the one relation (Alpha Corp - Beta Ltd) has the vector e3
    off = retrieve(collection, ["merger"], E[3:4], plan(), Settings().retrieval)
    on = retrieve(collection, ["merger"], E[3:4], plan(), Settings.load(None, {"retrieval.relation_seeds": True}).retrieval)
    assert off.entity_seeds == {} and on.entity_seeds == {"alpha corp": pytest.approx(1.0), "beta ltd": pytest.approx(1.0)}


def test_documents_ingested_without_relation_vectors_keep_their_graph_and_seed_no_relation():
    """The ingestor embeds relations only for retrieval.relation_seeds: a collection mixing documents ingested
    with and without their vectors searches the relations that have one, row-aligned with their keys."""
    embedded = snapshot().segments[0]
    unembedded = replace(
        make_segment("other.pdf", ["delta delta", "delta epsilon"], {"delta epsilon": ["Delta Inc", "Epsilon AG"]}, dim=4, seed=5),
        entity_vectors=np.stack([E[2], E[2]]),  # unlike the question: only a relation could seed them
        relation_vectors=np.zeros((0, 0), np.float32),
    )
    for segments in ([unembedded, embedded], [embedded, unembedded]):
        collection = Snapshot(1, segments, IndexSpec())
        assert collection.relation_keys == [("alpha corp", "beta ltd")] and collection.relation_index.size == 1
        graph = collection.graph  # the graph still has the unembedded document's relation
        assert graph.node("epsilon ag") in graph.neighbors(graph.node("delta inc")).tolist()
        on = retrieve(collection, ["merger"], E[3:4], plan(), Settings.load(None, {"retrieval.relation_seeds": True}).retrieval)
        assert on.entity_seeds == {"alpha corp": pytest.approx(1.0), "beta ltd": pytest.approx(1.0)}
    # appended to a snapshot (the commit path), the same
    base = Snapshot(1, [unembedded], IndexSpec())
    grown = Snapshot(2, [unembedded, embedded], IndexSpec(), base=base)
    assert base.relation_keys == [] and grown.relation_keys == [("alpha corp", "beta ltd")] and grown.relation_index.size == 1


def test_an_entity_takes_its_vector_from_the_first_document_that_embedded_it():
    """ingest.entity_min_mentions leaves an entity named once without a vector (zeros); a later document that
    embedded it gives it one, whether the snapshot is built whole or appended to."""
    def document(name, seed, vector):
        segment = make_segment(name, [f"{name} alpha text"], {f"{name} alpha text": ["Alpha Corp"]}, dim=4, seed=seed)
        return replace(segment, entity_vectors=np.asarray([vector], np.float32))

    once = document("a.md", 1, np.zeros(4))
    embedded = document("b.md", 2, E[1])
    for collection in (Snapshot(1, [once, embedded], IndexSpec()),
                       Snapshot(2, [once, embedded], IndexSpec(), base=Snapshot(1, [once], IndexSpec()))):
        assert collection.entity_keys == ["alpha corp"] and collection.entity_index.size == 1
        assert collection.search_entities(E[1:2], 1) == [("alpha corp", pytest.approx(1.0))]
    assert Snapshot(1, [once], IndexSpec()).search_entities(E[1:2], 1) == [("alpha corp", 0.0)]


@pytest.mark.parametrize("vectors_last", [True, False])
def test_retrieval_started_before_the_vectors_exist_ranks_as_retrieve_does(vectors_last, monkeypatch):
    """The BM25 side runs before the vectors are set; the dense and graph sides start once they are, beside it;
    fusion runs in the thread that finished last (never one that waits)."""
    collection = snapshot()
    questions, vectors = ["gamma", "beta growth"], np.stack([E[3], E[1]])
    expected = retrieve(collection, questions, vectors, plan(), Settings().retrieval, ["gamma site"], {"text": 0.5})
    lexical_done, dense_done, graph_done, threads = threading.Event(), threading.Event(), threading.Event(), {}

    def recording(name, done):
        original = getattr(retrieval_module, name)

        def record(*args, **kwargs):
            threads[name] = threading.current_thread().name
            if name == "_lexical_side" and not vectors_last:
                assert dense_done.wait(10) and graph_done.wait(10)  # the BM25 side ends last
            try:
                return original(*args, **kwargs)
            finally:
                done.set()

        monkeypatch.setattr(retrieval_module, name, record)

    recording("_lexical_side", lexical_done)
    recording("_dense_side", dense_done)
    recording("_graph_side", graph_done)
    recording("_fused", threading.Event())
    embedded: Future = Future()
    with ThreadPoolExecutor(3, "retrieval") as pool, ThreadPoolExecutor(1, "search") as search_pool:
        started = start_retrieval(collection, questions, embedded, plan(), Settings().retrieval, ["gamma site"],
                                  {"text": 0.5}, pool, search_pool)
        if vectors_last:
            assert lexical_done.wait(10) and not started.done()  # the BM25 side ran, and retrieval waits for the vectors
        embedded.set_result(vectors)
        result = started.result(10)
    assert result.candidates == expected.candidates and result.entity_seeds == expected.entity_seeds
    assert set(result.timings_ms) == set(expected.timings_ms) and result.skipped == expected.skipped
    assert threads["_graph_side"].startswith("search") and threads["_dense_side"].startswith("retrieval")
    last = ("_dense_side", "_graph_side") if vectors_last else ("_lexical_side",)
    assert threads["_fused"] in {threads[side] for side in last}  # fused where the last side ended
    if not vectors_last:
        assert threads["_dense_side"] != threads["_lexical_side"]  # the dense side ran beside the BM25 side


def test_retrieval_whose_vectors_never_come_ends_with_the_cancellation():
    """The embedder failed: the query cancels the vectors, and the retrieval (BM25 side done, graph side not
    started) ends at once with that cause, leaving the pools free."""
    embedded: Future = Future()
    with ThreadPoolExecutor(1, "retrieval") as pool, ThreadPoolExecutor(1, "search") as search_pool:
        started = start_retrieval(snapshot(), ["alpha revenue"], embedded, plan(), Settings().retrieval, (), {}, pool, search_pool)
        assert not started.cancel()  # a caller cannot end it half way: its outcome is set once
        embedded.cancel()
        with pytest.raises(CancelledError):
            started.result(10)
        assert pool.submit(lambda: "free").result(10) == "free" and search_pool.submit(lambda: "free").result(10) == "free"


def test_named_entities_seed_the_graph_and_sub_questions_each_retrieve():
    collection = snapshot()
    result = retrieve(
        collection, ["gamma", "beta growth"], np.stack([E[3], E[1]]), plan(), Settings().retrieval, named_entities=["gamma site"]
    )
    assert result.entity_seeds["gamma site"] == 1.0 and result.entity_seeds["beta ltd"] == pytest.approx(1.0)
    rows = {c.row for c in result.candidates}
    assert {1, 2} <= rows  # chunk 1 from the second sub-question, chunk 2 from the named entity alone


def test_graph_expansion_scores_evidence_by_the_pagerank_of_its_entities():
    collection = snapshot()
    graph = collection.graph
    seeds = seed_nodes(graph, {"alpha corp": 2.0, "gamma site": 1.0, "unknown": 5.0})
    assert seeds == {graph.entity_index["alpha corp"]: 2.0, graph.entity_index["gamma site"]: 1.0}
    expansion = expand(graph, collection.node_evidence, collection.nodes_per_evidence, seeds, hops=1, max_nodes=100)

    reference = nx.Graph()
    reference.add_nodes_from(range(graph.node_count))
    reference.add_edges_from(zip(graph.edges.src.tolist(), graph.edges.dst.tolist()))
    expected = nx.pagerank(reference.subgraph(expansion.nodes.tolist()), personalization=seeds)
    node_of = graph.entity_index
    assert expansion.node_scores == pytest.approx([expected[n] for n in expansion.nodes.tolist()], abs=1e-5)
    # each chunk scores the mean PageRank of the entities extracted from it
    alpha, beta, gamma = (expected[node_of[key]] for key in ("alpha corp", "beta ltd", "gamma site"))
    assert expansion.score(0) == pytest.approx(alpha, abs=1e-5)
    assert expansion.score(2) == pytest.approx(gamma, abs=1e-5)
    assert expansion.score(3) == pytest.approx((alpha + beta) / 2, abs=1e-5)
    assert alpha > (alpha + beta) / 2 > beta and alpha > gamma
    assert expansion.best(1) == [0] and expansion.best(10)[0] == 0 and expansion.best(0) == []
    top = expand(graph, collection.node_evidence, collection.nodes_per_evidence, seeds, hops=1, max_nodes=100, scoring_nodes=1)
    # only the node with the most PageRank (the strongest seed) passes its score on
    assert (top.score(0), top.score(3), top.score(2)) == (pytest.approx(alpha, abs=1e-5), pytest.approx(alpha / 2, abs=1e-5), 0.0)
    empty = expand(graph, collection.node_evidence, collection.nodes_per_evidence, {}, 2, 100)
    assert empty.best(5) == [] and empty.score(0) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_graph_expansion_scores_evidence_by_the_masked_mean_bit_for_bit(seed):
    """The mean divided by mean_divisors (1 for a row no node gave) equals the mean divided only where a row has
    nodes, bit for bit, with the divisors made per call or kept by the caller; rows no node gave score 0."""
    rng = np.random.default_rng(seed)
    pairs = np.unique(np.sort(rng.integers(0, 290, size=(1200, 2)), axis=1), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    keys = [f"n{i:05d}" for i in range(300)]
    graph = build_graph([DocumentGraph(
        "d", [EntityMention(k, k, "concept", "", "d:c0") for k in keys],
        [RelationMention(keys[a], keys[b], "", "", float(w), "d:c0") for (a, b), w in zip(pairs.tolist(), rng.uniform(0.5, 5, len(pairs)))],
    )])
    node_evidence = sparse.random(graph.node_count, 2000, density=0.004, format="csr", random_state=seed)
    node_evidence.data[:] = 1.0
    per_evidence = np.asarray(node_evidence.sum(axis=0)).ravel()
    assert (per_evidence == 0).any()  # rows no node gave
    seeds = {int(n): float(w) for n, w in zip(rng.choice(290, 4, replace=False), rng.uniform(0.2, 1, 4))}
    expansion = expand(graph, node_evidence, per_evidence, seeds, 2, 120, scoring_nodes=40)
    kept = expand(graph, node_evidence, per_evidence, seeds, 2, 120, scoring_nodes=40, divisors=mean_divisors(per_evidence))
    scoring = np.argpartition(-expansion.node_scores, 39)[:40]
    mass = np.asarray(node_evidence[expansion.nodes[scoring]].T @ expansion.node_scores[scoring]).ravel()
    expected = np.divide(mass, per_evidence, out=np.zeros_like(mass), where=per_evidence > 0)
    assert np.array_equal(expansion.evidence_scores, expected) and np.array_equal(kept.evidence_scores, expected)
    assert expected.any() and not expansion.evidence_scores[per_evidence == 0].any()


def test_snapshot_gives_vectors_and_rows_by_evidence():
    collection = snapshot()
    assert collection.evidence_rows == {e.evidence_id: i for i, e in enumerate(collection.evidence)}
    assert np.allclose(collection.evidence_vectors([3, 0]), np.stack([(E[0] + E[1]) / np.sqrt(2), E[0]]))
    assert collection.node_evidence.shape == (collection.graph.node_count, 4)
    assert collection.nodes_per_evidence.tolist() == [1, 1, 1, 2]
    assert collection.entity_key_set == {"alpha corp", "beta ltd", "gamma site"}


def test_hub_entities_are_neither_passed_through_nor_scored_by():
    collection = snapshot()
    graph, alpha, beta = collection.graph, collection.graph.entity_index["alpha corp"], collection.graph.entity_index["beta ltd"]
    # Alpha Corp and Beta Ltd are each named in 2 of the 4 chunks: hubs at a 50% share, not at 60% or 3 chunks
    assert hubs(collection.node_evidence, 0.5, 1)[[alpha, beta]].tolist() == [True, True]
    assert not hubs(collection.node_evidence, 0.6, 1).any() and not hubs(collection.node_evidence, 0.5, 3).any()
    blocked = np.zeros(graph.node_count, dtype=bool)
    blocked[beta] = True
    nodes, _ = graph.neighbourhood([alpha], 2, blocked=blocked)
    assert nodes.tolist() == [alpha]  # Beta is Alpha's only neighbour: nothing is reached
    seeded, _ = graph.neighbourhood([beta, alpha], 2, blocked=blocked)
    assert seeded.tolist() == [beta, alpha]  # a blocked seed stays, nothing is reached through it
    expansion = expand(graph, collection.node_evidence, collection.nodes_per_evidence, {alpha: 1.0, beta: 1.0}, 1, 100, hub_nodes=blocked)
    assert expansion.score(1) == 0.0 and expansion.score(0) > 0  # chunk 1 names only the hub Beta

