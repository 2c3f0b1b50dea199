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
import logging
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from ...errors import InvalidRequestError, NotFoundError, ReadOnlyError
from . import stored_indexes
from .incremental import is_prefix
from .indexes import IndexSpec
from .manifest import MANIFEST, STAGING_PREFIX, ManifestEntry, read_manifest, write_manifest
from .reaper import REAPER
from .segments import DocumentRecord, Segment, fsync_path
from .snapshot import Snapshot

log = logging.getLogger("thinkserve.knowledge")
# a commit's snapshot of this many evidence rows or more is published before its graph is built (as
# config.StorageSettings.publish_before_graph_rows, which servers pass)
PUBLISH_BEFORE_GRAPH_ROWS = 20_000


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
        if is_prefix(current.segments, segments):
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
        folder = self.root / f"{STAGING_PREFIX}{secrets.token_hex(6)}"
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
                    if entry.name.startswith(STAGING_PREFIX) or now - dropped >= self.retain_dropped_s:
                        shutil.rmtree(entry, ignore_errors=True)
                        self._dropped.pop(entry.name, None)
                elif entry.name.startswith(f".{MANIFEST}."):  # a manifest write cut short by a crash
                    entry.unlink(missing_ok=True)
