"""Collections on disk: immutable snapshots (passages + FAISS index), switched atomically one document at a time.

    <data_dir>/collections/<name>/CURRENT        name of the live snapshot folder
    <data_dir>/collections/<name>/snap-000007/   documents.json, passages.jsonl, dense.faiss

A commit writes a complete new snapshot beside the live one, then replaces CURRENT (os.replace, fsynced): a
crash at any moment leaves the previous snapshot or the new one, never half a document. Queries read the
snapshot object they started with, so they never see a commit half-applied.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import faiss
import numpy as np

from ..errors import InvalidRequestError, NotFoundError

COLLECTION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_SNAPSHOT = re.compile(r"^snap-(\d{6})$")


@dataclass(frozen=True)
class PassageRecord:
    passage_id: str
    document_id: str
    document_name: str
    section: str
    ordinal: int
    text: str
    page: int = -1  # -1: the source has no pages
    block_type: str = "text"


@dataclass(frozen=True)
class DocumentRecord:
    document_id: str
    name: str
    media_type: str
    passages: int
    added_at: float


class Snapshot:
    """One immutable state of a collection."""

    def __init__(self, name: str, documents: dict[str, DocumentRecord], passages: list[PassageRecord], index: Optional[faiss.Index]):
        self.name = name
        self.documents = documents
        self.passages = passages
        self.index = index

    def search(self, vector: np.ndarray, k: int) -> list[tuple[PassageRecord, float]]:
        """Passages by cosine similarity (the embeddings are L2-normalised), best first."""
        if self.index is None or self.index.ntotal == 0:
            return []
        scores, rows = self.index.search(np.ascontiguousarray(vector.reshape(1, -1), dtype=np.float32), min(k, self.index.ntotal))
        return [(self.passages[row], float(score)) for row, score in zip(rows[0], scores[0]) if row >= 0]


class Collection:
    def __init__(self, root: Path):
        self.root = root
        self.name = root.name
        self.write_lock = asyncio.Lock()
        self._snapshot: Optional[Snapshot] = None

    @property
    def snapshot(self) -> Snapshot:
        if self._snapshot is None:
            self._snapshot = self._load()
        return self._snapshot

    def _load(self) -> Snapshot:
        current = self.root / "CURRENT"
        if not current.exists():
            return Snapshot("", {}, [], None)
        folder = self.root / current.read_text().strip()
        documents = {
            key: DocumentRecord(**value) for key, value in json.loads((folder / "documents.json").read_text()).items()
        }
        with open(folder / "passages.jsonl", encoding="utf-8") as lines:
            passages = [PassageRecord(**json.loads(line)) for line in lines]
        index = faiss.read_index(str(folder / "dense.faiss"))
        if index.ntotal != len(passages):
            raise RuntimeError(f"collection {self.name}: snapshot {folder.name} has {index.ntotal} vectors for {len(passages)} passages")
        return Snapshot(folder.name, documents, passages, index)

    def commit_document(self, document: DocumentRecord, passages: list[PassageRecord], embeddings: np.ndarray) -> None:
        """Add one document: build the next snapshot, then switch to it atomically. Caller holds write_lock."""
        old = self.snapshot
        vectors = np.ascontiguousarray(embeddings, dtype=np.float32)
        if old.index is not None and old.index.d != vectors.shape[1]:
            raise InvalidRequestError(
                f"collection {self.name} holds {old.index.d}-d embeddings but the embedder now gives "
                f"{vectors.shape[1]}-d: it was built with another model profile"
            )
        index = faiss.clone_index(old.index) if old.index is not None else faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        documents = {**old.documents, document.document_id: document}
        all_passages = old.passages + passages

        number = int(_SNAPSHOT.match(old.name).group(1)) + 1 if old.name else 1
        name = f"snap-{number:06d}"
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = self.root / f".{name}.tmp-{secrets.token_hex(4)}"
        scratch.mkdir()
        try:
            _write_durably(scratch / "documents.json", json.dumps({k: asdict(v) for k, v in documents.items()}))
            _write_durably(
                scratch / "passages.jsonl", "".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in all_passages)
            )
            faiss.write_index(index, str(scratch / "dense.faiss"))
            _fsync(scratch / "dense.faiss")
            scratch.rename(self.root / name)
            _fsync(self.root)
            _write_durably(self.root / "CURRENT.tmp", name)
            os.replace(self.root / "CURRENT.tmp", self.root / "CURRENT")
            _fsync(self.root)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self._snapshot = Snapshot(name, documents, all_passages, index)
        self._remove_stale(keep={name})

    def _remove_stale(self, keep: set[str]) -> None:
        """Old snapshots and scratch folders of interrupted commits (queries hold their snapshot in memory)."""
        for entry in self.root.iterdir():
            if entry.is_dir() and entry.name not in keep:
                shutil.rmtree(entry, ignore_errors=True)


class KnowledgeBase:
    """All collections under one data folder; collections never share files."""

    def __init__(self, data_dir: Path):
        self.root = data_dir / "collections"
        self._collections: dict[str, Collection] = {}

    def collection(self, name: str, create: bool = False) -> Collection:
        if not COLLECTION_NAME.match(name or ""):
            raise InvalidRequestError(f"collection name {name!r} must match {COLLECTION_NAME.pattern}")
        root = self.root / name
        # A collection exists once its first document is committed, even if an ingest created the object.
        if not create and not (root / "CURRENT").exists():
            raise NotFoundError(f"collection {name!r} does not exist (ingest a document into it first)")
        if name not in self._collections:
            self._collections[name] = Collection(root)
        return self._collections[name]

    def names(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "CURRENT").exists())


def new_document(document_id: str, name: str, media_type: str, passages: int) -> DocumentRecord:
    return DocumentRecord(document_id, name, media_type, passages, time.time())


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
