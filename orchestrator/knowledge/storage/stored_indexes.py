"""Vector indexes written beside the manifest, so a restart loads them instead of building them again.

HNSW and IVF take minutes to build at a million vectors (HNSW 303 s, IVF 133 s in the bench's micro results);
a Flat index is a copy of its vectors, which the segments keep memory-mapped, so Flat tables are never written.

    <collection>/indexes-<generation>-<nonce>/   the indexes of the manifest's generation (older ones removed)
        <table>.faiss   evidence, entity, relation, page-<family>
        <table>.removed.npy  the ids in it of documents deleted since it was built (skipped by searches), if any
        meta.json       written last: the segments it was built from (manifest order), the index settings,
                        each table's kind, size and file length

A writer does not write them at every commit (at a million vectors they are 3 GB): only once the documents
appended since the last write hold `index_write_vectors` vectors, or when a delete or replacement removed a
document they hold. At open, the folder whose meta.json names the longest prefix of the manifest's segments
(all of them, or all but the documents appended since) is used if it was built with the same index settings,
and the remaining documents' vectors are added to it; a table whose file is missing, has another length or
cannot be read is rebuilt from the segments, and the collection logs why. The files are derived data: losing
them costs a rebuild, never a record. They are written just before the manifest that names their segments (so a
read replica that reads a manifest finds its indexes); a crash in between leaves a folder no manifest names,
removed at the next open.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from .indexes import PLACEMENT_FIELDS, IndexSpec, VectorIndex
from .segments import fsync_path, write_durably

PREFIX = "indexes-"
META = "meta.json"
REMOVED = ".removed.npy"  # beside <table>.faiss: ids of its vectors that deleted documents left (VectorIndex.removed_ids)


@dataclass
class StoredIndexes:
    """What open found: the indexes read, the folder they came from, and why anything else was not used."""

    indexes: dict[str, VectorIndex] = field(default_factory=dict)
    folder: Optional[str] = None  # kept by the collection's clean-up
    covered: int = 0  # the manifest's first `covered` segments are what the indexes hold
    notes: list[str] = field(default_factory=list)


def persisted(index: VectorIndex) -> bool:
    """Whether a table's index is worth writing: anything slower to build than to read (not Flat)."""
    return index.size > 0 and index.kind != "flat"


def _settings(spec: IndexSpec) -> dict:
    """The settings that decide an index's contents (where it runs does not)."""
    return {name: value for name, value in asdict(spec).items() if name not in PLACEMENT_FIELDS}


def write(root: Path, generation: int, segments: Sequence[str], spec: IndexSpec, tables: Mapping[str, VectorIndex]) -> Optional[str]:
    """Write the tables worth writing into a new folder under `root`; its name, or None when none is."""
    chosen = {table: index for table, index in tables.items() if persisted(index)}
    if not chosen:
        return None
    folder = root / f"{PREFIX}{generation}-{secrets.token_hex(4)}"
    folder.mkdir()
    meta = {"generation": generation, "segments": list(segments), "settings": _settings(spec), "tables": {}}
    for table, index in chosen.items():
        path = folder / f"{table}.faiss"
        index.write(path)
        facts = {"kind": index.kind, "size": index.size, "bytes": path.stat().st_size, "removed": len(index.removed_ids)}
        if len(index.removed_ids):  # the vectors of documents deleted since it was built: still in it, skipped
            np.save(folder / f"{table}{REMOVED}", index.removed_ids)
        for written in (path, folder / f"{table}{REMOVED}"):
            if written.exists():
                with open(written, "rb") as handle:
                    os.fsync(handle.fileno())
        meta["tables"][table] = facts
    write_durably(folder / META, json.dumps(meta, indent=1))
    fsync_path(folder)
    fsync_path(root)
    return folder.name


def read(root: Path, segments: Sequence[str], spec: IndexSpec) -> StoredIndexes:
    """The stored indexes of the collection whose manifest names `segments` (or its longest prefix that has
    any: the documents appended since are added by the caller), as far as they can be trusted."""
    found = StoredIndexes()
    candidates = sorted(root.glob(f"{PREFIX}*/{META}")) if root.exists() else []
    metas = []
    for path in candidates:
        try:
            metas.append((path.parent, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as error:
            found.notes.append(f"{path.parent.name}: unreadable {META} ({error})")
    names = list(segments)
    matching = [(folder, meta) for folder, meta in metas if _is_prefix(meta.get("segments"), names)]
    if not matching:
        if segments:
            found.notes.append(f"no stored indexes were written for this manifest's {len(segments)} documents")
        return found
    folder, meta = max(matching, key=lambda candidate: len(candidate[1]["segments"]))  # the longest prefix
    if meta.get("settings") != _settings(spec):
        found.notes.append(f"{folder.name} was built with other index settings ({meta.get('settings')})")
        return found
    found.folder, found.covered = folder.name, len(meta["segments"])
    for table, facts in meta.get("tables", {}).items():
        path = folder / f"{table}.faiss"
        try:
            length = path.stat().st_size
            if length != facts["bytes"]:
                raise ValueError(f"{length} bytes where {facts['bytes']} were written")
            removed = np.load(folder / f"{table}{REMOVED}") if facts.get("removed") else None
            if removed is not None and len(removed) != facts["removed"]:
                raise ValueError(f"{len(removed)} removed ids where {facts['removed']} were written")
            index = VectorIndex.read(spec, path, facts["kind"], removed)
            if index.size != facts["size"]:
                raise ValueError(f"{index.size} vectors where {facts['size']} were written")
        except (OSError, EOFError, RuntimeError, ValueError, KeyError) as error:
            found.notes.append(f"{folder.name}/{table}.faiss is not usable: {error}")
            continue
        found.indexes[table] = index
    return found


def _is_prefix(prefix: object, names: list[str]) -> bool:
    return isinstance(prefix, list) and 0 < len(prefix) <= len(names) and names[: len(prefix)] == prefix
