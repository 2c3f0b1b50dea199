"""All collections under one data folder (KnowledgeBase): opening, creating and deleting them, the writer lock
of the folder, and a read replica's following of the writer's manifests."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
from pathlib import Path
from typing import Callable, Optional

from ...errors import AlreadyExistsError, InvalidRequestError, NotFoundError
from .collection import PUBLISH_BEFORE_GRAPH_ROWS, Collection
from .indexes import IndexSpec
from .manifest import COLLECTION_NAME, DELETED_PREFIX, MANIFEST, write_manifest
from .segments import fsync_path
from .snapshot import Snapshot
from .writer_lock import WriterLock

log = logging.getLogger("thinkserve.knowledge")


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
            for leftover in self.root.glob(f"{DELETED_PREFIX}*"):  # a deletion cut short by a crash
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
        graveyard = self.root / f"{DELETED_PREFIX}{name}-{secrets.token_hex(4)}"
        os.replace(collection.root, graveyard)
        fsync_path(self.root)
        self._collections.pop(name, None)
        shutil.rmtree(graveyard, ignore_errors=True)
        return last
