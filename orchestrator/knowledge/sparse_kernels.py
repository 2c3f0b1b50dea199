"""Sparse-matrix products for the query path, by scipy's own kernels without its per-call checks and copies.

On a question's scale (a neighbourhood of a hundred nodes, the few columns of a question's words), scipy's
indexing and dispatch cost more than the arithmetic. These functions gather the entries themselves and call
the same C++ kernels (`scipy.sparse._sparsetools`) in the same order, so the results are bit-identical to
the scipy expressions named in each docstring (the tests check it).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse import _sparsetools


def row_entries(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions in indices/data of every entry of `rows` of a CSR matrix (columns of a CSC one), in the order of
    `rows`: the entries of `matrix[rows]` without building it."""
    starts, ends = indptr[rows], indptr[rows + 1]
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return np.arange(total, dtype=np.int64) + offsets


def csr_matvec(matrix: sp.csr_matrix, x: np.ndarray) -> np.ndarray:
    """`matrix @ x` for a CSR matrix and a vector (the power iteration calls it every round)."""
    dtype = np.result_type(matrix.dtype, x.dtype)
    out = np.zeros(matrix.shape[0], dtype=dtype)
    _sparsetools.csr_matvec(matrix.shape[0], matrix.shape[1], matrix.indptr, matrix.indices,
                            matrix.data.astype(dtype, copy=False), np.ascontiguousarray(x, dtype=dtype), out)
    return out


def gathered_columns_product(indptr: np.ndarray, columns: np.ndarray, rows: np.ndarray, values: np.ndarray, x: np.ndarray,
                             height: int) -> np.ndarray:
    """`matrix[:, columns] @ x` where `rows` and `values` are the entries of those columns of a CSC matrix (as
    row_entries(indptr, columns) finds them, their values transformed if need be) and `x` holds one value per
    column: a BM25 score is the question's words' term weights times their IDFs."""
    dtype = np.result_type(values.dtype, x.dtype)
    out = np.zeros(height, dtype=dtype)
    if not len(columns):
        return out
    pointers = np.zeros(len(columns) + 1, dtype=indptr.dtype)
    np.cumsum(indptr[columns + 1] - indptr[columns], out=pointers[1:])
    _sparsetools.csc_matvec(height, len(columns), pointers, rows, values.astype(dtype, copy=False),
                            np.ascontiguousarray(x, dtype=dtype), out)
    return out


def _copied_rows(matrix: sp.csr_matrix, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(indptr in the indices' dtype, and the CSR pointers, indices and data of `matrix[rows]`), copied by the C++
    kernel scipy's row indexing uses; `rows` in the indices' dtype."""
    indptr = matrix.indptr.astype(matrix.indices.dtype, copy=False)
    pointers = np.zeros(len(rows) + 1, dtype=matrix.indices.dtype)
    np.cumsum(indptr[rows + 1] - indptr[rows], out=pointers[1:])
    indices = np.empty(pointers[-1], dtype=matrix.indices.dtype)
    data = np.empty(pointers[-1], dtype=matrix.data.dtype)
    if len(rows):
        _sparsetools.csr_row_index(len(rows), rows, indptr, matrix.indices, matrix.data, indices, data)
    return indptr, pointers, indices, data


def selected_rows_product(matrix: sp.csr_matrix, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`matrix[rows].T @ x` for a CSR matrix (`x` one value per selected row): the evidence mass of the graph nodes
    a question reached. The rows are copied (_copied_rows), then multiplied as the columns of the transpose
    (gathered_columns_product), without the two sparse matrices scipy builds (half the time at 256 of 16,000
    nodes)."""
    rows = np.asarray(rows, dtype=matrix.indices.dtype)
    indptr, _, kept_indices, kept_data = _copied_rows(matrix, rows)
    return gathered_columns_product(indptr, rows, kept_indices, kept_data, x, matrix.shape[1])


def induced_submatrix(matrix: sp.csr_matrix, members: np.ndarray) -> sp.csr_matrix:
    """`matrix[members][:, members]` for a square CSR matrix and sorted, distinct `members` (a neighbourhood
    whose PageRank is taken): scipy's row and column kernels, without its per-call index checks and dtype
    passes, which took most of the time on a 500-node neighbourhood."""
    members = np.asarray(members, dtype=matrix.indices.dtype)
    size = len(members)
    if size == 0:
        return sp.csr_matrix((0, 0), dtype=matrix.dtype)
    indices = matrix.indices
    _, row_pointers, row_indices, row_data = _copied_rows(matrix, members)
    # the columns: members are sorted and distinct, so each kept entry keeps its place (indices stay sorted)
    column_offsets = np.zeros(matrix.shape[1], dtype=indices.dtype)
    pointers = np.empty(size + 1, dtype=indices.dtype)
    _sparsetools.csr_column_index1(size, members, size, matrix.shape[1], row_pointers, row_indices, column_offsets,
                                   pointers)
    kept_indices = np.empty(pointers[-1], dtype=indices.dtype)
    kept_data = np.empty(pointers[-1], dtype=matrix.data.dtype)
    _sparsetools.csr_column_index2(np.arange(size, dtype=indices.dtype), column_offsets, len(row_indices), row_indices,
                                   row_data, kept_indices, kept_data)
    return sp.csr_matrix((kept_data, kept_indices, pointers), shape=(size, size), copy=False)


def row_sums(matrix: sp.csr_matrix) -> np.ndarray:
    """`matrix.sum(axis=1)` as a flat array: scipy's own reduction (numpy's add.reduceat over each non-empty row,
    whose pairwise sums differ in the last bits from adding the entries one by one)."""
    out = np.zeros(matrix.shape[0], dtype=np.result_type(matrix.dtype, np.float64))
    filled = np.flatnonzero(np.diff(matrix.indptr))
    if len(filled):
        out[filled] = np.add.reduceat(matrix.data, matrix.indptr[filled].astype(np.intp))
    return out
