"""A collection's manifest: the one file that names its documents' segments, replaced atomically per commit.

    <data_dir>/collections/<name>/manifest.json    {"generation": N, "documents": [{"name", "segment"}, ...]}
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from .segments import fsync_path, write_durably

COLLECTION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MANIFEST = "manifest.json"
STAGING_PREFIX = ".staging-"
DELETED_PREFIX = ".deleted-"  # a collection being removed: renamed away first, so it vanishes atomically


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    segment: str



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
