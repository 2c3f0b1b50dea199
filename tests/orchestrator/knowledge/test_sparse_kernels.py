"""The query path's sparse products equal the scipy expressions they replace, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from orchestrator.knowledge.sparse_kernels import csr_matvec, induced_submatrix, row_entries, row_sums, selected_rows_product


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


def test_row_entries_are_the_entries_of_the_selected_rows_in_their_order():
    matrix = sp.csr_matrix(np.array([[1, 0, 2], [0, 0, 0], [3, 4, 0], [0, 5, 6]], dtype=np.float64))
    rows = np.array([3, 0, 1, 2])
    entries = row_entries(matrix.indptr, rows)
    assert matrix.data[entries].tolist() == matrix[rows].data.tolist() == [5, 6, 1, 2, 3, 4]
    assert matrix.indices[entries].tolist() == matrix[rows].indices.tolist()
    assert row_entries(matrix.indptr, np.array([1])).tolist() == []


@pytest.mark.parametrize("seed", range(4))
def test_the_induced_submatrix_and_its_row_sums_equal_scipys_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    matrix = sp.random(400, 400, density=0.02, format="csr", random_state=seed)
    keep = sp.diags((np.arange(400) < 390).astype(np.float64))  # the last ten rows and columns without entries
    matrix = (keep @ (matrix + matrix.T) @ keep).tocsr()
    matrix.eliminate_zeros()
    for members in (np.sort(rng.choice(400, 60, replace=False)), np.arange(400), np.array([7]), np.arange(385, 400)):
        expected = matrix[members][:, members].tocsr()
        made = induced_submatrix(matrix, members)
        assert made.shape == expected.shape == (len(members), len(members))
        for part in ("indptr", "indices", "data"):
            assert np.array_equal(getattr(made, part), getattr(expected, part))
        assert np.array_equal(row_sums(made), np.asarray(expected.sum(axis=1)).ravel())
    assert induced_submatrix(matrix, np.zeros(0, dtype=np.int64)).shape == (0, 0)


@pytest.mark.parametrize("seed", range(4))
def test_the_mass_of_selected_rows_equals_scipys_bit_for_bit(seed):
    """The graph's evidence mass: the selected nodes' rows of the [nodes x evidence] table, weighted and summed
    per column in the order the rows are given (not sorted: a different order changes the last bits)."""
    rng = np.random.default_rng(seed)
    table = sp.random(200, 1000, density=0.05, format="csr", random_state=seed)
    for rows in (rng.permutation(200)[:60], np.arange(200)[::-1], np.array([5]), np.zeros(0, dtype=np.int64)):
        weights = rng.random(len(rows))
        expected = np.asarray(table[rows].T @ weights).ravel() if len(rows) else np.zeros(1000)
        assert np.array_equal(selected_rows_product(table, rows, weights), expected)
