"""One document's share of a collection, stored as an immutable folder (a segment).

    seg-<document id>-<nonce>/
        document.json    the DocumentRecord (name, content hash, counts, parser, warnings)
        blocks.jsonl     parsed blocks with page, bbox and asset
        evidence.jsonl   text passages and multimodal units: what retrieval returns and answers cite
        entities.jsonl   entity mentions (normalised key, name, type, description, evidence id)
        relations.jsonl  relation mentions between entity keys
        pages.jsonl      page renders
        *.npy            vectors, row-aligned with the records above (memory-mapped when loaded)
        assets/          images of the document's figures and tables; pages/ holds the page renders

Everything a document contributes lives in its segment, so deleting a document is dropping one folder from
the manifest, and the merged views (graph, indexes) are recomputed from the segments that remain: there is
nothing left to orphan. Entities shared by several documents are merged when the snapshot is built.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

from .chunking import Span
from .documents import NO_PAGE, Block
from .graph import DocumentGraph, MultimodalUnit
from .indexes import TermCounts

DOCUMENT_FILE = "document.json"


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
    blocks: list[Block]
    evidence: list[EvidenceRecord]
    evidence_vectors: np.ndarray
    entities: list[EntityMention]
    entity_keys: list[str]  # unique keys in first-mention order, row-aligned with entity_vectors
    entity_vectors: np.ndarray
    relations: list[RelationMention]
    relation_keys: list[tuple[str, str]]  # unique (source, target) pairs, sorted within the pair
    relation_vectors: np.ndarray
    pages: list[PageRecord] = field(default_factory=list)
    page_vectors: dict[str, np.ndarray] = field(default_factory=dict)  # per page-encoder family
    folder: Optional[Path] = None  # set once written

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
        for sub in ("assets", "pages"):
            for path in sorted((folder / sub).rglob("*")) if (folder / sub).exists() else ():
                if path.is_file():
                    fsync_path(path)
        _write_json(folder / DOCUMENT_FILE, asdict(self.document))  # last: its presence marks a complete folder
        self.folder = folder

    def fault_in(self) -> None:
        """Read one value of each memory page of the vector tables queries read row by row (evidence, page
        images): mapped from disk, each page would otherwise cost the first query that touches it a page fault,
        a disk read after a restart (several milliseconds per query until most pages were touched)."""
        for table in (self.evidence_vectors, *self.page_vectors.values()):
            flat = np.asarray(table).reshape(-1)
            if flat.size:
                float(flat[:: max(1, mmap.PAGESIZE // flat.itemsize)].sum())

    @functools.cached_property
    def embedded_entity_rows(self) -> frozenset[int]:
        """Rows of entity_vectors that hold a vector (ingest.entity_min_mentions leaves the others zeros)."""
        vectors = np.asarray(self.entity_vectors)
        return frozenset(np.flatnonzero(np.any(vectors != 0, axis=1)).tolist()) if vectors.ndim == 2 and vectors.size else frozenset()

    @functools.cached_property
    def term_counts(self) -> TermCounts:
        """Its evidence texts tokenised for BM25, once per loaded segment (every snapshot holding it shares them)."""
        return TermCounts.of([e.text for e in self.evidence])

    @functools.cached_property
    def page_term_counts(self) -> TermCounts:
        """The same per text page (its evidence joined, pages in first-seen order): BM25 over whole pages."""
        first_seen: dict[int, int] = {}
        numbers = np.asarray([first_seen.setdefault(e.page, len(first_seen)) for e in self.evidence], dtype=np.int64)
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
        keys = json.loads((folder / "keys.json").read_text(encoding="utf-8"))
        page_vectors = {
            path.stem.removeprefix("pages-"): _mapped(path) for path in sorted(folder.glob("pages-*.npy"))
        }
        return cls(
            document=DocumentRecord(**document),
            blocks=[_block(row) for row in _read_jsonl(folder / "blocks.jsonl")],
            evidence=[_evidence(row) for row in _read_jsonl(folder / "evidence.jsonl")],
            evidence_vectors=_mapped(folder / "evidence.npy"),
            entities=[EntityMention(**row) for row in _read_jsonl(folder / "entities.jsonl")],
            entity_keys=list(keys["entities"]),
            entity_vectors=_mapped(folder / "entities.npy"),
            relations=[RelationMention(**row) for row in _read_jsonl(folder / "relations.jsonl")],
            relation_keys=[tuple(pair) for pair in keys["relations"]],
            relation_vectors=_mapped(folder / "relations.npy"),
            pages=[PageRecord(**row) for row in _read_jsonl(folder / "pages.jsonl")],
            page_vectors=page_vectors,
            folder=folder,
        )


def _mapped(path: Path) -> np.ndarray:
    """A stored vector table mapped from disk (not read), as a plain array: a memmap makes a new memmap object
    for every row a query reads, which costs more than reading the row."""
    return np.asarray(np.load(path, mmap_mode="r"))


def _block(row: dict[str, Any]) -> Block:
    row["bbox"] = tuple(row["bbox"])
    return Block(**row)


def _evidence(row: dict[str, Any]) -> EvidenceRecord:
    row["spans"] = tuple(Span(s["block"], s["page"], tuple(s["bbox"]), s.get("start", 0), s.get("end", 0)) for s in row["spans"])
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
