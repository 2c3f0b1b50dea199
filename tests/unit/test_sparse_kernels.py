"""The query path's sparse products equal the scipy expressions they replace, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from orchestrator.knowledge.indexes import BM25Index
from orchestrator.knowledge.sparse_kernels import column_product, csr_matvec, row_entries


@pytest.mark.parametrize("seed", range(4))
def test_the_power_iterations_product_equals_scipys_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    matrix = sp.random(300, 300, density=0.03, format="csr", random_state=seed)
    matrix = (matrix + matrix.T).tocsr()
    x = rng.random(300)
    assert np.array_equal(csr_matvec(matrix, x), matrix @ x)
    single = matrix.astype(np.float32)  # float32 entries with a float64 vector: upcast as scipy does
    assert np.array_equal(csr_matvec(single, x), single @ x)
    assert np.array_equal(csr_matvec(sp.csr_matrix((0, 0)), np.zeros(0)), np.zeros(0))


@pytest.mark.parametrize("seed", range(4))
def test_a_product_over_chosen_columns_equals_scipys_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    matrix = sp.random(500, 80, density=0.05, format="csc", dtype=np.float32, random_state=seed)
    for count in (1, 3, 17, 80):
        columns = np.sort(rng.choice(80, size=count, replace=False))
        x = rng.random(count).astype(np.float32)
        expected = np.asarray(matrix[:, columns] @ x).ravel()
        got = column_product(matrix, columns, x)
        assert got.dtype == expected.dtype == np.float32
        assert np.array_equal(got, expected)
    assert np.array_equal(column_product(matrix, np.zeros(0, np.int64), np.zeros(0, np.float32)), np.zeros(500, np.float32))
    empty = sp.csc_matrix((500, 80), dtype=np.float32)  # columns with no entries at all
    assert np.array_equal(column_product(empty, np.array([2, 5]), np.ones(2, np.float32)), np.zeros(500, np.float32))


def test_row_entries_are_the_entries_of_the_selected_rows_in_their_order():
    matrix = sp.csr_matrix(np.array([[1, 0, 2], [0, 0, 0], [3, 4, 0], [0, 5, 6]], dtype=np.float64))
    rows = np.array([3, 0, 1, 2])
    entries = row_entries(matrix.indptr, rows)
    assert matrix.data[entries].tolist() == matrix[rows].data.tolist() == [5, 6, 1, 2, 3, 4]
    assert matrix.indices[entries].tolist() == matrix[rows].indices.tolist()
    assert row_entries(matrix.indptr, np.array([1])).tolist() == []


def test_bm25_scores_equal_the_scipy_product_they_replace():
    texts = ["the northwind annual report", "aurora instruments revenue grew", "northwind revenue fell in 2023",
             "nothing in common here", "revenue revenue revenue"]
    index = BM25Index(texts)
    for query in ("northwind revenue", "aurora", "revenue in 2023", "unknown words only"):
        columns = index.query_columns(query)
        expected = (np.asarray(index._weights[:, columns] @ index.idf[columns]).ravel() if columns
                    else np.zeros(len(texts), np.float32))
        assert np.array_equal(index.scores(query), expected)
    assert index.scores("northwind revenue")[0] > 0 and index.scores("northwind revenue")[3] == 0
