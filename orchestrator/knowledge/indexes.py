"""Vector indexes (FAISS: Flat / IVF / HNSW, on a GPU when faiss sees one) and the BM25 lexical index.

Both are derived data: they are rebuilt in memory from the per-document segments, so a crash can never leave
an index out of step with the records it points at. Row i of an index is row i of the table it was built for.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Optional, Sequence

import faiss
import numpy as np
from scipy import sparse

from .text import STOP_WORDS
from .sparse_kernels import column_product


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


class VectorIndex:
    """An immutable FAISS index over row-aligned vectors with the same search API on CPU and GPU."""

    def __init__(self, spec: IndexSpec, dimension: int, index: Optional[faiss.Index] = None, kind: str = "flat"):
        self.spec = spec
        self.dimension = dimension
        self._index = index
        self.kind = kind  # what was actually built (IVF below its minimum size is Flat)

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
        index = _clone(self._index)
        index.add(vectors)
        return VectorIndex(self.spec, self.dimension, index, self.kind)

    def write(self, path) -> None:
        """The index as faiss writes it (from the CPU copy of a GPU index); an empty index writes nothing."""
        if self._index is None:
            return
        cpu = faiss.index_gpu_to_cpu(self._index) if gpu_count() > 0 and self.kind != "hnsw" else self._index
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
        return 0 if self._index is None else int(self._index.ntotal)

    def vectors(self) -> np.ndarray:
        if self._index is None:
            return np.zeros((0, self.dimension), dtype=np.float32)
        cpu = faiss.index_gpu_to_cpu(self._index) if gpu_count() > 0 and self.kind != "hnsw" else self._index
        return cpu.reconstruct_n(0, cpu.ntotal)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of shape [n_queries, k']; k' = min(k, size); rows are -1 where fewer matched."""
        if self._index is None or k <= 0:
            rows = len(np.atleast_2d(queries))
            return np.zeros((rows, 0), np.float32), np.zeros((rows, 0), np.int64)
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dimension)
        return self._index.search(queries, min(k, self.size))


def _clone(index: faiss.Index) -> faiss.Index:
    if gpu_count() > 0 and not isinstance(index, faiss.IndexHNSW):
        return faiss.index_cpu_to_all_gpus(faiss.clone_index(faiss.index_gpu_to_cpu(index)))
    return faiss.clone_index(index)


LEXICAL_TERMS_VERSION = 1  # raise when lexical_terms changes: stored term counts of another version are not used
_WORD = re.compile(r"[0-9]+(?:[.,][0-9]+)*%?|[^\W_]+", re.UNICODE)


def lexical_terms(text: str) -> list[str]:
    """Lower-cased words and numbers (1,200 and 4.5% stay whole): the BM25 vocabulary."""
    return [match.group(0).casefold() for match in _WORD.finditer(text)]


@dataclass(frozen=True)
class TermCounts:
    """Texts tokenised once: their own vocabulary (term -> column, first-seen order), a [texts x vocabulary]
    count matrix and their lengths. A document's are computed once and kept with its segment, so a
    collection's BM25 index is assembled from them without tokenising the other documents again."""

    vocabulary: dict[str, int]
    counts: sparse.csr_matrix  # float32
    lengths: np.ndarray  # float32, terms per text

    @classmethod
    def of(cls, texts: Sequence[str]) -> "TermCounts":
        vocabulary: dict[str, int] = {}
        pointers, columns, counts = [0], [], []
        lengths = np.zeros(len(texts), dtype=np.float32)
        for row, text in enumerate(texts):
            terms = lexical_terms(text)
            lengths[row] = len(terms)
            frequencies: dict[int, int] = {}
            for term in terms:
                column = vocabulary.setdefault(term, len(vocabulary))
                frequencies[column] = frequencies.get(column, 0) + 1
            columns.extend(frequencies.keys())
            counts.extend(frequencies.values())
            pointers.append(len(columns))
        matrix = sparse.csr_matrix(
            (np.asarray(counts, np.float32), np.asarray(columns, np.int64), np.asarray(pointers, np.int64)),
            shape=(len(texts), len(vocabulary)),
        )
        return cls(vocabulary, matrix, lengths)

    def grouped(self, groups: Sequence[np.ndarray]) -> "TermCounts":
        """The counts of texts made by joining the rows of each group (a page from its passages): the sums."""
        pointers = np.cumsum([0] + [len(g) for g in groups])
        rows = np.concatenate(groups) if len(groups) else np.zeros(0, np.int64)
        summing = sparse.csr_matrix(
            (np.ones(len(rows), np.float32), rows.astype(np.int64), pointers), shape=(len(groups), self.counts.shape[0])
        )
        lengths = np.asarray([self.lengths[g].sum() for g in groups], dtype=np.float32)
        return TermCounts(self.vocabulary, (summing @ self.counts).tocsr(), lengths)


class BM25Index:
    """Okapi BM25 over a fixed list of texts, as a sparse term-document matrix (scipy CSR)."""

    def __init__(self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75):
        self._assemble([TermCounts.of(texts)], k1, b)

    @classmethod
    def of_parts(cls, parts: Sequence[TermCounts], k1: float = 1.2, b: float = 0.75) -> "BM25Index":
        """The index of the parts' texts in order: the same as one built from all the texts, with no text
        tokenised again (the vocabularies are merged in first-seen order, the counts re-columned)."""
        index = cls.__new__(cls)
        index._assemble(parts, k1, b)
        return index

    def _assemble(self, parts: Sequence[TermCounts], k1: float, b: float) -> None:
        self.k1, self.b = k1, b
        vocabulary: dict[str, int] = {}
        remapped = []  # each part's counts with its columns moved to the merged vocabulary's
        for part in parts:
            columns = np.fromiter((vocabulary.setdefault(term, len(vocabulary)) for term in part.vocabulary), np.int64,
                                  len(part.vocabulary))
            remapped.append((part.counts.data, columns[part.counts.indices], part.counts.indptr, part.counts.shape[0]))
        rows = sum(part.counts.shape[0] for part in parts)
        shape = (rows, max(1, len(vocabulary)))
        blocks = [sparse.csr_matrix((data, columns, pointers), shape=(count, shape[1])) for data, columns, pointers, count in remapped]
        tf = sparse.vstack(blocks, format="csr", dtype=np.float32) if blocks else sparse.csr_matrix(shape, dtype=np.float32)
        lengths = np.concatenate([part.lengths for part in parts]).astype(np.float32) if parts else np.zeros(0, np.float32)
        self.vocabulary = vocabulary
        documents_with_term = np.bincount(tf.indices, minlength=shape[1]).astype(np.float32)
        n = max(1, rows)
        self.idf = np.log1p((n - documents_with_term + 0.5) / (documents_with_term + 0.5)).astype(np.float32)
        average = float(lengths.mean()) if rows else 1.0
        # Term weights precomputed once: tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg)).
        norms = k1 * (1 - b + b * lengths / max(average, 1e-9))
        tf = tf.tocoo()
        weights = tf.data * (k1 + 1) / (tf.data + norms[tf.row])
        self._weights = sparse.csc_matrix((weights, (tf.row, tf.col)), shape=shape)
        self.size = rows

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """(row, score) of the k best texts for the query, best first; texts sharing no term are left out."""
        return self.best(self.scores(query), k)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every text for the query (0 where it shares no term with it).

        The query's stop words are dropped ("how", "was", "which"): rare in documents, so of high IDF, they
        would otherwise rank texts for matching the question's grammar instead of its content."""
        columns = self.query_columns(query)
        if not columns:
            return np.zeros(self.size, dtype=np.float32)
        return column_product(self._weights, np.asarray(columns), self.idf[columns])

    @staticmethod
    def best(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
        """(row, score) of the k highest positive scores, best first (ties: lower row first)."""
        if k <= 0:
            return []
        candidates = np.flatnonzero(scores > 0)
        if len(candidates) > k:
            candidates = candidates[np.argpartition(-scores[candidates], k - 1)[:k]]
        order = candidates[np.lexsort((candidates, -scores[candidates]))]
        return [(int(row), float(scores[row])) for row in order]

    def query_weight(self, query: str) -> float:
        """The score of a text holding each content word of the query once, at the average length: the sum of
        their IDFs (a word no text holds has the highest IDF there is). Dividing a score by it says how much
        of the query a text matches, whatever the query."""
        terms = {t for t in lexical_terms(query) if t not in STOP_WORDS}
        unseen = math.log1p((self.size + 0.5) / 0.5)
        return sum(float(self.idf[self.vocabulary[t]]) if t in self.vocabulary else unseen for t in terms)

    def query_columns(self, query: str) -> list[int]:
        """Vocabulary columns of the query's content words (stop words and unknown words left out)."""
        return sorted({self.vocabulary[t] for t in lexical_terms(query) if t in self.vocabulary and t not in STOP_WORDS})


def index_spec(settings) -> IndexSpec:
    """The IndexSpec for config.IndexSettings (same field names)."""
    return IndexSpec(**settings.model_dump())
