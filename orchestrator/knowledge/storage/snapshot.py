"""One immutable state of a collection (Snapshot): its documents' records merged, with their vector indexes, and
the BM25 indexes and graph built once on first use or ahead of it in the background. Queries read the snapshot
they started with: a commit never changes a snapshot, it makes a new one (collection.py).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterator, Mapping, Optional, Sequence, TypeVar

import numpy as np
from scipy import sparse

from ..collector import keep_out_of_collections
from ..graph.graph import KnowledgeGraph
from ..graph.merge import appended_graph, build_graph, graph_without
from ..parsing.sentences import RecordSentences
from .incremental import (
    FirstRows,
    derivable,
    gather_rows,
    graph_can_shed,
    is_prefix,
    page_families,
    removed_segments,
    stack,
    without_segments,
)
from .indexes import IndexSpec, VectorIndex
from .lexical import BM25Index
from .segments import DocumentRecord, EvidenceRecord, PageRecord, Segment

log = logging.getLogger("thinkserve.knowledge")
_GRAPH_PARTS = ("graph", "evidence_rows", "node_evidence")  # made from the previous snapshot's (Snapshot._graph_bases)
T = TypeVar("T")
_LEXICAL = ("lexical", "page_lexical")  # a snapshot's BM25 indexes, which the next snapshot's extend


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
                if source is not None and derivable(source[0], self.segments) and (part != "graph" or graph_can_shed(source, self.segments)):
                    self._graph_bases[part] = source
            if is_prefix(previous.segments, self.segments):
                self._graph_fallback = previous._own_graph_view if previous.built("graph_built") else previous._graph_fallback
        # the BM25 indexes this one's are built from: the previous snapshot's, or those it was to be built from
        # when it was never built (never the snapshot itself: a chain of snapshots would stay in memory)
        self._lexical_bases: dict[str, BM25Index] = {
            part: index for part in _LEXICAL
            if previous is not None and (index := previous.__dict__.get(part) or previous._lexical_bases.get(part)) is not None
        }
        appended = self.segments[len(base.segments) :] if base is not None and is_prefix(base.segments, self.segments) else None

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
            self.evidence_index = base.evidence_index.extended(stack(s.evidence_vectors for s in appended))
            if not entities.moved:
                self.entity_index = base.entity_index.extended(entities.vectors(self.segments, "entity", len(base.entity_keys)))
            else:  # the new document gave a vector to an entity that had none
                self.entity_index = self._build(entities.vectors(self.segments, "entity"))
            self.relation_index = base.relation_index.extended(relations.vectors(self.segments, "relation", len(base.relation_keys)))
            self.page_indexes = {
                family: index.extended(stack(s.page_vectors.get(family, ()) for s in appended))
                for family, index in base.page_indexes.items()
            }
            for family in page_families(appended) - set(self.page_indexes):
                self.page_indexes[family] = self._build(stack(s.page_vectors.get(family, ()) for s in self.segments))
        elif previous is not None and (removal := removed_segments(previous.segments, self.segments)) is not None:
            # a delete or replacement: the previous snapshot's evidence and page indexes less the removed documents'
            # rows (no rebuild: see VectorIndex.without), then the appended documents'; the entity and relation
            # tables are made again (their key order is the remaining documents' first-seen order)
            removed, after = removal
            self.evidence_index = without_segments(previous.evidence_index, [len(s.evidence) for s in previous.segments], removed
                                           ).extended(stack(s.evidence_vectors for s in after))
            self.entity_index = self._build(entities.vectors(self.segments, "entity"))
            self.relation_index = self._build(relations.vectors(self.segments, "relation"))
            families = page_families(self.segments)
            self.page_indexes = {
                family: without_segments(index, [len(s.page_vectors.get(family, ())) for s in previous.segments], removed
                                 ).extended(stack(s.page_vectors.get(family, ()) for s in after))
                for family, index in previous.page_indexes.items() if family in families
            }
            for family in families - set(self.page_indexes):
                self.page_indexes[family] = self._build(stack(s.page_vectors.get(family, ()) for s in self.segments))
        else:
            self.evidence_index = self._table(
                stored, "evidence", len(self.evidence), lambda: stack(s.evidence_vectors for s in self.segments)
            )
            self.entity_index = self._table(stored, "entity", len(entities), lambda: entities.vectors(self.segments, "entity"))
            self.relation_index = self._table(stored, "relation", len(relations), lambda: relations.vectors(self.segments, "relation"))
            self.page_indexes = {
                family: self._table(
                    stored, f"page-{family}", sum(len(s.page_vectors.get(family, ())) for s in self.segments),
                    lambda family=family: stack(s.page_vectors.get(family, ()) for s in self.segments),
                )
                for family in page_families(self.segments)
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
            if is_prefix(segments, self.segments):
                return appended_graph(graph, (segment.graph_input() for segment in self.segments[len(segments) :]))
            removed, after = removed_segments(segments, self.segments)
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
        removed, _ = removed_segments(segments, self.segments) or ([], ())
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
        if (older.built("graph_built") and not self.built("graph") and is_prefix(older.segments, self.segments)
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
        return gather_rows(self.segments, lambda s: s.evidence_vectors, self._evidence_starts, rows, self.dimension)

    def page_vectors(self, family: str, rows: Sequence[int]) -> np.ndarray:
        """Page-image embeddings of one encoder family for page rows; a page that family lacks is zeros."""
        dimension = self.page_indexes[family].dimension if family in self.page_indexes else 0
        return gather_rows(self.segments, lambda s: s.page_vectors.get(family), self._page_starts, rows, dimension)

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
