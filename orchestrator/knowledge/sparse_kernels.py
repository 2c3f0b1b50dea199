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


def column_product(matrix: sp.csc_matrix, columns: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`matrix[:, columns] @ x` for a CSC matrix (canonical: sorted indices, no duplicates), `columns` sorted
    and unique, and a vector of one value per column: a BM25 score is the weights of the question's words
    times their IDF."""
    columns = np.asarray(columns, dtype=np.int64)
    dtype = np.result_type(matrix.dtype, x.dtype)
    out = np.zeros(matrix.shape[0], dtype=dtype)
    if not len(columns):
        return out
    indptr = matrix.indptr
    entries = row_entries(indptr, columns)
    pointers = np.zeros(len(columns) + 1, dtype=indptr.dtype)
    np.cumsum(indptr[columns + 1] - indptr[columns], out=pointers[1:])
    _sparsetools.csc_matvec(matrix.shape[0], len(columns), pointers, matrix.indices[entries],
                            matrix.data[entries].astype(dtype, copy=False), np.ascontiguousarray(x, dtype=dtype), out)
    return out
