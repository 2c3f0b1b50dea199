"""Vector indexes (FAISS: Flat / IVF / HNSW, on one configured GPU when faiss sees it); the BM25 index is lexical.py.

They are derived data: built from the per-document segments (or read back from files verified against the
manifest, stored_indexes.py), so a crash can never leave an index out of step with the records it points at.
Row i of an index is row i of the table it was built for.

FAISS comes from one of two extras, which install the same `faiss` module over each other: `cpu` (faiss-cpu) or
`gpu` (faiss-gpu, CUDA 12). Where an index goes is `placement()`'s decision, with its reason; on a GPU it is one
device (`gpu_device`), its scratch memory and the indexes' total held to the configured budget, since Triton's
models share the machine.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np

_GPU_DISTRIBUTIONS = ("faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cu11")


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


try:
    import faiss
except ImportError as error:  # not installed, or a faiss-gpu whose CUDA libraries are missing: the cause is kept
    raise ImportError(
        f"FAISS cannot be imported ({error}): install the project with one of its extras, "
        "`pip install 'thinkserve[cpu]'` (faiss-cpu) or `pip install 'thinkserve[gpu]'` (faiss-gpu, CUDA 12)"
    ) from None
if _installed("faiss-cpu") and any(map(_installed, _GPU_DISTRIBUTIONS)):
    raise ImportError(
        "both faiss-cpu and faiss-gpu are installed: they write the same `faiss` module over each other; "
        "uninstall both, then install one extra: `thinkserve[cpu]` or `thinkserve[gpu]`"
    )

log = logging.getLogger("thinkserve.index")


@dataclass(frozen=True)
class IndexSpec:
    """Which FAISS index to build. IVF and HNSW are approximate; Flat is exact (inner product = cosine here)."""

    kind: str = "flat"  # flat | ivf | hnsw
    ivf_lists: int = 0  # 0: about 4 * sqrt(n)
    ivf_probe: int = 16
    ivf_min_vectors: int = 10_000  # below this IVF cannot train well: an exact Flat index is built instead
    hnsw_neighbors: int = 32
    hnsw_ef_search: int = 128
    use_gpu: bool = True  # when faiss-gpu sees a GPU (Flat and IVF only; HNSW stays on the CPU)
    gpu_device: int = 0  # the one GPU the indexes go on
    gpu_temp_memory_mb: int = 256  # faiss's scratch memory on it (once per process)
    gpu_memory_mb: int = 4096  # all GPU indexes of the process together; past it an index stays on the CPU. 0: no limit


# The fields of IndexSpec that decide where an index runs, not what it holds.
PLACEMENT_FIELDS = frozenset({"use_gpu", "gpu_device", "gpu_temp_memory_mb", "gpu_memory_mb"})


@functools.cache
def gpu_count() -> int:
    """GPUs faiss can use. A faiss-cpu build has no get_num_gpus; faiss-gpu without a GPU reports 0."""
    try:
        return int(faiss.get_num_gpus())
    except AttributeError:
        return 0


@dataclass(frozen=True)
class Placement:
    """Where an index runs, and why."""

    device: Optional[int]  # the GPU (faiss's number); None: the CPU
    reason: str


def placement(spec: IndexSpec, kind: str) -> Placement:
    """Where an index of `kind` goes under `spec`. A GPU only when asked for, when faiss-gpu sees one (without
    one, faiss-gpu's copy functions fail or return an EMPTY index) and when the configured device is among them."""
    if kind == "hnsw":
        return Placement(None, "HNSW has no GPU index in faiss")
    if not spec.use_gpu:
        return Placement(None, "index.use_gpu is off")
    if not hasattr(faiss, "StandardGpuResources"):
        return Placement(None, "this faiss has no GPU support (faiss-cpu; the `gpu` extra installs faiss-gpu)")
    count = gpu_count()
    if count == 0:
        return Placement(None, "faiss-gpu sees no GPU")
    if spec.gpu_device >= count:
        return Placement(None, f"index.gpu_device is {spec.gpu_device} but faiss sees {count} GPU(s)")
    return Placement(spec.gpu_device, f"GPU {spec.gpu_device} of the {count} faiss sees")


@functools.cache
def _announce(reason: str, warning: bool) -> None:
    """Say once per process where indexes go and why (a CPU choice on a GPU machine is a warning)."""
    log.log(logging.WARNING if warning else logging.INFO, "FAISS indexes: %s", reason)


class _DeviceBudget:
    """Device memory the GPU indexes of this process hold together: reserved before an index is copied there,
    given back when faiss's GPU index object is freed."""

    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes  # 0: no limit
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> bool:
        with self._lock:
            if self.limit and self.used + nbytes > self.limit:
                return False
            self.used += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes

    def hold(self, owner: object, nbytes: int) -> None:
        """Give `nbytes` back once `owner` (the GPU index) is garbage."""
        weakref.finalize(owner, self.release, nbytes)


@functools.cache
def _budget(device: int, limit_mb: int) -> _DeviceBudget:
    return _DeviceBudget(limit_mb * 2**20)


@functools.cache
def device_lock(device: int) -> threading.Lock:
    """One lock per GPU, held around every use of its FAISS indexes: they share the device's StandardGpuResources
    (scratch memory, CUDA streams), which FAISS documents as not safe for concurrent use, while the retrieval pool
    searches from several threads at once (the question and its sub-questions, concurrent queries)."""
    return threading.Lock()


@functools.cache
def _gpu_resources(device: int, temp_memory_mb: int):
    """One StandardGpuResources per device and process (each holds its own scratch memory and CUDA streams)."""
    resources = faiss.StandardGpuResources()
    resources.setTempMemory(temp_memory_mb * 2**20)
    return resources


def device_bytes(index: faiss.Index) -> int:
    """What an index's copy on a GPU holds, about: its vectors (float32) and, for IVF, its centroids."""
    nbytes = int(index.ntotal) * int(index.d) * 4
    if isinstance(index, faiss.IndexIVF):
        nbytes += int(index.nlist) * int(index.d) * 4
    return nbytes


def place(index: faiss.Index, spec: IndexSpec, kind: str) -> tuple[faiss.Index, Optional[int]]:
    """`index` (a CPU index) where `placement` puts it: the same index, or its copy on the configured GPU when the
    device budget has room for it (otherwise it stays on the CPU, with a warning once). Returns (index, device)."""
    where = placement(spec, kind)
    if where.device is None:
        _announce(where.reason, warning=kind != "hnsw" and spec.use_gpu and gpu_count() > 0)
        return index, None
    nbytes = device_bytes(index)
    budget = _budget(where.device, spec.gpu_memory_mb)
    if not budget.reserve(nbytes):
        _announce(f"index.gpu_memory_mb ({spec.gpu_memory_mb}) is held by other indexes: indexes past it stay on the CPU",
                  warning=True)
        return index, None
    try:
        with device_lock(where.device):
            on_gpu = faiss.index_cpu_to_gpu(_gpu_resources(where.device, spec.gpu_temp_memory_mb), where.device, index)
    except BaseException:
        budget.release(nbytes)
        raise
    budget.hold(on_gpu, nbytes)
    _announce(where.reason, warning=False)
    return on_gpu, where.device


def tail_limit(base_size: int) -> int:
    """How many appended vectors an index keeps in its exact tail before they join its main index: a tenth of
    it (at least 4,096), at most 20,000 (a Flat search of 20,000 vectors of 384 takes about 2 ms on 2 cores)."""
    return min(20_000, max(4_096, base_size // 10))


# Past this share of its main index removed (deleted documents' vectors), an index is rebuilt from the rest.
MAX_REMOVED_FRACTION = 0.25


class VectorIndex:
    """An immutable FAISS index over row-aligned vectors with the same search API on CPU and GPU.

    Appending (a commit adding a document) does not copy the index: the new one shares it and keeps the vectors
    appended since in an exact Flat *tail*, searched beside it, until the tail reaches tail_limit and is merged
    in (a copy of the index, once per tenth of its size). Copying the index per commit cost 0.5 s of a 1 s
    commit at 100,000 chunks (benchmarks/results/incremental_commit.md).

    Removing rows (a deleted or replaced document's) does not rebuild it either: the new index shares the old
    one and skips the removed ids in its searches (a FAISS ID selector), the rows after them moving up; past
    MAX_REMOVED_FRACTION it is rebuilt from the rest. Rebuilding on every delete took a second at 100,000
    chunks with Flat, and minutes at a million with HNSW, holding the collection's write lock."""

    def __init__(
        self, spec: IndexSpec, dimension: int, index: Optional[faiss.Index] = None, kind: str = "flat",
        tail: Optional[np.ndarray] = None, removed: Optional[np.ndarray] = None, device: Optional[int] = None,
    ):
        self.spec = spec
        self.dimension = dimension
        self._index = index
        self.kind = kind  # what was actually built (IVF below its minimum size is Flat)
        self.device = device  # the GPU the main index is on (place()); None: the CPU. The tail is always on the CPU.
        self._tail_vectors = tail if tail is not None and len(tail) else None  # appended since, not in _index
        self._tail: Optional[faiss.Index] = None
        if self._tail_vectors is not None:
            self._tail = faiss.IndexFlatIP(dimension)
            self._tail.add(self._tail_vectors)
        # ids of _index no longer in the table (sorted), and the selector that keeps searches off them
        self._removed = np.asarray(removed, dtype=np.int64) if removed is not None and len(removed) else None
        self._selector = None
        if self._removed is not None:
            live = np.ones(int(index.ntotal), dtype=bool)
            live[self._removed] = False
            self._bitmap = np.packbits(live, bitorder="little")  # FAISS reads bit i & 7 of byte i >> 3; kept alive here
            self._selector = faiss.IDSelectorBitmap(len(self._bitmap), faiss.swig_ptr(self._bitmap))  # n: bytes

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
        index, device = place(index, spec, kind)
        return cls(spec, dimension, index, kind, device=device)

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
            return VectorIndex(self.spec, self.dimension, self._index, self.kind, tail, self._removed, self.device)
        merged, device = self._merged(tail)
        return VectorIndex(self.spec, self.dimension, merged, self.kind, removed=self._removed, device=device)

    def without(self, start: int, stop: int) -> "VectorIndex":
        """A new index without rows [start, stop) (a deleted document's): the rows after them move up. The old
        index stays usable by running queries."""
        stop = min(stop, self.size)
        if self._index is None or stop <= start:
            return self
        held = self._main_size
        tail = self._tail_vectors
        if stop > held:
            tail = np.delete(tail, np.s_[max(0, start - held) : stop - held], axis=0)
        removed = self._removed
        if start < held:
            gone = self._live_ids()[start : min(stop, held)]
            removed = gone if removed is None else np.union1d(removed, gone)
        total = int(self._index.ntotal)
        # no ID selectors on a GPU: an index there is rebuilt from its live vectors at once
        if removed is not None and (len(removed) > MAX_REMOVED_FRACTION * total or self.device is not None):
            live = np.ones(total, dtype=bool)
            live[removed] = False
            kept = self._main_vectors()[live]
            return VectorIndex.build(self.spec, kept if tail is None else np.concatenate([kept, tail]), self.dimension)
        return VectorIndex(self.spec, self.dimension, self._index, self.kind, tail, removed, self.device)

    @property
    def removed_ids(self) -> np.ndarray:
        """Ids of the main index no longer in the table (what `write` stores beside the index)."""
        return self._removed if self._removed is not None else np.zeros(0, dtype=np.int64)

    @property
    def _main_size(self) -> int:
        return int(self._index.ntotal) - (0 if self._removed is None else len(self._removed))

    def _live_ids(self) -> np.ndarray:
        ids = np.arange(int(self._index.ntotal), dtype=np.int64)
        return ids if self._removed is None else np.delete(ids, self._removed)

    def _cpu_index(self) -> faiss.Index:
        """The main index on the CPU: itself, or a copy of it from its GPU."""
        if self.device is None:
            return self._index
        with device_lock(self.device):
            return faiss.index_gpu_to_cpu(self._index)

    def _main_vectors(self) -> np.ndarray:
        cpu = self._cpu_index()
        return cpu.reconstruct_n(0, cpu.ntotal)

    def _merged(self, tail: Optional[np.ndarray]) -> tuple[faiss.Index, Optional[int]]:
        """A copy of the main index with `tail` added to it, placed as `build` places an index; (index, device)."""
        if tail is None:
            return self._index, self.device
        index = faiss.clone_index(self._index) if self.device is None else self._cpu_index()
        index.add(tail)
        return place(index, self.spec, self.kind)

    def write(self, path) -> None:
        """The index as faiss writes it (from the CPU copy of a GPU index), its tail merged in, its removed ids
        still in it (`removed_ids`, which read() takes back); an empty index writes nothing."""
        if self._index is None:
            return
        cpu = self._cpu_index()
        if self._tail_vectors is not None:
            cpu = faiss.clone_index(cpu) if cpu is self._index else cpu
            cpu.add(self._tail_vectors)
        faiss.write_index(cpu, str(path))

    @classmethod
    def read(cls, spec: IndexSpec, path, kind: str, removed: Optional[np.ndarray] = None) -> "VectorIndex":
        """An index `write` wrote (with the `removed_ids` it had then), with the search settings of `spec`
        (efSearch, nprobe) and on a GPU as `build` puts it. Raises RuntimeError for a file faiss cannot read
        (truncated, corrupt), ValueError for one of another kind or removed ids it does not hold."""
        index = faiss.read_index(str(path))
        found = "hnsw" if isinstance(index, faiss.IndexHNSW) else "ivf" if isinstance(index, faiss.IndexIVF) else "flat"
        if found != kind:
            raise ValueError(f"{path} holds a {found} index, not {kind}")
        if kind == "hnsw":
            index.hnsw.efSearch = spec.hnsw_ef_search
        elif kind == "ivf":
            index.nprobe = spec.ivf_probe
        if removed is not None and len(removed) and not (np.all(np.diff(removed) > 0) and 0 <= removed[0] and removed[-1] < index.ntotal):
            raise ValueError(f"{path}: its removed ids are not sorted ids of its {index.ntotal} vectors")
        if placement(spec, kind).device is not None and removed is not None and len(removed):
            # no ID selectors on a GPU: the live vectors, rebuilt there
            return cls.build(spec, np.delete(index.reconstruct_n(0, index.ntotal), removed, axis=0), int(index.d))
        index, device = place(index, spec, kind)
        return cls(spec, int(index.d), index, kind, removed=removed, device=device)

    def set_ef_search(self, ef_search: int) -> None:
        """HNSW's search breadth (recall against time), for indexes already built; other kinds ignore it."""
        if self._index is not None and self.kind == "hnsw":
            self._index.hnsw.efSearch = ef_search

    @property
    def size(self) -> int:
        main = 0 if self._index is None else self._main_size
        return main + (0 if self._tail_vectors is None else len(self._tail_vectors))

    def vectors(self) -> np.ndarray:
        if self._index is None:
            return np.zeros((0, self.dimension), dtype=np.float32)
        main = self._main_vectors()
        if self._removed is not None:
            main = np.delete(main, self._removed, axis=0)
        return main if self._tail_vectors is None else np.concatenate([main, self._tail_vectors])

    def _search_main(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The main index's best k among its live ids, as rows of the table (removed ids skipped); a GPU index under
        its device's lock."""
        if self.device is not None:
            with device_lock(self.device):
                return self._search_index(queries, k)
        return self._search_index(queries, k)

    def _search_index(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self._selector is None:
            return self._index.search(queries, k)
        if self.kind == "hnsw":
            params = faiss.SearchParametersHNSW(sel=self._selector, efSearch=self._index.hnsw.efSearch)
        elif self.kind == "ivf":
            params = faiss.SearchParametersIVF(sel=self._selector, nprobe=self._index.nprobe)
        else:
            params = faiss.SearchParameters(sel=self._selector)
        scores, ids = self._index.search(queries, k, params=params)
        rows = np.where(ids >= 0, ids - np.searchsorted(self._removed, ids), -1)
        return scores, rows

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of shape [n_queries, k']; k' = min(k, size); rows are -1 where fewer matched."""
        if self._index is None or k <= 0:
            rows = len(np.atleast_2d(queries))
            return np.zeros((rows, 0), np.float32), np.zeros((rows, 0), np.int64)
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dimension)
        k = min(k, self.size)
        main = self._main_size
        if main:
            scores, rows = self._search_main(queries, min(k, main))
        else:  # every vector of the main index removed: only the tail holds any
            scores, rows = np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        if self._tail is None:
            return scores, rows
        tail_scores, tail_rows = self._tail.search(queries, min(k, self._tail.ntotal))
        scores = np.concatenate([np.where(rows >= 0, scores, -np.inf), tail_scores], axis=1)
        rows = np.concatenate([rows, tail_rows + main], axis=1)
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # ties: the main index's rows first
        scores, rows = np.take_along_axis(scores, best, axis=1), np.take_along_axis(rows, best, axis=1)
        missing = ~np.isfinite(scores)
        return np.where(missing, 0, scores).astype(np.float32), np.where(missing, -1, rows)


def index_spec(settings) -> IndexSpec:
    """The IndexSpec for config.IndexSettings (same field names)."""
    return IndexSpec(**settings.model_dump())
