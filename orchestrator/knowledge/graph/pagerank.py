"""PageRank's engines, the same iteration in each: scipy (the reference), compiled with numba on a question's
neighbourhood (graph_kernels.py: bit-identical scores), and on a GPU with cuGraph or CuPy for whole graphs
(never required: each is chosen only where it is installed and works)."""

from __future__ import annotations

import functools
import importlib.util
import logging
from types import ModuleType
from typing import Optional

import numpy as np
import scipy.sparse as sp

from ..collector import building_long_lived
from ..sparse_kernels import csr_matvec

log = logging.getLogger(__name__)

GPU_MIN_NODES = 100_000  # below this, a GPU call costs more than the CPU power iteration (per-call floor)


def pagerank_scipy(
    matrix: sp.csr_matrix, degree: np.ndarray, teleport: np.ndarray, damping: float, max_iter: int, tol: float
) -> np.ndarray:
    """The power iteration on the CPU. The adjacency is symmetric, so x P = A (x / degree)."""
    size = matrix.shape[0]
    dangling = degree == 0
    inverse = np.zeros(size)
    inverse[~dangling] = 1.0 / degree[~dangling]
    x = np.full(size, 1.0 / size)
    for _ in range(max_iter):
        previous = x
        x = damping * (csr_matvec(matrix, x * inverse) + x[dangling].sum() * teleport) + (1 - damping) * teleport
        if np.abs(x - previous).sum() < size * tol:
            break
    return x


@functools.lru_cache(maxsize=1)
def compiled_kernels() -> Optional[ModuleType]:
    """graph_kernels, numba's compiled PageRank of a neighbourhood, imported and its code loaded on first use (a
    server's warm-up: 0.3-0.5 s; 3 s where numba's cache holds no code for this machine yet); None where numba is
    not installed (the GPU host's packed environment) or fails (a numba older than the numpy beside it refuses to
    import): the scipy path then, with the very same scores. What numba imports and loads lives as long as the
    process, 77,000 objects the collector would walk in every full collection (35 ms): they are kept out of it."""
    if importlib.util.find_spec("numba") is None:
        return None
    try:
        with building_long_lived():
            from . import graph_kernels

            graph_kernels.warm_up()
    except Exception as error:
        log.warning("numba is installed but fails (%s): PageRank runs on the scipy path", error)
        return None
    return graph_kernels


@functools.lru_cache(maxsize=1)
def gpu_engine() -> Optional[str]:
    """The GPU engine for PageRank: "cugraph" or "cupy" when a GPU is visible to it, else None. Checked once
    per process (imports cost seconds; calls fail with CUDA errors without a GPU). cuGraph is preferred;
    CuPy runs the very power iteration of the CPU path on cupyx.scipy.sparse."""
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:
        return None
    if importlib.util.find_spec("cugraph") is not None:
        try:
            import cugraph  # noqa: F401

            return "cugraph"
        except Exception:
            pass
    return "cupy"


def gpu_available() -> bool:
    return gpu_engine() is not None


def limit_gpu_pool(megabytes: int) -> bool:
    """Bound the memory CuPy's pool keeps for PageRank (unbounded by default: it holds what each call freed, beside
    Triton's models on the same GPU). False where PageRank does not run on CuPy."""
    if gpu_engine() != "cupy":
        return False
    import cupy

    cupy.get_default_memory_pool().set_limit(size=megabytes << 20)
    return True


def to_gpu(matrix: sp.csr_matrix, degree: np.ndarray):
    """The adjacency, the dangling-node mask and 1 / degree on the GPU, for pagerank_cupy."""
    import cupy
    import cupyx.scipy.sparse as gpu_sparse

    degree_gpu = cupy.asarray(degree, dtype=cupy.float64)
    dangling = degree_gpu == 0
    inverse = cupy.where(dangling, 0.0, 1.0 / cupy.where(dangling, 1.0, degree_gpu))
    return gpu_sparse.csr_matrix(matrix.astype(np.float64)), dangling, inverse


def pagerank_cupy(adjacency, dangling, inverse, teleport: np.ndarray, damping: float, max_iter: int, tol: float) -> np.ndarray:
    """pagerank_scipy on the GPU: the same iteration and stopping rule, so the same scores to rounding."""
    import cupy

    size = adjacency.shape[0]
    p = cupy.asarray(teleport, dtype=cupy.float64)
    x = cupy.full(size, 1.0 / size)
    for _ in range(max_iter):
        previous = x
        x = damping * (adjacency @ (x * inverse) + x[dangling].sum() * p) + (1 - damping) * p
        if float(cupy.abs(x - previous).sum()) < size * tol:
            break
    return cupy.asnumpy(x)


def pagerank_cugraph(matrix: sp.csr_matrix, teleport: np.ndarray, damping: float, max_iter: int, tol: float) -> np.ndarray:
    """The GPU seam (untested here: no cuGraph on the development machines). Same inputs as the CPU path.

    cuGraph's personalised PageRank also starts uniform and teleports dangling mass to the personalisation;
    its sums run in another order, so scores agree to the tolerance, not bit for bit. tol is scaled by n
    to stop on networkx's criterion (L1 change < n * tol).
    """
    import cudf
    import cugraph

    size = matrix.shape[0]
    graph = cugraph.Graph(directed=True)  # both directions of every undirected edge are stored
    graph.from_cudf_adjlist(
        cudf.Series(matrix.indptr.astype(np.int32)),
        cudf.Series(matrix.indices.astype(np.int32)),
        cudf.Series(matrix.data.astype(np.float64)),
    )
    nonzero = np.flatnonzero(teleport)
    personalization = cudf.DataFrame({"vertex": nonzero.astype(np.int32), "values": teleport[nonzero]})
    start = cudf.DataFrame({"vertex": np.arange(size, dtype=np.int32), "values": np.full(size, 1.0 / size)})
    frame = cugraph.pagerank(
        graph, alpha=damping, personalization=personalization, max_iter=max_iter, tol=tol * size,
        nstart=start, fail_on_nonconvergence=False,
    )
    if isinstance(frame, tuple):  # (scores, converged) when fail_on_nonconvergence=False
        frame = frame[0]
    scores = np.zeros(size)
    scores[frame["vertex"].to_numpy()] = frame["pagerank"].to_numpy()
    return scores
