"""A question's PageRank on its neighbourhood, compiled (numba): the same arithmetic in the same order as the
scipy path (induced_submatrix, row_sums, _pagerank_scipy), so the scores are bit-identical (the tests check it).

Why compiled: on a 500-node neighbourhood of a 100,000-chunk collection the scipy path took 1.2-1.5 ms of a
Complex query's 7-10 ms (this: 0.7 ms), most of it in scipy's column selection (its branch per entry
mispredicts on a third of 70,000 entries) and in numpy's per-call overhead over the seven rounds of a
500-element power iteration.
The sums numpy makes pairwise (np.sum, np.add.reduceat) are made pairwise here in numpy's own blocking
(`_pairwise_sum`), so not one bit moves.

Import this module only through graph.py's compiled_kernels(): on first use (a server's warm-up), so that a
process that never runs a PageRank does not pay numba's import (0.3 s), and a host without numba (the GPU
host's packed environment) keeps the scipy path. Compiled code is cached on disk by numba: a restart loads it.
No fast-math: the compiler may neither reorder a sum nor fuse a multiply and an add.
"""

from __future__ import annotations

import numba
import numpy as np

# numpy's pairwise summation: blocks of up to 128 summed in 8 interleaved accumulators, halved above that
_UNROLL = 8
_BLOCK = 128
_DEPTH = 64  # halving 2**63 values takes fewer levels


@numba.njit(nogil=True, cache=True)
def _block_sum(values, start, count):
    """numpy's pairwise_sum of at most 128 values: eight interleaved accumulators (sequential below eight)."""
    if count < _UNROLL:
        total = 0.0
        for i in range(start, start + count):
            total += values[i]
        return total
    r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
    r4, r5, r6, r7 = values[start + 4], values[start + 5], values[start + 6], values[start + 7]
    i = _UNROLL
    whole = count - count % _UNROLL
    while i < whole:
        at = start + i
        r0 += values[at]
        r1 += values[at + 1]
        r2 += values[at + 2]
        r3 += values[at + 3]
        r4 += values[at + 4]
        r5 += values[at + 5]
        r6 += values[at + 6]
        r7 += values[at + 7]
        i += _UNROLL
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < count:
        total += values[start + i]
        i += 1
    return total


@numba.njit(nogil=True, cache=True)
def _pairwise_sum(values, start, count):
    """numpy's pairwise_sum of values[start:start + count] (numpy/_core/src/umath/loops_utils.h.src): blocks of
    at most 128 summed as _block_sum does, larger runs halved (the half a multiple of 8) and the halves' sums
    added. numpy recurses; numba cannot cache a recursive function (a cached one crashed the next process), so
    the recursion runs here on a stack of its own."""
    if count <= _BLOCK:
        return _block_sum(values, start, count)
    starts = np.empty(_DEPTH, np.int64)
    counts = np.empty(_DEPTH, np.int64)
    phases = np.zeros(_DEPTH, np.int64)  # 0: to split (or sum, a block), 1: left half summed, 2: right half too
    lefts = np.empty(_DEPTH)
    top = 0
    starts[0], counts[0] = start, count
    returned = 0.0
    while True:
        half = counts[top] // 2
        half -= half % _UNROLL
        if phases[top] == 0 and counts[top] <= _BLOCK:
            returned = _block_sum(values, starts[top], counts[top])
            top -= 1
        elif phases[top] == 0:
            phases[top] = 1
            starts[top + 1], counts[top + 1], phases[top + 1] = starts[top], half, 0
            top += 1
            continue
        elif phases[top] == 1:
            lefts[top] = returned
            phases[top] = 2
            starts[top + 1], counts[top + 1], phases[top + 1] = starts[top] + half, counts[top] - half, 0
            top += 1
            continue
        else:
            returned = lefts[top] + returned
            top -= 1
        if top < 0:
            return returned


@numba.njit(nogil=True, cache=True)
def _neighbourhood_pagerank(indptr, indices, data, members, teleport, damping, max_iter, tol, position):
    """The PageRank of the subgraph induced by `members` (sorted, distinct; `position`: -1 for every node of the
    graph, left so), teleporting to `teleport`: _pagerank_scipy(induced_submatrix(...), row_sums(...), ...)."""
    size = members.shape[0]
    for i in range(size):
        position[members[i]] = i
    # the induced submatrix: each member's row, its entries to other members kept in order. Written without a
    # branch (every entry is stored, the count advances only for a member): a branch mispredicts on a third of
    # the entries and took two thirds of the time
    room = 0
    for i in range(size):
        room += indptr[members[i] + 1] - indptr[members[i]]
    pointers = np.empty(size + 1, np.int64)
    columns = np.empty(room + 1, np.int32)
    weights = np.empty(room + 1, np.float64)
    pointers[0] = 0
    kept = 0
    for i in range(size):
        for entry in range(indptr[members[i]], indptr[members[i] + 1]):
            column = position[indices[entry]]
            columns[kept] = column
            weights[kept] = data[entry]
            kept += column >= 0
        pointers[i + 1] = kept
    for i in range(size):
        position[members[i]] = -1
    # degree: row_sums (np.add.reduceat: a row's first entry plus the pairwise sum of the rest); 1 / degree
    inverse = np.zeros(size)
    dangling = np.empty(size, np.int64)
    dangling_count = 0
    for i in range(size):
        first, end = pointers[i], pointers[i + 1]
        degree = weights[first] + _pairwise_sum(weights, first + 1, end - first - 1) if end > first else 0.0
        if degree == 0:
            dangling[dangling_count] = i
            dangling_count += 1
        else:
            inverse[i] = 1.0 / degree
    # the power iteration, as _pagerank_scipy writes it in numpy expressions
    x = np.full(size, 1.0 / size)
    scaled = np.empty(size)
    gathered = np.empty(dangling_count)
    change = np.empty(size)
    for _ in range(max_iter):
        for i in range(size):
            scaled[i] = x[i] * inverse[i]
        for j in range(dangling_count):
            gathered[j] = x[dangling[j]]
        dangling_mass = _pairwise_sum(gathered, 0, dangling_count)
        following = np.empty(size)
        for i in range(size):
            product = 0.0  # scipy's csr_matvec: entries added one by one, in order, to 0
            for entry in range(pointers[i], pointers[i + 1]):
                product += weights[entry] * scaled[columns[entry]]
            following[i] = damping * (product + dangling_mass * teleport[i]) + (1 - damping) * teleport[i]
            change[i] = abs(following[i] - x[i])
        x = following
        if _pairwise_sum(change, 0, size) < size * tol:
            break
    return x


def neighbourhood_pagerank(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, members: np.ndarray, teleport: np.ndarray,
    damping: float, max_iter: int, tol: float,
) -> np.ndarray:
    """The PageRank over `members` (sorted, distinct) of a square CSR adjacency with float64 weights."""
    position = np.full(len(indptr) - 1, -1, dtype=np.int32)
    return _neighbourhood_pagerank(indptr, indices, data, np.asarray(members, dtype=np.int64),
                                   np.asarray(teleport, dtype=np.float64), float(damping), int(max_iter), float(tol),
                                   position)


# a collection's adjacency in miniature, with its dtypes (int32 positions, float64 weights): indptr, indices, data
TWO_NODES = (np.array([0, 1, 2], dtype=np.int32), np.array([1, 0], dtype=np.int32), np.ones(2))


def warm_up() -> None:
    """Loads the compiled code from numba's cache (0.3 s; compiles it, 3 s, where there is none yet) by running it
    on TWO_NODES. graph.compiled_kernels() runs it with the import: a server at start, in the background, so
    that neither its first query nor its first commit's warm-up pays it."""
    neighbourhood_pagerank(*TWO_NODES, np.array([0, 1]), np.array([1.0, 0.0]), 0.85, 100, 1e-6)
