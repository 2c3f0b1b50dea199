"""Vector indexes (FAISS: Flat / IVF / HNSW, on a GPU when faiss sees one); the BM25 index is lexical.py.

They are derived data: built from the per-document segments (or read back from files verified against the
manifest, stored_indexes.py), so a crash can never leave an index out of step with the records it points at.
Row i of an index is row i of the table it was built for.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import faiss
import numpy as np


@dataclass(frozen=True)
class IndexSpec:
    """Which FAISS index to build. IVF and HNSW are approximate; Flat is exact (inner product = cosine here)."""

    kind: str = "flat"  # flat | ivf | hnsw
    ivf_lists: int = 0  # 0: about 4 * sqrt(n)
    ivf_probe: int = 16
    ivf_min_vectors: int = 10_000  # below this IVF cannot train well: an exact Flat index is built instead
    hnsw_neighbors: int = 32
    hnsw_ef_search: int = 128
    use_gpu: bool = True  # when faiss reports a GPU (Flat and IVF only; HNSW stays on the CPU)


@functools.cache
def gpu_count() -> int:
    """GPUs faiss can use. A faiss-cpu build has no get_num_gpus; faiss-gpu without a GPU reports 0."""
    try:
        return int(faiss.get_num_gpus())
    except AttributeError:
        return 0


def tail_limit(base_size: int) -> int:
    """How many appended vectors an index keeps in its exact tail before they join its main index: a tenth of
    it (at least 4,096), at most 20,000 (a Flat search of 20,000 vectors of 384 takes about 2 ms on 2 cores)."""
    return min(20_000, max(4_096, base_size // 10))


class VectorIndex:
    """An immutable FAISS index over row-aligned vectors with the same search API on CPU and GPU.

    Appending (a commit adding a document) does not copy the index: the new one shares it and keeps the vectors
    appended since in an exact Flat *tail*, searched beside it, until the tail reaches tail_limit and is merged
    in (a copy of the index, once per tenth of its size). Copying the index per commit cost 0.5 s of a 1 s
    commit at 100,000 chunks (benchmarks/results/incremental_commit.md)."""

    def __init__(
        self, spec: IndexSpec, dimension: int, index: Optional[faiss.Index] = None, kind: str = "flat",
        tail: Optional[np.ndarray] = None,
    ):
        self.spec = spec
        self.dimension = dimension
        self._index = index
        self.kind = kind  # what was actually built (IVF below its minimum size is Flat)
        self._tail_vectors = tail if tail is not None and len(tail) else None  # appended since, not in _index
        self._tail: Optional[faiss.Index] = None
        if self._tail_vectors is not None:
            self._tail = faiss.IndexFlatIP(dimension)
            self._tail.add(self._tail_vectors)

    @classmethod
    def build(cls, spec: IndexSpec, vectors: np.ndarray, dimension: int) -> "VectorIndex":
        if np.size(vectors) == 0:
            return cls(spec, dimension)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, dimension)
        kind = spec.kind
        if kind == "ivf" and len(vectors) < spec.ivf_min_vectors:
            kind = "flat"
        if kind == "flat":
            index = faiss.IndexFlatIP(dimension)
        elif kind == "ivf":
            lists = spec.ivf_lists or max(1, int(4 * math.sqrt(len(vectors))))
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dimension), dimension, lists, faiss.METRIC_INNER_PRODUCT)
            index.train(vectors)
            index.nprobe = spec.ivf_probe
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dimension, spec.hnsw_neighbors, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = spec.hnsw_ef_search
        else:
            raise ValueError(f"unknown index kind {spec.kind!r} (flat, ivf, hnsw)")
        index.add(vectors)
        if spec.use_gpu and kind != "hnsw" and gpu_count() > 0:
            index = faiss.index_cpu_to_all_gpus(index)
        return cls(spec, dimension, index, kind)

    def extended(self, vectors: np.ndarray) -> "VectorIndex":
        """A new index with `vectors` appended as the next rows (the old one stays usable by running queries)."""
        if len(vectors) == 0:
            return self
        if self._index is None:
            return VectorIndex.build(self.spec, vectors, vectors.shape[-1])
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dimension)
        if self.kind != self.spec.kind:  # a small IVF is Flat until there are enough vectors to train it
            return VectorIndex.build(self.spec, np.concatenate([self.vectors(), vectors]), self.dimension)
        tail = vectors if self._tail_vectors is None else np.concatenate([self._tail_vectors, vectors])
        if len(tail) <= tail_limit(int(self._index.ntotal)):
            return VectorIndex(self.spec, self.dimension, self._index, self.kind, tail)
        return VectorIndex(self.spec, self.dimension, self._merged(tail), self.kind)

    def _merged(self, tail: Optional[np.ndarray]) -> faiss.Index:
        """A copy of the main index with `tail` added to it."""
        if tail is None:
            return self._index
        index = _clone(self._index)
        index.add(tail)
        return index

    def write(self, path) -> None:
        """The index as faiss writes it (from the CPU copy of a GPU index), its tail merged in; an empty index
        writes nothing."""
        if self._index is None:
            return
        index = self._merged(self._tail_vectors)
        cpu = faiss.index_gpu_to_cpu(index) if gpu_count() > 0 and self.kind != "hnsw" else index
        faiss.write_index(cpu, str(path))

    @classmethod
    def read(cls, spec: IndexSpec, path, kind: str) -> "VectorIndex":
        """An index `write` wrote, with the search settings of `spec` (efSearch, nprobe) and on a GPU as `build`
        puts it. Raises RuntimeError for a file faiss cannot read (truncated, corrupt), ValueError for one of
        another kind."""
        index = faiss.read_index(str(path))
        found = "hnsw" if isinstance(index, faiss.IndexHNSW) else "ivf" if isinstance(index, faiss.IndexIVF) else "flat"
        if found != kind:
            raise ValueError(f"{path} holds a {found} index, not {kind}")
        if kind == "hnsw":
            index.hnsw.efSearch = spec.hnsw_ef_search
        elif kind == "ivf":
            index.nprobe = spec.ivf_probe
        if spec.use_gpu and kind != "hnsw" and gpu_count() > 0:
            index = faiss.index_cpu_to_all_gpus(index)
        return cls(spec, int(index.d), index, kind)

    def set_ef_search(self, ef_search: int) -> None:
        """HNSW's search breadth (recall against time), for indexes already built; other kinds ignore it."""
        if self._index is not None and self.kind == "hnsw":
            self._index.hnsw.efSearch = ef_search

    @property
    def size(self) -> int:
        main = 0 if self._index is None else int(self._index.ntotal)
        return main + (0 if self._tail_vectors is None else len(self._tail_vectors))

    def vectors(self) -> np.ndarray:
        if self._index is None:
            return np.zeros((0, self.dimension), dtype=np.float32)
        cpu = faiss.index_gpu_to_cpu(self._index) if gpu_count() > 0 and self.kind != "hnsw" else self._index
        main = cpu.reconstruct_n(0, cpu.ntotal)
        return main if self._tail_vectors is None else np.concatenate([main, self._tail_vectors])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of shape [n_queries, k']; k' = min(k, size); rows are -1 where fewer matched."""
        if self._index is None or k <= 0:
            rows = len(np.atleast_2d(queries))
            return np.zeros((rows, 0), np.float32), np.zeros((rows, 0), np.int64)
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dimension)
        k = min(k, self.size)
        main = int(self._index.ntotal)
        scores, rows = self._index.search(queries, min(k, main))
        if self._tail is None:
            return scores, rows
        tail_scores, tail_rows = self._tail.search(queries, min(k, self._tail.ntotal))
        scores = np.concatenate([np.where(rows >= 0, scores, -np.inf), tail_scores], axis=1)
        rows = np.concatenate([rows, tail_rows + main], axis=1)
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # ties: the main index's rows first
        scores, rows = np.take_along_axis(scores, best, axis=1), np.take_along_axis(rows, best, axis=1)
        missing = ~np.isfinite(scores)
        return np.where(missing, 0, scores).astype(np.float32), np.where(missing, -1, rows)


def _clone(index: faiss.Index) -> faiss.Index:
    if gpu_count() > 0 and not isinstance(index, faiss.IndexHNSW):
        return faiss.index_cpu_to_all_gpus(faiss.clone_index(faiss.index_gpu_to_cpu(index)))
    return faiss.clone_index(index)


def index_spec(settings) -> IndexSpec:
    """The IndexSpec for config.IndexSettings (same field names)."""
    return IndexSpec(**settings.model_dump())
