"""The micro benchmarks' measuring: recall against exact search (with IVF's sample-first rows mapped back to the
data's), vectors with the structure the report claims, and our graph paths agreeing with networkx."""

from __future__ import annotations

import numpy as np
import pytest

from thinkserve_bench.micro import CorpusVectors, build_index, faiss_micro, graph_micro, ivf_lists, markdown, recall_at_k


def test_recall_at_k_counts_shared_rows_only():
    exact = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    found = np.array([[4, 3, 9, -1], [5, 6, 7, 8]])
    assert recall_at_k(found, exact, k=4) == pytest.approx((2 / 4 + 4 / 4) / 2)
    assert recall_at_k(np.full((1, 4), -1), np.full((1, 4), -1), k=4) == 0.0


def test_corpus_vectors_are_unit_norm_deterministic_and_structured():
    data = CorpusVectors(2000, seed=4)
    vectors = data.vectors()
    assert vectors.shape == (2000, 384) and vectors.dtype == np.float32 and data.pool == 400
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(vectors, CorpusVectors(2000, seed=4).vectors())
    assert not np.array_equal(vectors, CorpusVectors(2000, seed=5).vectors())
    # a question is closest to chunks sharing its source's entities (cosine well above unrelated chunks')
    similarities = data.queries(vectors, 50) @ vectors.T
    assert float(np.median(similarities.max(axis=1))) > 0.8
    assert float(np.median(similarities)) < 0.3


def test_ivf_trained_on_a_sample_finds_each_vector_as_its_own_neighbour():
    vectors = CorpusVectors(10_000, seed=1).vectors()
    index, info = build_index("ivf", vectors, train_points_per_list=1)  # 400 lists, the 10,000 minimum as the sample
    assert index.kind == "ivf" and info["ivf_lists"] == ivf_lists(10_000) == 400 and info["train_sample"] == 10_000
    index, info = build_index("ivf", np.concatenate([vectors, CorpusVectors(2_000, seed=2).vectors()]), train_points_per_list=1)
    assert info["train_sample"] == 10_000 and index.size == 12_000  # trained on a sample, every vector added
    order = info["row_order"]
    _, rows = index.search(vectors[:200], 1)
    assert np.mean(order[rows[:, 0]] == np.arange(200)) > 0.95  # rows mapped back to the data's own


def test_our_graph_paths_agree_with_networkx():
    graph = graph_micro([2_000], seed_sets=3, global_sets=2, progress=lambda _: None)
    [row] = graph["graphs"]
    agreement = row["agreement"]
    assert agreement["k-hop 1 same nodes and distances"] == agreement["k-hop 2 same nodes and distances"] == "3/3"
    assert agreement["PageRank local top-10 overlap"] == 1.0 and agreement["PageRank global top-10 overlap"] == 1.0
    assert agreement["PageRank local max abs score difference"] < 1e-9
    assert agreement["PageRank global max abs score difference"] < 1e-9
    assert all(d["count"] == 3 for name, d in row["latency"].items() if "whole" not in name)
    faiss = faiss_micro([3_000], ["flat", "hnsw"], queries=100, timed_queries=20, progress=lambda _: None)
    flat = faiss["sizes"][0]["kinds"]["flat"]["breadths"][0]
    assert flat["recall_at_10"] == 1.0 and flat["latency"]["1"]["count"] == 20  # timed at 1 thread (and the default)
    text = markdown({"command": "c", "machine": {"cpu": "x", "logical_cores": 2, "memory_gib": 1, "gpu": "none",
                                                 "load_average": (1.0, 1.0, 1.0), "git_commit": "abc", "python": "3.11",
                                                 "packages": {}}, "faiss": faiss, "graph": graph})
    assert "| 3,000 | hnsw | hnsw |" in text and "PageRank on the whole graph" in text


def test_thinkserve_bench_micro_writes_its_report(tmp_path):
    from thinkserve_bench.command import main

    code = main(["micro", "--vectors", "2000", "--index-kinds", "flat", "hnsw", "--micro-queries", "40",
                 "--graph-chunks", "1000", "--seed-sets", "2", "--out", str(tmp_path)])
    assert code == 0
    text = (tmp_path / "bench-micro.md").read_text()
    assert "| 2,000 | hnsw | hnsw |" in text and "| 1,000 | PageRank global top-10 overlap | 1.000 |" in text
    assert "ivf" not in text.split("## Graph")[0].split("| vectors |")[1]  # only the kinds asked for
