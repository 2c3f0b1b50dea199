"""The compiled PageRank of a neighbourhood equals the scipy path bit for bit (and numpy's sums, which it redoes)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from orchestrator.knowledge.graph import pagerank as graph_engines
from orchestrator.knowledge.graph.graph import DocumentGraph, KnowledgeGraph
from orchestrator.knowledge.graph.merge import build_graph
from orchestrator.knowledge.graph.pagerank import compiled_kernels, pagerank_scipy
from orchestrator.knowledge.sparse_kernels import induced_submatrix, row_sums
from orchestrator.knowledge.storage.segments import EntityMention, RelationMention

kernels = compiled_kernels()  # numba is a project dependency: without it these tests fail, not skip


def _spread(rng: np.random.Generator, count: int) -> np.ndarray:
    """Values over eleven orders of magnitude: a sum's order then shows in its last bits."""
    return rng.random(count) * 10.0 ** rng.integers(-8, 3, count)


def test_the_pairwise_sum_is_numpys_bit_for_bit():
    """np.sum is numpy's pairwise sum of every value; np.add.reduceat's is the first value plus that of the rest.
    Lengths up to 3,000 take the halving path several levels deep; a plain sum differs in most of them."""
    rng = np.random.default_rng(0)
    plain_differs = 0
    for count in [*range(0, 300), *rng.integers(300, 3000, 300).tolist()]:
        values = _spread(rng, count)
        assert kernels._pairwise_sum(values, 0, count) == np.sum(values)
        if count:
            assert values[0] + kernels._pairwise_sum(values, 1, count - 1) == np.add.reduceat(values, [0])[0]
            plain_differs += float(sum(values.tolist())) != np.sum(values)
    offset = _spread(rng, 1000)
    assert kernels._pairwise_sum(offset, 137, 700) == np.sum(offset[137:837])
    assert plain_differs > 100  # the test can tell the two orders apart


def _graph_matrix(seed: int, size: int, density: float) -> sp.csr_matrix:
    """A symmetric weighted adjacency with isolated nodes (dangling in every neighbourhood that holds them)."""
    matrix = sp.random(size, size, density=density, format="csr", random_state=seed)
    matrix.data = _spread(np.random.default_rng(seed), matrix.nnz)
    keep = sp.diags((np.arange(size) % 17 != 0).astype(np.float64))
    matrix = (keep @ (matrix + matrix.T) @ keep).tocsr()
    matrix.eliminate_zeros()
    return matrix


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_pagerank_of_a_neighbourhood_equals_the_scipy_path_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    matrix = _graph_matrix(seed, 900, 0.15)  # rows of 100-300 entries: their degrees take the halving path
    for members in (np.sort(rng.choice(900, 500, replace=False)), np.arange(900), np.array([17]), np.array([3, 4])):
        teleport = np.zeros(len(members))
        teleport[rng.choice(len(members), min(5, len(members)), replace=False)] = rng.random(min(5, len(members)))
        teleport /= teleport.sum()
        submatrix = induced_submatrix(matrix, members)
        for damping, max_iter, tol in ((0.85, 100, 1e-6), (0.5, 500, 1e-12), (0.85, 2, 1e-6)):
            expected = pagerank_scipy(submatrix, row_sums(submatrix), teleport, damping, max_iter, tol)
            made = kernels.neighbourhood_pagerank(matrix.indptr, matrix.indices, matrix.data, members, teleport, damping,
                                                  max_iter, tol)
            assert np.array_equal(made, expected), (members[:5], damping, max_iter)


def _knowledge_graph(rng: np.random.Generator) -> KnowledgeGraph:
    """400 entities, 390 of them related at random (weights over eleven orders of magnitude), 10 isolated."""
    pairs = np.unique(np.sort(rng.integers(0, 390, size=(3000, 2)), axis=1), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    keys = [f"n{i:05d}" for i in range(400)]
    return build_graph([DocumentGraph(
        "d",
        [EntityMention(key, key, "concept", "", "d:c0") for key in keys],
        [RelationMention(keys[a], keys[b], "", "", float(w), "d:c0") for (a, b), w in zip(pairs.tolist(), _spread(rng, len(pairs)))],
    )])


def test_personalized_pagerank_gives_the_same_scores_with_and_without_numba(monkeypatch):
    """The graph's own entry point on both paths: numba where installed, the scipy path where not."""
    rng = np.random.default_rng(5)
    graph = _knowledge_graph(rng)
    seeds = {int(node): float(w) for node, w in zip([*rng.choice(390, 7, replace=False), 395], rng.random(8))}  # 395: isolated
    neighbourhood, _ = graph.neighbourhood(sorted(seeds), 2, 250)
    compiled = graph.personalized_pagerank(seeds, restrict_to=neighbourhood)
    monkeypatch.setattr(graph_engines, "compiled_kernels", lambda: None)
    assert np.array_equal(graph.personalized_pagerank(seeds, restrict_to=neighbourhood), compiled)
    assert np.count_nonzero(compiled) == len(np.unique(neighbourhood)) == 250


def test_the_warm_up_compiles_the_kernel_a_collections_graph_runs():
    """A server's warm-up loads the specialisation its queries use (numba compiles one per argument type: a graph's
    arrays must type as the warm-up's), so none is compiled then."""
    import numba

    adjacency = _knowledge_graph(np.random.default_rng(6)).adjacency
    typed = [numba.typeof(part) for part in (adjacency.indptr, adjacency.indices, adjacency.data)]
    assert typed == [numba.typeof(part) for part in kernels.TWO_NODES]
    kernels.warm_up()
    assert len(kernels._neighbourhood_pagerank.signatures) >= 1


def test_a_numba_that_does_not_import_leaves_the_scipy_path(monkeypatch, caplog):
    """numba installed but broken (one older than the numpy beside it refuses to import): PageRank still runs."""
    import sys

    graph = _knowledge_graph(np.random.default_rng(7))
    expected = graph.personalized_pagerank({0: 1.0}, restrict_to=graph.neighbourhood([0], 2, 100)[0])
    import orchestrator.knowledge.graph

    monkeypatch.delattr(orchestrator.knowledge.graph, "graph_kernels")
    monkeypatch.setitem(sys.modules, "orchestrator.knowledge.graph.graph_kernels", None)  # its import raises ImportError
    compiled_kernels.cache_clear()
    try:
        assert graph_engines.compiled_kernels() is None
        assert "numba is installed but fails" in caplog.text
        assert np.array_equal(graph.personalized_pagerank({0: 1.0}, restrict_to=graph.neighbourhood([0], 2, 100)[0]), expected)
    finally:
        compiled_kernels.cache_clear()


def test_what_numba_loads_is_kept_out_of_the_collectors_walks():
    """numba's modules and loaded code (77,000 objects) live as long as the process: no collection walks them.
    In a process of its own: here any graph build since has frozen everything."""
    check = (
        "import gc\n"
        "from orchestrator.knowledge.graph.pagerank import compiled_kernels\n"
        "kernels = compiled_kernels()\n"
        "walked = {id(found) for found in gc.get_objects()}\n"
        "print(id(kernels._neighbourhood_pagerank) in walked, len(walked))\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120, check=True)
    found, walked = done.stdout.split()
    assert found == "False" and int(walked) < 30_000, done.stdout  # 114,000 with numba's objects walked
