"""Local files as documents: which files are documents, and how each travels to the server. The client's ingest
(orchestrator/client/) reads them so; the gateway reads a path on the server's own disk the same way.

A MinerU output folder (holding a *_content_list.json and its images/) travels as one zip; every other
document travels as its own bytes. Names are paths relative to the folder given, so re-ingesting a folder
replaces exactly the documents that changed.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .sources import CONTENT_LIST_PATTERNS

DOCUMENT_SUFFIXES = frozenset({".pdf", ".png", ".jpg", ".jpeg", ".md", ".markdown", ".txt"})


@dataclass(frozen=True)
class LocalSource:
    name: str
    data: bytes
    media_type: str = ""


def is_content_list_folder(folder: Path) -> bool:
    return folder.is_dir() and any(next(folder.glob(pattern), None) for pattern in CONTENT_LIST_PATTERNS)


def read_source(path: Path, name: str = "") -> LocalSource:
    if path.is_dir():
        if not is_content_list_folder(path):
            raise ValueError(f"{path} is a folder without a *_content_list.json; pass its files instead")
        return LocalSource(name or path.name, zip_folder(path), "application/zip")
    return LocalSource(name or path.name, path.read_bytes())


def zip_folder(folder: Path) -> bytes:
    """The folder's regular files (symbolic links are left out: they could point anywhere)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                archive.write(path, path.relative_to(folder).as_posix())
    return buffer.getvalue()


def zip_files(members: dict[str, Path]) -> bytes:
    """A zip whose bytes depend only on the members' names and contents (sorted, fixed timestamps, stored):
    the server identifies a document by the hash of its upload, so packing the same output twice must give the
    same document (`already present` on re-ingest)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            archive.writestr(info, Path(members[name]).read_bytes())
    return buffer.getvalue()


def find_documents(paths: list[Path]) -> list[tuple[Path, str]]:
    """(path, document name) for every document under the given files and folders, in a stable order."""
    found: list[tuple[Path, str]] = []
    for root in paths:
        if root.is_file() or is_content_list_folder(root):
            found.append((root, root.name))
            continue
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: no such file or folder")
        content_folders = sorted({p.parent for pattern in CONTENT_LIST_PATTERNS for p in root.rglob(pattern)})
        for folder in content_folders:
            found.append((folder, folder.relative_to(root).as_posix() or root.name))
        for path in sorted(root.rglob("*")):
            inside_content_folder = any(path.is_relative_to(folder) for folder in content_folders)
            if path.is_file() and path.suffix.lower() in DOCUMENT_SUFFIXES and not inside_content_folder:
                found.append((path, path.relative_to(root).as_posix()))
    return found
