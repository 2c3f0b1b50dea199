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
