"""One document's share of a collection, stored as an immutable folder (a segment).

    seg-<document id>-<nonce>/
        document.json    the DocumentRecord (name, content hash, counts, parser, warnings)
        blocks.jsonl     parsed blocks with page, bbox and asset
        evidence.jsonl   text passages and multimodal units: what retrieval returns and answers cite
        entities.jsonl   entity mentions (normalised key, name, type, description, evidence id)
        relations.jsonl  relation mentions between entity keys
        pages.jsonl      page renders
        *.npy            vectors, row-aligned with the records above (memory-mapped when loaded)
        terms.npz        the evidence texts tokenised for BM25 (TermCounts) and each evidence row's page, so
                         opening a collection decodes and tokenises nothing (segments written before it have
                         none: their records are read and tokenised on first use)
        sentences-v1.jsonl  each evidence row's answer sentences, cut and counted (sentences.py; segments
                         written before it have none: a query cuts the sentences of the rows it reads)
        assets/          images of the document's figures and tables; pages/ holds the page renders

Everything a document contributes lives in its segment, so deleting a document is dropping one folder from
the manifest, and the merged views (graph, indexes) are recomputed from the segments that remain: there is
nothing left to orphan. Entities shared by several documents are merged when the snapshot is built.

A loaded segment maps its vectors and reads its records on first use: a query reads the evidence records of
the rows it returns, the graph the entity and relation mentions, nothing after ingest the blocks; what every
query needs of every row (the BM25 term counts, each row's page) comes from terms.npz. So a restart decodes
no JSON record (at a million chunks that was most of its time), and the background warm-up reads the rest.
"""

from __future__ import annotations

import functools
import json
import logging
import mmap
import os
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar

import numpy as np
from scipy import sparse

from ..graph.graph import DocumentGraph, MultimodalUnit
from ..parsing.chunking import Span
from ..parsing.documents import NO_PAGE, Block
from ..parsing.sentences import SENTENCES_FILE, RecordSentences, TokenCounts, decode_row, encode_row, record_sentences
from ..parsing.text import LEXICAL_TERMS_VERSION
from .lexical import TermCounts

log = logging.getLogger("thinkserve.knowledge")
R = TypeVar("R")
DOCUMENT_FILE = "document.json"
TERMS_FILE = "terms.npz"


@dataclass(frozen=True)
class DocumentRecord:
    document_id: str  # content hash of the source bytes (sha256, 24 hex digits)
    name: str  # the document's name in its collection: re-ingesting this name replaces it
    media_type: str
    parser: str
    pages: int
    blocks: int
    chunks: int  # the 1,200-token windows the entity extractor read
    units: int  # images, tables, equations, charts
    entities: int
    relations: int
    bytes: int
    added_at: float
    warnings: tuple[str, ...] = ()
    passages: int = 0  # text passages indexed (0 in documents ingested before passages: their chunks are indexed)
    ocr_pages: int = 0  # pages whose text OCR read (ingest.ocr)
    ocr_figures: int = 0  # figure and chart crops OCR read
    ocr_lines: int = 0  # lines OCR read on them
    ocr_low_confidence_lines: int = 0  # ... below ingest.ocr_min_confidence (kept, marked by their confidence)
    unparsed_pages: tuple[int, ...] = ()  # 0-based pages the parser failed on or was not given (read by OCR instead)


@dataclass(frozen=True)
class EvidenceRecord:
    """A retrievable piece of a document: a text passage, or a multimodal unit (caption + description)."""

    evidence_id: str  # "<document id>:t<n>" for passages, ":u<n>" for units (":c<n>": a chunk, before passages)
    document_id: str
    document_name: str
    kind: str  # "passage" | "unit" | "chunk" (text evidence of documents ingested before passages)
    block_type: str  # "text" for passages and chunks; image, table, equation, chart for units
    text: str
    section: str
    spans: tuple[Span, ...]
    asset: str = ""  # "<document id>/<path>": never the server's filesystem layout
    tokens: int = 0

    @property
    def page(self) -> int:
        return next((span.page for span in self.spans if span.page != NO_PAGE), NO_PAGE)

    @property
    def pages(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(span.page for span in self.spans if span.page != NO_PAGE))


@dataclass(frozen=True)
class EntityMention:
    key: str  # normalised name: the hard-match key entities merge on
    name: str
    type: str
    description: str
    evidence_id: str  # the passage or unit it was found in


@dataclass(frozen=True)
class RelationMention:
    source: str  # entity keys
    target: str
    description: str
    keywords: str
    weight: float
    evidence_id: str


@dataclass(frozen=True)
class PageRecord:
    document_id: str
    page: int
    image: str  # path inside the segment


@dataclass
class Segment:
    """A document's records and vectors. Built by the ingest pipeline, then written once and never changed."""

    document: DocumentRecord
    blocks: Sequence[Block]  # a loaded segment's are read on first use (StoredRecords)
    evidence: Sequence[EvidenceRecord]  # read on first use, as blocks
    evidence_vectors: np.ndarray
    entities: Sequence[EntityMention]  # read on first use, as blocks
    entity_keys: list[str]  # unique keys in first-mention order, row-aligned with entity_vectors
    entity_vectors: np.ndarray
    relations: Sequence[RelationMention]  # read on first use, as blocks
    relation_keys: list[tuple[str, str]]  # unique (source, target) pairs, sorted within the pair
    relation_vectors: np.ndarray
    pages: list[PageRecord] = field(default_factory=list)
    page_vectors: dict[str, np.ndarray] = field(default_factory=dict)  # per page-encoder family
    folder: Optional[Path] = None  # set once written
    # each evidence row's answer sentences (cut_sentences() before writing; read on first use when loaded); None:
    # not cut, a query cuts the rows it reads
    sentences: Optional[Sequence[RecordSentences]] = None

    def cut_sentences(self, count: TokenCounts) -> None:
        """Cut and count every evidence row's answer sentences, to be written with the segment."""
        self.sentences = record_sentences(self.evidence, self.blocks, count)

    def answer_sentences(self, row: int) -> RecordSentences:
        """Evidence row `row`'s answer sentences and titles: stored, or cut now (not counted) when the segment has
        none or its file cannot be read (logged once; the rest of the segment is not affected)."""
        stored = self.sentences
        if stored is not None:
            try:
                return stored[row]
            except (OSError, ValueError, TypeError, IndexError) as error:  # a damaged or truncated file
                log.warning("%s is not usable, answer sentences are cut at query time: %s", getattr(stored, "path", "sentences"), error)
                self.sentences = None
        return record_sentences([self.evidence[row]], self.blocks)[0]

    def page_section(self, page: int) -> str:
        """The section a page is filed under, for a hit on its image: its first passage's ("" without one). A
        slide's is its title (parsing/sections.py)."""
        return self._page_sections.get(page, "")

    @functools.cached_property
    def _page_sections(self) -> dict[int, str]:
        sections: dict[int, str] = {}
        for record in self.evidence:
            if record.kind == "passage":
                sections.setdefault(record.page, record.section)
        return sections

    def write(self, folder: Path) -> None:
        """Write every file durably (fsync) into `folder`, which must already hold assets/ and pages/."""
        folder.mkdir(parents=True, exist_ok=True)
        _write_jsonl(folder / "blocks.jsonl", (asdict(b) for b in self.blocks))
        _write_jsonl(folder / "evidence.jsonl", (asdict(e) for e in self.evidence))
        _write_jsonl(folder / "entities.jsonl", (asdict(e) for e in self.entities))
        _write_jsonl(folder / "relations.jsonl", (asdict(r) for r in self.relations))
        _write_jsonl(folder / "pages.jsonl", (asdict(p) for p in self.pages))
        _write_json(folder / "keys.json", {"entities": self.entity_keys, "relations": self.relation_keys})
        _write_array(folder / "evidence.npy", self.evidence_vectors)
        _write_array(folder / "entities.npy", self.entity_vectors)
        _write_array(folder / "relations.npy", self.relation_vectors)
        for family, vectors in self.page_vectors.items():
            _write_array(folder / f"pages-{family}.npy", vectors)
        _write_terms(folder / TERMS_FILE, self.term_counts, self.evidence_pages)
        if self.sentences is not None:
            write_durably(folder / SENTENCES_FILE, "".join(encode_row(row) + "\n" for row in self.sentences))
        for sub in ("assets", "pages"):
            for path in sorted((folder / sub).rglob("*")) if (folder / sub).exists() else ():
                if path.is_file():
                    fsync_path(path)
        _write_json(folder / DOCUMENT_FILE, asdict(self.document))  # last: its presence marks a complete folder
        self.folder = folder

    def fault_in(self) -> None:
        """Read one value of each memory page of the vector tables queries read row by row (evidence, page
        images), and find the lines of the record files they read row by row (evidence, answer sentences):
        mapped from disk, each page would otherwise cost the first query that touches it a page fault,
        a disk read after a restart (several milliseconds per query until most pages were touched), and each
        file a scan. Once per segment: a commit's snapshot faults in only the document it adds."""
        self._faulted_in

    @functools.cached_property
    def _faulted_in(self) -> bool:
        for table in (self.evidence_vectors, *self.page_vectors.values()):
            flat = np.asarray(table).reshape(-1)
            if flat.size:
                float(flat[:: max(1, mmap.PAGESIZE // flat.itemsize)].sum())
        for records in (self.evidence, self.sentences):  # blocks: read whole by the context of a first query
            if isinstance(records, StoredRecords):
                try:
                    records.find_lines()
                except (OSError, ValueError) as error:  # read again (and reported) when a query asks for a row
                    log.warning("%s: %s", records.path, error)
        return True

    @functools.cached_property
    def embedded_entity_rows(self) -> frozenset[int]:
        """Rows of entity_vectors that hold a vector (ingest.entity_min_mentions leaves the others zeros)."""
        vectors = np.asarray(self.entity_vectors)
        return frozenset(np.flatnonzero(np.any(vectors != 0, axis=1)).tolist()) if vectors.ndim == 2 and vectors.size else frozenset()

    @functools.cached_property
    def _stored_terms(self) -> Optional[tuple[TermCounts, np.ndarray]]:
        """terms.npz of a loaded segment, if it is there and fits its rows (else None, and a log line why)."""
        path = self.folder / TERMS_FILE if self.folder is not None else None
        if path is None or not path.exists():
            return None
        try:
            return _read_terms(path, len(self.evidence))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            log.warning("%s is not usable, the %d evidence texts are tokenised again: %s", path, len(self.evidence), error)
            return None

    @functools.cached_property
    def term_counts(self) -> TermCounts:
        """Its evidence texts tokenised for BM25: computed once, when the segment is written, and read back from
        terms.npz when it is loaded (every snapshot holding it shares them). A file that is missing, unreadable,
        of another tokeniser version or of another row count is replaced by tokenising the texts again."""
        stored = self._stored_terms
        return stored[0] if stored is not None else TermCounts.of([e.text for e in self.evidence])

    @functools.cached_property
    def evidence_pages(self) -> np.ndarray:
        """Each evidence row's page (NO_PAGE for sources without pages), from terms.npz when it is there."""
        stored = self._stored_terms
        return stored[1] if stored is not None else np.asarray([e.page for e in self.evidence], dtype=np.int64)

    @functools.cached_property
    def page_numbering(self) -> np.ndarray:
        """Each evidence row's text page as a number 0.. in first-seen order (what page_term_counts groups by)."""
        _, first, inverse = np.unique(self.evidence_pages, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        return rank[inverse.reshape(-1)] if len(first) else np.zeros(0, dtype=np.int64)

    @functools.cached_property
    def page_term_counts(self) -> TermCounts:
        """The same per text page (its evidence joined, pages in first-seen order): BM25 over whole pages."""
        numbers = self.page_numbering
        rows = np.argsort(numbers, kind="stable")  # as Snapshot.page_rows orders them
        groups = np.split(rows, np.flatnonzero(np.diff(numbers[rows])) + 1) if len(rows) else []
        return self.term_counts.grouped(groups)

    def graph_input(self) -> DocumentGraph:
        """This document's share of the collection graph; units anchor the entities of their descriptions."""
        units = [MultimodalUnit(e.evidence_id, e.block_type, e.text) for e in self.evidence if e.kind == "unit"]
        return DocumentGraph.from_mentions(self.document.document_id, self.entities, self.relations, units)

    @classmethod
    def load(cls, folder: Path) -> "Segment":
        document = json.loads((folder / DOCUMENT_FILE).read_text(encoding="utf-8"))
        document["warnings"] = tuple(document.get("warnings", ()))
        document["unparsed_pages"] = tuple(document.get("unparsed_pages", ()))
        keys = json.loads((folder / "keys.json").read_text(encoding="utf-8"))
        page_vectors = {
            path.stem.removeprefix("pages-"): _mapped(path) for path in sorted(folder.glob("pages-*.npy"))
        }
        evidence_vectors = _mapped(folder / "evidence.npy")  # row-aligned with evidence.jsonl: its length
        sentences = folder / SENTENCES_FILE
        return cls(
            document=DocumentRecord(**document),
            blocks=StoredRecords(folder / "blocks.jsonl", _block),
            evidence=StoredRecords(folder / "evidence.jsonl", _evidence, count=len(evidence_vectors)),
            evidence_vectors=evidence_vectors,
            entities=StoredRecords(folder / "entities.jsonl", lambda row: EntityMention(**row)),
            entity_keys=list(keys["entities"]),
            entity_vectors=_mapped(folder / "entities.npy"),
            relations=StoredRecords(folder / "relations.jsonl", lambda row: RelationMention(**row)),
            relation_keys=[tuple(pair) for pair in keys["relations"]],
            relation_vectors=_mapped(folder / "relations.npy"),
            pages=[PageRecord(**row) for row in _read_jsonl(folder / "pages.jsonl")],
            page_vectors=page_vectors,
            folder=folder,
            sentences=StoredRecords(sentences, decode_row, count=len(evidence_vectors)) if sentences.exists() else None,
        )


class StoredRecords(Sequence, Generic[R]):
    """The records of one JSONL file of a segment, read when first asked for (the file never changes).

    A single row asked for before the whole list is decoded from its own line (the file is mapped and its line
    starts found once): a query after a restart reads a few rows of many segments, and should not decode
    every record of each."""

    def __init__(self, path: Path, parse: Callable[[Any], R], count: Optional[int] = None):
        """`count`: the number of records when it is known without reading them (the rows of their vectors)."""
        self.path = path
        self._parse = parse
        self._count = count
        self._lock = threading.Lock()
        self._records: Optional[list[R]] = None
        self._lines: Optional[tuple[Any, np.ndarray]] = None  # the mapped file, each line's start and end

    @property
    def records(self) -> list[R]:
        if self._records is None:
            with self._lock:  # the graph build and a query may ask at once: read once
                if self._records is None:
                    records = [self._parse(row) for row in _read_jsonl(self.path)]
                    self._check(len(records))
                    self._records, self._lines = records, None
        return self._records

    def _check(self, found: int) -> None:
        if self._count is not None and found != self._count:
            raise ValueError(f"{self.path} holds {found} records for {self._count} vectors")

    def find_lines(self) -> None:
        """Find each line of the file now (unless its records are decoded already), so that the first row asked
        for costs a row's decoding and no scan of the file."""
        if self._records is None:
            self._line_bounds()

    def _line_bounds(self) -> tuple[Any, np.ndarray]:
        """The mapped file and each line's start and end, found once (a scan for line breaks, nothing decoded)."""
        lines = self._lines
        if lines is None:
            with self._lock:
                if self._lines is None:
                    with open(self.path, "rb") as handle:
                        size = os.fstat(handle.fileno()).st_size
                        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
                    ends = np.flatnonzero(np.frombuffer(mapped, dtype=np.uint8) == ord("\n"))
                    self._check(len(ends))
                    self._lines = (mapped, np.stack([np.concatenate([[0], ends[:-1] + 1]), ends], axis=1).reshape(-1, 2))
                lines = self._lines
        return lines

    def _row(self, index: int) -> R:
        mapped, bounds = self._line_bounds()
        start, end = bounds[index]
        return self._parse(json.loads(mapped[start:end]))

    def __len__(self) -> int:
        """Without decoding a record: the count given, the decoded list's, or the file's lines (a query asks for the
        length of a document's blocks, and must not decode a thousand of them for it)."""
        if self._count is not None:
            return self._count
        records = self._records
        return len(records) if records is not None else len(self._line_bounds()[1])

    def __getitem__(self, index):  # type: ignore[override]
        records = self._records
        if records is not None or isinstance(index, slice):
            return (records if records is not None else self.records)[index]
        return self._row(index)

    def __iter__(self) -> Iterator[R]:
        return iter(self.records)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, StoredRecords)) else NotImplemented


def _write_terms(path: Path, terms: TermCounts, pages: np.ndarray) -> None:
    """TermCounts as one npz: the CSR arrays, the lengths, the vocabulary in column order (one term per line:
    a term never holds a line break) and the tokeniser's version; with each row's page."""
    vocabulary = "\n".join(terms.vocabulary).encode("utf-8")
    with open(path, "wb") as handle:
        np.savez(
            handle, version=np.int64(LEXICAL_TERMS_VERSION), data=terms.counts.data, indices=terms.counts.indices,
            indptr=terms.counts.indptr, columns=np.int64(terms.counts.shape[1]), lengths=terms.lengths,
            vocabulary=np.frombuffer(vocabulary, dtype=np.uint8), pages=np.asarray(pages, dtype=np.int64),
        )
        handle.flush()
        os.fsync(handle.fileno())


def _read_terms(path: Path, rows: int) -> tuple[TermCounts, np.ndarray]:
    with np.load(path, allow_pickle=False) as stored:
        if int(stored["version"]) != LEXICAL_TERMS_VERSION:
            raise ValueError(f"tokenised by version {int(stored['version'])} of lexical_terms, now {LEXICAL_TERMS_VERSION}")
        text = stored["vocabulary"].tobytes().decode("utf-8")
        terms = text.split("\n") if text else []
        columns = int(stored["columns"])
        if len(terms) != columns or len(stored["indptr"]) != rows + 1 or len(stored["lengths"]) != rows or len(stored["pages"]) != rows:
            raise ValueError(f"holds {len(stored['indptr']) - 1} rows and {len(terms)} terms for {rows} texts and {columns} columns")
        counts = sparse.csr_matrix((stored["data"], stored["indices"], stored["indptr"]), shape=(rows, columns))
        return TermCounts({term: column for column, term in enumerate(terms)}, counts, stored["lengths"]), stored["pages"]


def _mapped(path: Path) -> np.ndarray:
    """A stored vector table mapped from disk (not read), as a plain array: a memmap makes a new memmap object
    for every row a query reads, which costs more than reading the row."""
    return np.asarray(np.load(path, mmap_mode="r"))


def _block(row: dict[str, Any]) -> Block:
    row["bbox"] = tuple(row["bbox"])
    return Block(**row)


def _evidence(row: dict[str, Any]) -> EvidenceRecord:
    row["spans"] = tuple(
        Span(s["block"], s["page"], tuple(s["bbox"]), s.get("start", 0), s.get("end", 0), s.get("ocr_confidence"))
        for s in row["spans"]
    )
    return EvidenceRecord(**row)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    write_durably(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def _write_json(path: Path, value: Any) -> None:
    write_durably(path, json.dumps(value, ensure_ascii=False))


def _write_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array, dtype=np.float32))
        handle.flush()
        os.fsync(handle.fileno())


def write_durably(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes the names in it durable)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
