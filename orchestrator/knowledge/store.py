"""Collections on disk: a manifest naming one segment per document, switched atomically per document.

    <data_dir>/collections/<name>/manifest.json    {"generation": N, "documents": [{"name", "segment"}, ...]}
    <data_dir>/collections/<name>/seg-<id>-<nonce>/ one document (see segments.py)
    <data_dir>/collections/<name>/indexes-<generation>-<nonce>/ HNSW / IVF indexes of the manifest's documents,
                                                    so a restart need not build them (stored_indexes.py)

Adding, replacing or deleting a document writes any new segment completely (fsynced) beside the live ones,
then replaces manifest.json (os.replace of a fsynced file, then a fsync of the folder). A crash at any moment
leaves the old manifest or the new one, so the collection holds the document completely or not at all;
folders no manifest names (staging leftovers, dropped segments) are removed when the collection is opened or
after a commit (dropped segments once `retain_dropped_s` has passed, below).
Queries read the Snapshot they started with: a commit never changes a snapshot, it makes a new one.

One process writes a data folder (writer_lock.py); read replicas open it read-only, never remove anything, and
follow the manifest's new generations (Collection.follow). So that a replica can still read what it serves, the
writer removes a dropped segment only once it has been unreferenced for `retain_dropped_s`, and writes a
generation's stored indexes before the manifest that names them.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterator, Mapping, Optional, Sequence, TypeVar

import numpy as np
from scipy import sparse

from ..errors import AlreadyExistsError, InvalidRequestError, NotFoundError, ReadOnlyError
from . import stored_indexes
from .collector import keep_out_of_collections
from .graph import KnowledgeGraph, appended_graph, build_graph, graph_without, removable
from .indexes import IndexSpec, VectorIndex
from .lexical import BM25Index
from .reaper import REAPER
from .segments import DocumentRecord, EvidenceRecord, PageRecord, Segment, fsync_path, write_durably
from .sentences import RecordSentences
from .writer_lock import WriterLock

log = logging.getLogger("thinkserve.knowledge")
_GRAPH_PARTS = ("graph", "evidence_rows", "node_evidence")  # made from the previous snapshot's (Snapshot._graph_bases)
T = TypeVar("T")
COLLECTION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MANIFEST = "manifest.json"
_STAGING_PREFIX = ".staging-"
_DELETED_PREFIX = ".deleted-"  # a collection being removed: renamed away first, so it vanishes atomically
# a commit's snapshot of this many evidence rows or more is published before its graph is built (as
# config.StorageSettings.publish_before_graph_rows, which servers pass)
PUBLISH_BEFORE_GRAPH_ROWS = 20_000
_LEXICAL = ("lexical", "page_lexical")  # a snapshot's BM25 indexes, which the next snapshot's extend


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    segment: str


@dataclass(frozen=True)
class GraphView:
    """A graph with its [nodes x evidence rows] table, as graph expansion reads them, and the generation of the
    snapshot whose documents it holds (a newer snapshot may read it while its own graph is built)."""

    graph: KnowledgeGraph
    node_evidence: sparse.csr_matrix
    nodes_per_evidence: np.ndarray
    generation: int

    def derived(self, key: Hashable, make: Callable[[], T]) -> T:
        """What queries derive from this view alone (the hub mask of a setting, the mean's divisors), made once
        and kept with it: each was a pass over every node or evidence row per query."""
        made = self.__dict__.setdefault("_derived", {})
        if key not in made:
            made[key] = make()  # two queries at once may both make it: the same value
        return made[key]

    def widened(self, rows: int) -> "GraphView":
        """The same graph over `rows` evidence rows, the rows beyond its own reached by no node (documents
        appended since)."""
        held = self.node_evidence.shape[1]
        if rows == held:
            return self
        table = sparse.csr_matrix((self.node_evidence.data, self.node_evidence.indices, self.node_evidence.indptr),
                                  shape=(self.node_evidence.shape[0], rows))
        counts = np.concatenate([self.nodes_per_evidence, np.zeros(rows - held, dtype=self.nodes_per_evidence.dtype)])
        return GraphView(self.graph, table, counts, self.generation)


def _built_once(build: Callable[["Snapshot"], T]) -> T:
    """A snapshot's lazily built structure, built once under a lock of its own even when several threads ask at
    once (functools.cached_property would let each of them build it). One lock per structure: a query asking
    for the BM25 index must not wait behind the graph a background thread is building (structures build only
    those they depend on, so the locks are taken in one order)."""
    name = build.__name__

    def get(self: "Snapshot"):
        try:
            return self.__dict__[name]
        except KeyError:
            with self._lock:
                lock = self._part_locks.setdefault(name, threading.RLock())
            with lock:
                if name not in self.__dict__:
                    self.__dict__[name] = build(self)
                return self.__dict__[name]

    get.__doc__ = build.__doc__
    return property(get)  # type: ignore[return-value]


class Snapshot:
    """One immutable state of a collection: its documents' records merged, with their indexes.

    The vector indexes are built when the snapshot is made (appending to the previous snapshot's when the
    commit only added a document, or read from disk at open); the graph and the BM25 indexes are built on first
    use, or ahead of it by warm() in the background.
    """

    def __init__(
        self, generation: int, segments: Sequence[Segment], spec: IndexSpec, base: Optional["Snapshot"] = None,
        stored: Mapping[str, VectorIndex] = {}, previous: Optional["Snapshot"] = None,
    ):
        """`base`: the previous snapshot, whose vector indexes are extended when this one only appends documents;
        `stored`: indexes read from disk for these segments (stored_indexes.py), used where their size fits;
        `previous` (default: `base`): the snapshot this one follows, whose BM25 runs it reuses (lexical.py)."""
        self.generation = generation
        self.segments = tuple(segments)
        self.spec = spec
        self.documents: dict[str, DocumentRecord] = {s.document.name: s.document for s in self.segments}
        self.evidence = EvidenceRows(self.segments)  # each segment's records are read when a row of it is
        self.pages: list[PageRecord] = [p for s in self.segments for p in s.pages]
        self._segment_of_document = {s.document.document_id: s for s in self.segments}
        self._lock = threading.Lock()  # guards _part_locks
        self._part_locks: dict[str, threading.RLock] = {}  # each lazy structure is built once (_built_once)
        # a background thread is building the lazy structures (an opened collection's first snapshot): a query may
        # go without the graph meanwhile instead of waiting for it (retrieval.py)
        self.building_in_background = False
        self.index_notes: list[str] = []  # why a stored index was not used
        previous = previous or base
        # while this snapshot's graph is built in the background, queries may read the newest built graph of the
        # snapshots it extends by appending documents (their evidence rows are a prefix of these): graph_view()
        self._graph_fallback: Optional[GraphView] = None
        # what this one's graph, evidence row table and node x evidence table are made from when it appends or
        # removes documents: (the segments they were made for, the structure), the previous snapshot's, or those it
        # was to be made from when it was never built
        self._graph_bases: dict[str, tuple[tuple[Segment, ...], object]] = {}
        if previous is not None:
            for part in _GRAPH_PARTS:
                built = previous.__dict__.get(part)
                source = (previous.segments, built) if built is not None else previous._graph_bases.get(part)
                if source is not None and _derivable(source[0], self.segments) and (part != "graph" or _removable(source, self.segments)):
                    self._graph_bases[part] = source
            if _is_prefix(previous.segments, self.segments):
                self._graph_fallback = previous._own_graph_view if previous.built("graph_built") else previous._graph_fallback
        # the BM25 indexes this one's are built from: the previous snapshot's, or those it was to be built from
        # when it was never built (never the snapshot itself: a chain of snapshots would stay in memory)
        self._lexical_bases: dict[str, BM25Index] = {
            part: index for part in _LEXICAL
            if previous is not None and (index := previous.__dict__.get(part) or previous._lexical_bases.get(part)) is not None
        }
        appended = self.segments[len(base.segments) :] if base is not None and _is_prefix(base.segments, self.segments) else None

        # An entity's vector is its first document's that has one (ingest.entity_min_mentions leaves zeros).
        # Relations searchable by vector: those of the documents ingested with relation vectors (only
        # retrieval.relation_seeds reads them, so the ingestor embeds them only when it is on). After an
        # append both tables extend the base's (a commit reads only its own document's keys).
        added = appended if appended is not None else self.segments
        self._entity_table = FirstRows.of(
            [s.entity_keys for s in added], [s.embedded_entity_rows for s in added], base._entity_table if appended is not None else None,
        )
        self._relation_table = FirstRows.of(
            [s.relation_keys if len(s.relation_vectors) else () for s in added], None,
            base._relation_table if appended is not None else None,
        )
        entities, relations = self._entity_table, self._relation_table
        self.entity_keys, self.relation_keys = entities.keys, relations.keys
        if appended is not None and base is not None:
            self.evidence_index = base.evidence_index.extended(_stack(s.evidence_vectors for s in appended))
            if not entities.moved:
                self.entity_index = base.entity_index.extended(entities.vectors(self.segments, "entity", len(base.entity_keys)))
            else:  # the new document gave a vector to an entity that had none
                self.entity_index = self._build(entities.vectors(self.segments, "entity"))
            self.relation_index = base.relation_index.extended(relations.vectors(self.segments, "relation", len(base.relation_keys)))
            self.page_indexes = {
                family: index.extended(_stack(s.page_vectors.get(family, ()) for s in appended))
                for family, index in base.page_indexes.items()
            }
            for family in _families(appended) - set(self.page_indexes):
                self.page_indexes[family] = self._build(_stack(s.page_vectors.get(family, ()) for s in self.segments))
        elif previous is not None and (removal := _removal(previous.segments, self.segments)) is not None:
            # a delete or replacement: the previous snapshot's evidence and page indexes less the removed documents'
            # rows (no rebuild: see VectorIndex.without), then the appended documents'; the entity and relation
            # tables are made again (their key order is the remaining documents' first-seen order)
            removed, after = removal
            self.evidence_index = _without(previous.evidence_index, [len(s.evidence) for s in previous.segments], removed
                                           ).extended(_stack(s.evidence_vectors for s in after))
            self.entity_index = self._build(entities.vectors(self.segments, "entity"))
            self.relation_index = self._build(relations.vectors(self.segments, "relation"))
            families = _families(self.segments)
            self.page_indexes = {
                family: _without(index, [len(s.page_vectors.get(family, ())) for s in previous.segments], removed
                                 ).extended(_stack(s.page_vectors.get(family, ()) for s in after))
                for family, index in previous.page_indexes.items() if family in families
            }
            for family in families - set(self.page_indexes):
                self.page_indexes[family] = self._build(_stack(s.page_vectors.get(family, ()) for s in self.segments))
        else:
            self.evidence_index = self._table(
                stored, "evidence", len(self.evidence), lambda: _stack(s.evidence_vectors for s in self.segments)
            )
            self.entity_index = self._table(stored, "entity", len(entities), lambda: entities.vectors(self.segments, "entity"))
            self.relation_index = self._table(stored, "relation", len(relations), lambda: relations.vectors(self.segments, "relation"))
            self.page_indexes = {
                family: self._table(
                    stored, f"page-{family}", sum(len(s.page_vectors.get(family, ())) for s in self.segments),
                    lambda family=family: _stack(s.page_vectors.get(family, ()) for s in self.segments),
                )
                for family in _families(self.segments)
            }
        if self.evidence_index.size != len(self.evidence):
            raise RuntimeError(f"snapshot {generation}: {self.evidence_index.size} vectors for {len(self.evidence)} evidence records")

    @property
    def vector_tables(self) -> dict[str, VectorIndex]:
        """Every vector index by table name (as stored_indexes writes them)."""
        tables = {"evidence": self.evidence_index, "entity": self.entity_index, "relation": self.relation_index}
        return tables | {f"page-{family}": index for family, index in self.page_indexes.items()}

    def _table(self, stored: Mapping[str, VectorIndex], table: str, size: int, vectors: Callable[[], np.ndarray]) -> VectorIndex:
        """The stored index of a table when it holds exactly its `size` vectors, else one built from them."""
        index = stored.get(table)
        if index is not None and index.size == size:
            return index
        if index is not None:
            self.index_notes.append(f"the stored {table} index holds {index.size} vectors, the documents {size}: rebuilt")
        return self._build(vectors())

    def _build(self, vectors: np.ndarray) -> VectorIndex:
        return VectorIndex.build(self.spec, vectors, vectors.shape[1] if vectors.ndim == 2 and vectors.shape[1] else 0)

    @property
    def dimension(self) -> int:
        return self.evidence_index.dimension

    @_built_once
    def graph(self) -> KnowledgeGraph:
        """The documents' graph: the previous snapshot's with the appended documents merged in, or the removed
        documents' share taken out (graph.py's appended_graph and graph_without, which equal a build from
        scratch), else built from every document."""
        base = self._graph_bases.pop("graph", None)
        if base is not None:
            segments, graph = base
            if _is_prefix(segments, self.segments):
                return appended_graph(graph, (segment.graph_input() for segment in self.segments[len(segments) :]))
            removed, after = _removal(segments, self.segments)
            try:
                made = graph_without(
                    graph, [segments[number].graph_input() for number in removed],
                    lambda document_id: self._segment_of_document[document_id].graph_input(),
                    [segment.graph_input() for segment in after],
                )
            except (OSError, ValueError) as error:  # a removed document's records no longer readable
                log.warning("snapshot %d: the graph is built from every document (%s)", self.generation, error)
                made = None
            if made is not None:
                return made
        return build_graph(segment.graph_input() for segment in self.segments)

    @_built_once
    def lexical(self) -> BM25Index:
        """BM25 over the evidence, assembled from each document's token counts: a commit tokenises only the
        document it adds, and reuses the previous snapshot's runs (merging costs about the document)."""
        return BM25Index.of_parts([segment.term_counts for segment in self.segments], base=self._lexical_bases.pop("lexical", None))

    @_built_once
    def page_of_row(self) -> np.ndarray:
        """Each evidence row's text page: the number of its (document, page) in `page_rows`, in first-seen order.
        A source without pages (Markdown, plain text) is one page. A segment is one document."""
        numbers, offset = [], 0
        for segment in self.segments:
            numbering = segment.page_numbering
            numbers.append(numbering + offset)
            offset += int(numbering.max()) + 1 if len(numbering) else 0
        return np.concatenate(numbers) if numbers else np.zeros(0, dtype=np.int64)

    @functools.cached_property
    def page_rows(self) -> list[np.ndarray]:
        """The evidence rows on each text page, in reading order (what a page's lexical score reaches)."""
        pages = self.page_of_row
        order = np.argsort(pages, kind="stable")
        return np.split(order, np.flatnonzero(np.diff(pages[order])) + 1) if len(order) else []

    @_built_once
    def page_lexical(self) -> BM25Index:
        """BM25 over whole pages (all their passages and units): on real documents the page is the strongest
        lexical unit there is, since a question's words are spread over the page that answers it."""
        return BM25Index.of_parts(
            [segment.page_term_counts for segment in self.segments], base=self._lexical_bases.pop("page_lexical", None)
        )

    @_built_once
    def evidence_rows(self) -> dict[str, int]:
        """Evidence id -> its row in `evidence` and in the evidence index (the previous snapshot's, copied, less
        the removed documents' ids, with the rows from the first removed or appended document on numbered again)."""
        base = self._graph_bases.pop("evidence_rows", None)
        if base is None:
            return {record.evidence_id: row for row, record in enumerate(self.evidence)}
        segments, rows = base
        removed, _ = _removal(segments, self.segments) or ([], ())
        rows = dict(rows)
        for number in removed:
            for record in segments[number].evidence:
                del rows[record.evidence_id]
        first = min(removed, default=len(segments))  # the segments before it keep their rows
        start = int(self._evidence_starts[first])
        for offset, record in enumerate(itertools.chain.from_iterable(s.evidence for s in self.segments[first:])):
            rows[record.evidence_id] = start + offset
        return rows

    @functools.cached_property
    def entity_key_set(self) -> frozenset[str]:
        return frozenset(self.entity_keys)

    @_built_once
    def node_evidence(self) -> sparse.csr_matrix:
        """[graph nodes x evidence rows], 1 where the node (entity or unit) comes from that chunk or unit. When the
        graph was made from the one the previous snapshot's table was made for (by appending or removing
        documents), that table's rows are reused for the nodes whose rows the graph kept (their columns
        renumbered); only the other nodes' rows are made again."""
        graph, rows = self.graph, self.evidence_rows
        base = self._graph_bases.pop("node_evidence", None)
        carried = graph.carried_from
        incremental = (base is not None and carried is not None
                       and carried[0] == tuple(segment.document.document_id for segment in base[0]))
        kept = carried[1] if incremental else np.full(graph.node_count, -1)
        nodes = np.flatnonzero(kept < 0)
        pointers, columns = [0], []
        for node in nodes.tolist():
            columns.extend(rows[e] for e in graph.nodes.evidence[node] if e in rows)
            pointers.append(len(columns))
        data = np.ones(len(columns), dtype=np.float64)
        made = sparse.csr_matrix((data, columns, pointers), shape=(len(nodes), len(self.evidence)))
        if not incremental:
            return made
        segments, old = base
        carried_nodes = np.flatnonzero(kept >= 0)
        unchanged = old[kept[carried_nodes]]
        moved_to = self._evidence_row_map(segments)[unchanged.indices]
        if len(moved_to) and moved_to.min() < 0:
            raise RuntimeError(f"snapshot {self.generation}: a kept graph row names a removed document's evidence")
        unchanged = sparse.csr_matrix((unchanged.data, moved_to, unchanged.indptr), shape=(len(carried_nodes), len(self.evidence)))
        order = np.argsort(np.concatenate([carried_nodes, nodes]), kind="stable")
        table = sparse.vstack([unchanged, made], format="csr")[order]
        table.sort_indices()
        return table

    def _evidence_row_map(self, segments: Sequence[Segment]) -> np.ndarray:
        """For each evidence row of `segments` (an earlier snapshot's), its row here, or -1 (a removed document)."""
        starts = {id(segment): int(start) for segment, start in zip(self.segments, self._evidence_starts)}
        return np.concatenate([
            np.arange(len(segment.evidence), dtype=np.int64) + starts[id(segment)] if id(segment) in starts
            else np.full(len(segment.evidence), -1, dtype=np.int64)
            for segment in segments
        ] or [np.zeros(0, dtype=np.int64)])

    def built(self, part: str) -> bool:
        """Whether a lazily built structure ("graph", "node_evidence", "lexical", ...) exists yet."""
        return part in self.__dict__

    def warm_in_background(self, current: Callable[[], bool], name: str) -> None:
        """warm() on a thread of its own, with `building_in_background` set until it ends."""
        def run() -> None:
            try:
                self.warm(current)
            finally:
                self.building_in_background = False

        self.building_in_background = True
        threading.Thread(target=run, name=name, daemon=True).start()

    def warm(self, current: Callable[[], bool] = lambda: True, graph: bool = True) -> None:
        """Build what queries build on first use (BM25 indexes, page tables and, with `graph`, the graph), so
        none of them waits: a commit's snapshot before it is published, an opened one in the background, which
        stops early once `current()` says a commit superseded it. The new segments' vectors are faulted in too.
        What it built (and its records) is then kept out of the garbage collector's walks (collector.py)."""
        for part in ("lexical", "page_lexical", "page_rows", "entity_key_set"):
            if not current():
                return
            getattr(self, part)
        for segment in self.segments:
            if not current():
                return
            segment.fault_in()
        if graph and current():
            self.warm_graph()
        keep_out_of_collections()

    def graph_extends_previous(self) -> bool:
        """Whether its graph is (to be) made from the previous snapshot's by appending or removing documents, not
        built from every document."""
        return "graph" in self._graph_bases or (self.built("graph") and self.graph.carried_from is not None)

    def warm_graph(self) -> None:
        """Build the graph and its evidence table; from then on queries read this snapshot's own graph."""
        self.graph_built
        self._graph_fallback = None

    @_built_once
    def graph_built(self) -> bool:
        """The graph and its tables, built (a part `built()` can ask for)."""
        self._own_graph_view
        return True

    @functools.cached_property
    def _own_graph_view(self) -> GraphView:
        return GraphView(self.graph, self.node_evidence, self.nodes_per_evidence, self.generation)

    def lend_graph(self, older: "Snapshot") -> None:
        """Read `older`'s built graph until this snapshot's own is built, and build it by extending `older`'s,
        if this one extends `older` by appending and the graph it has now is older."""
        fallback = self._graph_fallback
        if (older.built("graph_built") and not self.built("graph") and _is_prefix(older.segments, self.segments)
                and (fallback is None or fallback.generation < older.generation)):
            self._graph_fallback = older._own_graph_view
            self._graph_bases = {part: (older.segments, older.__dict__[part]) for part in _GRAPH_PARTS}

    def graph_view(self) -> Optional[GraphView]:
        """What graph expansion reads: this snapshot's graph (built now if need be), or, while it is being built
        in the background, the newest built graph of the snapshots this one extends by appending documents
        (the documents appended since are not in it), or None when there is none (after an opening, or a delete
        the previous graph could not be cut down for): the query goes without the graph rather than wait for it."""
        if not self.building_in_background or self.built("graph_built"):
            return self._own_graph_view
        fallback = self._graph_fallback
        return fallback.widened(len(self.evidence)) if fallback is not None else None

    @functools.cached_property
    def nodes_per_evidence(self) -> np.ndarray:
        """How many graph nodes each evidence row gave (column sums of node_evidence)."""
        return np.asarray(self.node_evidence.sum(axis=0)).ravel()

    def evidence_vectors(self, rows: Sequence[int]) -> np.ndarray:
        """The stored embeddings of evidence rows [n, d] (read from the segments, not the index)."""
        return _gather(self.segments, lambda s: s.evidence_vectors, self._evidence_starts, rows, self.dimension)

    def page_vectors(self, family: str, rows: Sequence[int]) -> np.ndarray:
        """Page-image embeddings of one encoder family for page rows; a page that family lacks is zeros."""
        dimension = self.page_indexes[family].dimension if family in self.page_indexes else 0
        return _gather(self.segments, lambda s: s.page_vectors.get(family), self._page_starts, rows, dimension)

    def page_image(self, page: PageRecord) -> bytes:
        segment = self._segment_of_document[page.document_id]
        if segment.folder is None:
            raise FileNotFoundError(f"document {page.document_id} has no folder on disk")
        return (segment.folder / page.image).read_bytes()

    @property
    def _evidence_starts(self) -> np.ndarray:
        return self.evidence.starts

    @functools.cached_property
    def _page_starts(self) -> np.ndarray:
        return np.cumsum([0] + [len(s.pages) for s in self.segments])

    def search_evidence(self, vector: np.ndarray, k: int) -> list[tuple[EvidenceRecord, float]]:
        """Chunks and units by cosine similarity (embeddings are L2-normalised), best first."""
        scores, rows = self.evidence_index.search(vector, k)
        return [(self.evidence[row], float(score)) for row, score in zip(rows[0], scores[0]) if row >= 0]

    def search_lexical(self, question: str, k: int) -> list[tuple[EvidenceRecord, float]]:
        return [(self.evidence[row], score) for row, score in self.lexical.search(question, k)]

    def search_entities(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Entity keys by similarity of their name embeddings."""
        scores, rows = self.entity_index.search(vector, k)
        return [(self.entity_keys[row], float(score)) for row, score in zip(rows[0], scores[0]) if row >= 0]

    def search_pages(self, family: str, vector: np.ndarray, k: int) -> list[tuple[PageRecord, float]]:
        index = self.page_indexes.get(family)
        if index is None:
            return []
        scores, rows = index.search(vector, k)
        return [(self.pages[row], float(score)) for row, score in zip(rows[0], scores[0]) if row >= 0]

    def segment(self, document_id: str) -> Segment:
        return self._segment_of_document[document_id]

    def asset_file(self, asset: str) -> Optional[Path]:
        """The file behind a client-visible asset path "<document id>/<path>", if it is in this snapshot."""
        document_id, _, relative = asset.partition("/")
        segment = self._segment_of_document.get(document_id)
        if segment is None or segment.folder is None or not relative:
            return None
        path = (segment.folder / relative).resolve()
        return path if path.is_relative_to(segment.folder.resolve()) and path.is_file() else None


class Collection:
    """One tenant's documents. One writer at a time (write_lock); any number of readers of snapshots.

    A commit is durable when it returns (its manifest is on disk) and makes the collection's new `head`. In a
    serving process (`warm`), queries see a head once it is published: after its BM25 indexes and graph are
    built or extended in the background (Snapshot.warm), so no query waits for them; meanwhile they read the
    previous snapshot. A large collection's graph built from every document (a delete or replacement whose graph
    cannot be made from the previous one) is built after publication (_publish_heads). Commits arriving during a build are published together by the next one, so a
    bulk ingest does not pay a build per document. Writers that promise read-your-writes wait for `visible(generation)`."""

    def __init__(
        self, root: Path, spec: IndexSpec, read_only: bool = False, warm: bool = False,
        prepare: Callable[[Snapshot], None] = lambda snapshot: None, retain_dropped_s: float = 0.0,
        index_write_vectors: int = 0, publish_before_graph_rows: int = PUBLISH_BEFORE_GRAPH_ROWS,
    ):
        self.root = root
        self.read_only = read_only  # a reader beside the writing process: never cleans up, never writes
        self.warm = warm  # publish each new snapshot once built, build the opened one in the background
        self.prepare = prepare  # run on a built snapshot before it is published (the query path's warm-up)
        self.name = root.name
        self.spec = spec
        self.write_lock = asyncio.Lock()
        self._snapshot: Optional[Snapshot] = None  # published: what queries read
        self._head: Optional[Snapshot] = None  # the newest committed snapshot, which writers build on
        self._manifest: list[ManifestEntry] = []
        self._staging: set[str] = set()  # folders of ingests running now in this process
        self._indexes: Optional[str] = None  # the folder of the newest stored indexes (stored_indexes.py)
        self._indexes_segments: list[str] = []  # the segments they hold: the manifest's, or a prefix of it
        # stored indexes are written again once the documents appended since hold this many evidence vectors (or
        # when a delete or replacement removed one they hold); 0: with every commit
        self.index_write_vectors = index_write_vectors
        # a head of at least this many evidence rows is published before its graph is built (_publish_heads)
        self.publish_before_graph_rows = publish_before_graph_rows
        self._open_lock = threading.Lock()
        # held (in worker threads) from a commit's rename to its manifest and stored indexes, and by the clean-up
        # that removes folders nothing names, which the publisher also runs
        self._files = threading.RLock()
        self._publishing = threading.Lock()
        self._publisher: Optional[threading.Thread] = None
        self._graph_builder: Optional[threading.Thread] = None  # builds published snapshots' graphs (_build_graphs)
        # a folder no manifest names is removed once it has been unreferenced this long (readers may read it)
        self.retain_dropped_s = retain_dropped_s
        self._dropped: dict[str, float] = {}  # folder -> when this writer first found it unreferenced

    @property
    def snapshot(self) -> Snapshot:
        """The published snapshot: what queries read."""
        if self._snapshot is None:
            with self._open_lock:  # a query and the server's preload may ask at once: open once
                if self._snapshot is None:
                    self._snapshot = self._head = self._open()
                    self._warm(self._snapshot)
        return self._snapshot

    def head(self) -> Snapshot:
        """The newest committed snapshot (published or being built): what the next commit builds on."""
        snapshot = self.snapshot
        return self._head or snapshot

    async def visible(self, generation: int, poll_s: float = 0.01) -> None:
        """Return once queries read generation `generation` or a later one."""
        while self.snapshot.generation < generation:
            await asyncio.sleep(poll_s)

    def exists(self) -> bool:
        return (self.root / MANIFEST).exists()

    def _open(self) -> Snapshot:
        generation, self._manifest = read_manifest(self.root)
        segments = [Segment.load(self.root / entry.segment) for entry in self._manifest]
        names = [entry.segment for entry in self._manifest]
        stored = self._stored(names)
        snapshot = self._from_stored(generation, segments, stored)
        self._indexes, self._indexes_segments = stored.folder, names[: stored.covered]
        rebuilt = self._report_indexes(snapshot, stored)
        if not self.read_only:
            if rebuilt or self._index_write_due(snapshot, names):  # so the next start need not build them again
                self._write_indexes(snapshot, names)
            self._remove_unreferenced()
        return snapshot

    def _from_stored(
        self, generation: int, segments: list[Segment], stored: stored_indexes.StoredIndexes, previous: Optional[Snapshot] = None,
    ) -> Snapshot:
        """A snapshot of `segments` whose vector indexes are the stored ones, with the vectors of the documents
        appended since they were written added to them (and the BM25 runs of `previous`, when given)."""
        if 0 < stored.covered < len(segments):
            prefix = Snapshot(generation, segments[: stored.covered], self.spec, stored=stored.indexes)
            snapshot = Snapshot(generation, segments, self.spec, base=prefix, previous=previous)
            snapshot.index_notes = prefix.index_notes + snapshot.index_notes
            return snapshot
        return Snapshot(generation, segments, self.spec, stored=stored.indexes, previous=previous)

    def _report_indexes(self, snapshot: Snapshot, stored: stored_indexes.StoredIndexes) -> list[str]:
        """Log where a snapshot's vector indexes came from; the tables built because none stored could be used."""
        rebuilt = [table for table, index in snapshot.vector_tables.items()
                   if stored_indexes.persisted(index) and table not in stored.indexes]
        if rebuilt:
            log.warning("collection %s: vector indexes built from the documents: %s (%s)", self.name, ", ".join(rebuilt),
                        "; ".join(stored.notes + snapshot.index_notes) or "none stored")
        elif stored.indexes:
            added = len(snapshot.segments) - stored.covered
            log.info("collection %s: vector indexes loaded from %s: %s%s", self.name, stored.folder, ", ".join(stored.indexes),
                     f" (the vectors of the {added} documents appended since added to them)" if added else "")
        return rebuilt

    def _index_write_due(self, snapshot: Snapshot, names: list[str]) -> bool:
        """Whether the stored indexes should be written for this manifest: they no longer hold a prefix of it (a
        delete or replacement), or the documents appended since hold index_write_vectors vectors."""
        held = self._indexes_segments
        if names[: len(held)] != held:
            return True
        appended = sum(len(segment.evidence) for segment in snapshot.segments[len(held) :])
        return appended > 0 and appended >= self.index_write_vectors

    def _write_indexes(self, snapshot: Snapshot, names: list[str]) -> None:
        folder = stored_indexes.write(self.root, snapshot.generation, names, self.spec, snapshot.vector_tables)
        self._indexes, self._indexes_segments = folder, names if folder is not None else []

    def _stored(self, names: list[str]) -> stored_indexes.StoredIndexes:
        return stored_indexes.read(self.root, names, self.spec) if self.spec.kind != "flat" else stored_indexes.StoredIndexes()

    def follow(self) -> bool:
        """A read replica's step: publish the manifest's generation if the writer made a new one since (the
        same generation loaded, a new document's vectors appended to the published indexes, or its stored
        indexes read). True when a new snapshot was published. A segment the writer dropped meanwhile fails
        the load: the next step reads the manifest that replaced it."""
        current = self._snapshot
        if current is None:  # never opened here: its first query opens the newest generation
            return False
        generation, manifest = read_manifest(self.root)
        names = [entry.segment for entry in manifest]
        loaded = {s.folder.name: s for s in current.segments if s.folder is not None}
        # segment folder names carry a nonce: a collection deleted and made again differs even at one generation
        if generation == current.generation and names == list(loaded):
            return False
        segments = [loaded.get(name) or Segment.load(self.root / name) for name in names]
        if _is_prefix(current.segments, segments):
            snapshot = Snapshot(generation, segments, self.spec, base=current)
        else:
            snapshot = self._from_stored(generation, segments, stored := self._stored(names), previous=current)
            self._report_indexes(snapshot, stored)
        self._manifest = manifest
        if self.warm and snapshot.segments:
            snapshot.warm()
            self.prepare(snapshot)
        self._snapshot = self._head = snapshot
        return True

    def require_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(
                f"collection {self.name} is open read-only here (a read replica): send ingests and deletes to the "
                "data folder's writer"
            )

    def _warm(self, snapshot: Snapshot) -> None:
        """The opened snapshot is published at once and built in the background (until a commit supersedes it)."""
        if self.warm and snapshot.segments:
            snapshot.warm_in_background(lambda: self._head is snapshot, f"warm-{self.name}-{snapshot.generation}")

    def staging_folder(self) -> Path:
        """A private folder on the collection's filesystem where one document's segment is assembled."""
        self.require_writable()
        self.root.mkdir(parents=True, exist_ok=True)
        folder = self.root / f"{_STAGING_PREFIX}{secrets.token_hex(6)}"
        self._staging.add(folder.name)  # before it exists: a clean-up running now must not take it
        folder.mkdir()
        return folder

    def discard_staging(self, folder: Path) -> None:
        """Drop the folder of an ingest that failed or found its document already present."""
        self._staging.discard(folder.name)
        shutil.rmtree(folder, ignore_errors=True)

    def commit(self, segment: Segment, staging: Path) -> Optional[DocumentRecord]:
        """Add the document of `segment` (written into `staging`), replacing the document of the same name.

        Returns the replaced document's record, if any. Caller holds write_lock (commits are serialised).
        """
        self.require_writable()
        old = self.head()
        if old.segments and old.dimension and segment.evidence_vectors.shape[1] != old.dimension:
            raise InvalidRequestError(
                f"collection {self.name} holds {old.dimension}-d embeddings but the embedder now gives "
                f"{segment.evidence_vectors.shape[1]}-d: it was built with another model profile"
            )
        segment.write(staging)
        name = f"seg-{segment.document.document_id}-{secrets.token_hex(4)}"
        segment.folder = self.root / name
        replaced = next((e for e in self._manifest if e.name == segment.document.name), None)
        manifest = [e for e in self._manifest if e is not replaced] + [ManifestEntry(segment.document.name, name)]
        kept = [s for s in old.segments if s.document.name != segment.document.name]
        snapshot = Snapshot(old.generation + 1, kept + [segment], self.spec, base=old)
        with self._files:  # from the rename until the manifest names it, no clean-up may see the folder
            self._staging.discard(staging.name)
            staging.rename(segment.folder)
            fsync_path(self.root)
            self._switch(snapshot, manifest)
        return old.documents.get(segment.document.name) if replaced else None

    def delete(self, name: str) -> DocumentRecord:
        """Remove a document: its segment leaves the manifest, so every record and vector of it goes."""
        self.require_writable()
        old = self.head()
        if name not in old.documents:
            raise NotFoundError(f"collection {self.name} has no document named {name!r}")
        manifest = [e for e in self._manifest if e.name != name]
        snapshot = Snapshot(old.generation + 1, [s for s in old.segments if s.document.name != name], self.spec, previous=old)
        with self._files:
            self._switch(snapshot, manifest)
        return old.documents[name]

    def _switch(self, snapshot: Snapshot, manifest: list[ManifestEntry]) -> None:
        self.require_writable()
        # the indexes first, when due: a replica that reads this manifest finds them, or a prefix of them (a crash
        # before the manifest leaves a folder nothing names, removed later)
        names = [entry.segment for entry in manifest]
        if self._index_write_due(snapshot, names):
            self._write_indexes(snapshot, names)
        write_manifest(self.root, snapshot.generation, manifest)
        self._head, self._manifest = snapshot, manifest
        if self.warm and snapshot.segments:
            self._remove_unreferenced()
            self._publish_when_built()
        else:
            self._publish(snapshot)

    def _publish(self, snapshot: Snapshot) -> None:
        with self._files:
            if self._snapshot is not None and snapshot.generation <= self._snapshot.generation:
                return
            try:  # what only the replaced snapshot read goes first: once a change is visible, its files are gone
                self._remove_unreferenced(snapshot)
            except OSError:  # the next commit or start cleans up; publishing must not fail for it
                log.exception("collection %s: removing unreferenced folders failed", self.name)
            replaced, self._snapshot = self._snapshot, snapshot
        if replaced is not None and not snapshot.graph_extends_previous():
            # the new graph is built from every document: nothing shares the old one, and freeing it here, in one
            # go, would hold the interpreter for long (reaper.py). When the new graph was made from it by appending
            # or removing documents, most of it is shared and what is not goes here, quickly.
            REAPER.release(replaced)

    def _publish_when_built(self) -> None:
        with self._publishing:
            if self._publisher is None:  # a running publisher takes the new head in its next round
                self._publisher = threading.Thread(target=self._publish_heads, name=f"publish-{self.name}", daemon=True)
                self._publisher.start()

    def _publish_heads(self) -> None:
        """Build the newest head and publish it, until the published snapshot is the head. A build is never cut
        short by a newer commit: under a steady stream of commits each build still publishes something.

        A head whose graph is built from every document (the previous graph was never built, or cannot be cut
        down: graph.removable) and that holds publish_before_graph_rows evidence rows or more is published once its
        BM25 indexes are built; its graph is built after, by another thread (_build_graphs), so that publications
        do not queue behind graph builds. Meanwhile its queries expand over the newest built graph of a snapshot
        it extends by appending, or go without the graph, saying so. A head that appends or removes documents makes
        its graph from the previous one first (about the cost of those documents)."""
        while True:
            with self._publishing:
                head = self._head
                if head is None or head is self._snapshot:
                    self._publisher = None
                    return
            # a graph extended by the appended documents costs about them: built before publishing, like the rest
            early = len(head.evidence) >= self.publish_before_graph_rows and not head.graph_extends_previous()
            head.building_in_background = early  # until its graph is built: queries read the previous one's, or none
            try:
                head.warm(graph=not early)
                self.prepare(head)
            except Exception:  # its queries meet the error when they build it themselves
                log.exception("collection %s: building snapshot %d failed; published unbuilt", self.name, head.generation)
            self._publish(head)
            if early:
                with self._publishing:
                    if self._graph_builder is None:
                        self._graph_builder = threading.Thread(target=self._build_graphs, name=f"graph-{self.name}", daemon=True)
                        self._graph_builder.start()

    def _build_graphs(self) -> None:
        """Build the published snapshot's graph, until the published one has its graph; a snapshot superseded
        while its graph was built lends it to the newer ones that extend it (Snapshot.lend_graph)."""
        while True:
            with self._publishing:
                target = self._snapshot
                if target is None or not target.building_in_background:
                    self._graph_builder = None
                    return
            try:
                target.warm_graph()
                for newer in (self._snapshot, self._head):
                    if newer is not None and newer is not target:
                        newer.lend_graph(target)
            except Exception:
                log.exception("collection %s: building the graph of snapshot %d failed", self.name, target.generation)
            finally:
                target.building_in_background = False

    def _remove_unreferenced(self, published: Optional[Snapshot] = None) -> None:
        """Folders neither the manifest nor the published snapshot (or the one about to be) names: staging
        folders of interrupted ingests (at once: only this writer makes them), and dropped documents and
        indexes once they have been unreferenced for `retain_dropped_s` (replicas may still read them)."""
        with self._files:
            live = {entry.segment for entry in self._manifest} | ({self._indexes} if self._indexes else set())
            reader = published or self._snapshot
            live |= {s.folder.name for s in (reader.segments if reader else ()) if s.folder is not None}
            now = time.monotonic()
            for entry in self.root.iterdir() if self.root.exists() else ():
                if entry.is_dir() and entry.name not in live and entry.name not in self._staging:
                    dropped = self._dropped.setdefault(entry.name, now)
                    if entry.name.startswith(_STAGING_PREFIX) or now - dropped >= self.retain_dropped_s:
                        shutil.rmtree(entry, ignore_errors=True)
                        self._dropped.pop(entry.name, None)
                elif entry.name.startswith(f".{MANIFEST}."):  # a manifest write cut short by a crash
                    entry.unlink(missing_ok=True)


class KnowledgeBase:
    """All collections under one data folder; collections never share files."""

    def __init__(
        self, data_dir: Path, spec: IndexSpec = IndexSpec(), read_only: bool = False, warm: bool = False,
        retain_dropped_s: float = 0.0, index_write_vectors: int = 0, publish_before_graph_rows: int = PUBLISH_BEFORE_GRAPH_ROWS,
    ):
        """`warm`: each collection builds a new snapshot's BM25 indexes and graph in the background after a
        commit or an open, so the first query after it does not (a server sets it; tools and tests need not).
        Writable: this process takes the folder's writer lock (DataFolderLockedError when another holds it).
        `read_only`: a replica; `follow()` keeps it up with the writer. `retain_dropped_s`, `index_write_vectors`,
        `publish_before_graph_rows`: see Collection."""
        self.root = data_dir / "collections"
        self.spec = spec
        self.read_only = read_only
        self.warm = warm
        self.retain_dropped_s = retain_dropped_s
        self.index_write_vectors = index_write_vectors
        self.publish_before_graph_rows = publish_before_graph_rows
        self._lock = None if read_only else WriterLock(data_dir)
        self._follower: Optional[threading.Thread] = None
        self._closed = threading.Event()
        # with `warm`: what a built snapshot goes through before it is published (the query pipeline sets it)
        self.prepare: Callable[[Snapshot], None] = lambda snapshot: None
        self._collections: dict[str, Collection] = {}
        if not read_only and self.root.exists():
            for leftover in self.root.glob(f"{_DELETED_PREFIX}*"):  # a deletion cut short by a crash
                shutil.rmtree(leftover, ignore_errors=True)

    def collection(self, name: str, create: bool = False) -> Collection:
        if not COLLECTION_NAME.match(name or ""):
            raise InvalidRequestError(f"collection name {name!r} must match {COLLECTION_NAME.pattern}")
        if name not in self._collections:
            self._collections[name] = Collection(
                self.root / name, self.spec, self.read_only, self.warm, lambda snapshot: self.prepare(snapshot),
                self.retain_dropped_s, self.index_write_vectors, self.publish_before_graph_rows,
            )
        collection = self._collections[name]
        # A collection exists once its first document is committed, even if an ingest created the object.
        if not create and not collection.exists():
            raise NotFoundError(f"collection {name!r} does not exist (ingest a document into it first)")
        return collection

    def preload(self) -> None:
        """Open every collection (and, with `warm`, build their lazy structures): a server calls it in the
        background at start, so the first query of each collection finds it open."""
        for name in self.names():
            try:
                self.collection(name).snapshot
            except Exception:  # a collection that cannot be opened fails its own queries, with their error
                log.exception("collection %s could not be opened at start", name)

    def follow(self, interval_s: float) -> None:
        """A replica: every `interval_s`, each opened collection publishes the writer's newest generation, and
        one the writer deleted is forgotten (its queries get NOT_FOUND). On a background thread until close()."""
        if not self.read_only:
            raise RuntimeError("only a read-only KnowledgeBase follows a writer")
        if self._follower is None:
            self._follower = threading.Thread(target=self._follow, args=(interval_s,), name="follow-writer", daemon=True)
            self._follower.start()

    def _follow(self, interval_s: float) -> None:
        while not self._closed.wait(interval_s):
            for name, collection in list(self._collections.items()):
                try:
                    if not collection.exists():
                        self._collections.pop(name, None)
                    else:
                        collection.follow()
                except Exception as error:  # e.g. a segment dropped while it was read: the next round retries
                    log.info("collection %s: following the writer failed this round (%s)", name, error)

    def close(self) -> None:
        """Stop following; a writer gives up the folder's lock."""
        self._closed.set()
        if self._follower is not None:
            self._follower.join(10)
        if self._lock is not None:
            self._lock.release()

    def names(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if COLLECTION_NAME.match(p.name) and (p / MANIFEST).exists())

    def create(self, name: str) -> Collection:
        """An empty collection (an empty manifest); ALREADY_EXISTS when it has one."""
        collection = self.collection(name, create=True)
        collection.require_writable()
        if collection.exists():
            raise AlreadyExistsError(f"collection {name!r} already exists")
        collection.root.mkdir(parents=True, exist_ok=True)
        write_manifest(collection.root, 0, [])
        return collection

    def delete(self, name: str) -> Snapshot:
        """Remove a collection and all its files; returns its last snapshot (queries holding it finish on it).

        The folder is renamed away first (atomic), so a crash leaves the collection whole or gone."""
        collection = self.collection(name)
        collection.require_writable()
        last = collection.snapshot
        graveyard = self.root / f"{_DELETED_PREFIX}{name}-{secrets.token_hex(4)}"
        os.replace(collection.root, graveyard)
        fsync_path(self.root)
        self._collections.pop(name, None)
        shutil.rmtree(graveyard, ignore_errors=True)
        return last


class EvidenceRows(Sequence[EvidenceRecord]):
    """A snapshot's evidence records in row order (the rows of its evidence index): its segments' records
    joined without copying them, so that a segment's records are read from disk only when a row of it is
    asked for (a restart reads none; the background warm-up all)."""

    def __init__(self, segments: Sequence[Segment]):
        self.segments = segments
        self.starts = np.cumsum([0] + [len(s.evidence) for s in segments])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, row):  # type: ignore[override]
        if isinstance(row, slice):
            return [self[r] for r in range(*row.indices(len(self)))]
        segment, local = self._locate(row)
        return segment.evidence[local]

    def answer_sentences(self, row: int) -> RecordSentences:
        """The row's answer sentences and titles, as its segment stored them (cut now for a segment without them)."""
        segment, local = self._locate(row)
        return segment.answer_sentences(local)

    def _locate(self, row: int) -> tuple[Segment, int]:
        row = int(row)
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(f"evidence row {row} of {len(self)}")
        number = int(np.searchsorted(self.starts, row, side="right")) - 1
        return self.segments[number], row - int(self.starts[number])

    def __iter__(self) -> Iterator[EvidenceRecord]:
        return itertools.chain.from_iterable(segment.evidence for segment in self.segments)


def read_manifest(root: Path) -> tuple[int, list[ManifestEntry]]:
    path = root / MANIFEST
    if not path.exists():
        return 0, []
    data = json.loads(path.read_text(encoding="utf-8"))
    return int(data["generation"]), [ManifestEntry(**entry) for entry in data["documents"]]


def write_manifest(root: Path, generation: int, entries: list[ManifestEntry]) -> None:
    temporary = root / f".{MANIFEST}.{secrets.token_hex(4)}"
    body = {"generation": generation, "documents": [{"name": e.name, "segment": e.segment} for e in entries]}
    write_durably(temporary, json.dumps(body, ensure_ascii=False, indent=1))
    os.replace(temporary, root / MANIFEST)
    fsync_path(root)


def _is_prefix(prefix: Sequence[Segment], whole: Sequence[Segment]) -> bool:
    return len(prefix) <= len(whole) and all(a is b for a, b in zip(prefix, whole))


def _removable(source: tuple[Sequence[Segment], KnowledgeGraph], segments: Sequence[Segment]) -> bool:
    """Whether the graph made for `source`'s segments can have the documents `segments` no longer hold taken out in
    place (graph.removable); else `segments`' graph is built from every document (and, in a large collection,
    after its snapshot is published)."""
    earlier, graph = source
    removal = _removal(earlier, segments)
    if removal is None:
        return True
    try:
        return removable(graph, [earlier[number].graph_input() for number in removal[0]])
    except (OSError, ValueError) as error:  # a removed document's records no longer readable
        log.warning("the graph is built from every document: %s", error)
        return False


def _derivable(earlier: Sequence[Segment], segments: Sequence[Segment]) -> bool:
    """Whether `segments` are `earlier` with documents appended, or removed (then any appended)."""
    return _is_prefix(earlier, segments) or _removal(earlier, segments) is not None


def _removal(previous: Sequence[Segment], segments: Sequence[Segment]) -> Optional[tuple[list[int], Sequence[Segment]]]:
    """(the positions in `previous` of the segments `segments` no longer holds, the segments added after the others)
    when `segments` is `previous` less at least one segment, in order, then any new ones; else None."""
    current = {id(segment) for segment in segments}
    removed = [number for number, segment in enumerate(previous) if id(segment) not in current]
    kept = [segment for segment in previous if id(segment) in current]
    if not removed or not _is_prefix(kept, segments):
        return None
    return removed, segments[len(kept) :]


def _without(index: VectorIndex, sizes: Sequence[int], removed: Sequence[int]) -> VectorIndex:
    """`index` (rows: each segment's `sizes` in order) less the rows of the segments at positions `removed`."""
    starts = np.cumsum([0, *sizes])
    for number in sorted(removed, reverse=True):  # the last first: the earlier rows keep their numbers
        index = index.without(int(starts[number]), int(starts[number + 1]))
    return index


class FirstRows:
    """Unique keys across segments in first-seen order, each with the (segment, row) of its first occurrence, or
    with `preferred` (rows per segment) of its first preferred occurrence where it has one. Extending it by
    appended segments reads only theirs; the table of every segment (an opening, a delete, a replacement) is made
    in C-level passes (dict.fromkeys, numpy), not a Python step per key: at 100,000 chunks that step was most of a
    delete's time."""

    def __init__(self, position: dict, numbers: np.ndarray, rows: np.ndarray, preferred: np.ndarray, segments: int,
                 moved: bool):
        self._position = position  # key -> its row in `keys`
        self.numbers = numbers  # each key's segment (int64)
        self.rows = rows  # each key's row in that segment's tables (int64)
        self._preferred = preferred  # whether each key's row is a preferred one
        self.segments = segments  # how many segments it has read
        self.moved = moved  # a key the base held has a new row (it found its first preferred occurrence here)

    @property
    def keys(self) -> list:
        return list(self._position)

    def __len__(self) -> int:
        return len(self.numbers)

    def vectors(self, segments: Sequence[Segment], kind: str, start: int = 0) -> np.ndarray:
        """The `kind` ("entity", "relation") vectors of its keys from `start` on, gathered a segment at a time."""
        numbers, rows = self.numbers[start:], self.rows[start:]
        if not len(numbers):
            return _stack(())
        attribute = f"{kind}_vectors"
        order = np.argsort(numbers, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(numbers[order])) + 1)
        tables = [np.asarray(getattr(segments[int(numbers[group[0]])], attribute)) for group in groups]
        out = np.empty((len(numbers), tables[0].shape[1]), dtype=np.float32)
        for group, table in zip(groups, tables):
            out[group] = table[rows[group]]
        return out

    @classmethod
    def of(cls, key_lists: Sequence, preferred: Optional[Sequence[frozenset[int]]] = None,
           base: Optional["FirstRows"] = None) -> "FirstRows":
        """The table of `key_lists` (one per segment, each without repeats) read after the base's segments."""
        if base is None:
            return cls._every(key_lists, preferred)
        position = dict(base._position)
        numbers, rows, flags = base.numbers.tolist(), base.rows.tolist(), base._preferred.tolist()
        held, moved = len(rows), False
        for offset, keys in enumerate(key_lists):
            number = base.segments + offset
            chosen = preferred[offset] if preferred is not None else frozenset()
            for row, key in enumerate(keys):
                at = position.get(key)
                if at is None:
                    position[key] = len(rows)
                    numbers.append(number)
                    rows.append(row)
                    flags.append(row in chosen)
                elif not flags[at] and row in chosen:
                    numbers[at], rows[at], flags[at] = number, row, True
                    moved = moved or at < held
        return cls(position, np.asarray(numbers, dtype=np.int64), np.asarray(rows, dtype=np.int64),
                   np.asarray(flags, dtype=bool), base.segments + len(key_lists), moved)

    @classmethod
    def _every(cls, key_lists: Sequence, preferred: Optional[Sequence[frozenset[int]]]) -> "FirstRows":
        sizes = [len(keys) for keys in key_lists]
        total = sum(sizes)
        unique = dict.fromkeys(itertools.chain.from_iterable(key_lists))  # first-seen order
        position = dict(zip(unique, range(len(unique))))
        codes = np.fromiter(map(position.__getitem__, itertools.chain.from_iterable(key_lists)), dtype=np.int64, count=total)
        numbers = np.repeat(np.arange(len(key_lists), dtype=np.int64), sizes)
        starts = np.cumsum([0] + sizes)
        rows = np.arange(total, dtype=np.int64) - starts[numbers]
        flags = np.zeros(total, dtype=bool)
        for number, chosen in enumerate(preferred or ()):
            if chosen:
                flags[starts[number] + np.fromiter(chosen, dtype=np.int64, count=len(chosen))] = True
        _, first = np.unique(codes, return_index=True)  # codes number the keys in first-seen order: 0, 1, 2, ...
        favoured = np.flatnonzero(flags)
        if len(favoured):
            keys, at = np.unique(codes[favoured], return_index=True)
            first[keys] = favoured[at]
        return cls(position, numbers[first], rows[first], flags[first], len(key_lists), False)


def _gather(
    segments: Sequence[Segment], table: Callable[[Segment], Optional[np.ndarray]], starts: np.ndarray, rows: Sequence[int],
    dimension: int,
) -> np.ndarray:
    """Rows of a per-segment table (`starts`: each segment's first global row), in the order asked; a segment
    without the table gives zeros. Row by row: a query asks for a few dozen, spread over as many documents."""
    out = np.zeros((len(rows), dimension), dtype=np.float32)
    numbers = np.searchsorted(starts, rows, side="right") - 1
    for i, (row, number) in enumerate(zip(rows, numbers.tolist())):
        vectors = table(segments[number])
        if vectors is not None and len(vectors):
            out[i] = vectors[row - starts[number]]
    return out


def _stack(arrays) -> np.ndarray:
    arrays = [np.asarray(a, dtype=np.float32) for a in arrays if len(a)]
    return np.concatenate(arrays) if arrays else np.zeros((0, 0), dtype=np.float32)


def _families(segments: Sequence[Segment]) -> set[str]:
    return {family for segment in segments for family in segment.page_vectors}
