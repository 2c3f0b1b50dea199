"""What kind of document a client sent, decided from its bytes first and its name second.

A content list produced elsewhere travels as a zip of MinerU's output folder (the *_content_list.json with its
images/); it is unpacked with every member path checked, so an archive cannot write outside its folder.
"""

from __future__ import annotations

import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import InvalidRequestError

PDF, IMAGE, MARKDOWN, TEXT, CONTENT_LIST = "pdf", "image", "markdown", "text", "content_list"

MEDIA_TYPES = {
    PDF: "application/pdf",
    IMAGE: "image/*",
    MARKDOWN: "text/markdown",
    TEXT: "text/plain",
    CONTENT_LIST: "application/zip",
}
_SUFFIXES = {".md": MARKDOWN, ".markdown": MARKDOWN, ".txt": TEXT, ".text": TEXT}
_IMAGE_MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg"}
CONTENT_LIST_PATTERNS = ("*_content_list.json", "*content_list_v2.json", "content_list.json")
MAX_ARCHIVE_MEMBERS = 100_000


@dataclass(frozen=True)
class SourceKind:
    kind: str
    media_type: str


def detect(filename: str, data: bytes, media_type: str = "") -> SourceKind:
    """The document's kind; unsupported or unrecognisable input gets an error that says what is accepted."""
    if data.startswith(b"%PDF-") or media_type == "application/pdf":
        return SourceKind(PDF, "application/pdf")
    for magic, image_type in _IMAGE_MAGIC.items():
        if data.startswith(magic):
            return SourceKind(IMAGE, image_type)
    suffix = PurePosixPath(filename).suffix.lower()
    # Office files are zips too: only a .zip (or a name without suffix, as the CLI sends folders) is MinerU output.
    if (data.startswith(b"PK\x03\x04") and suffix in ("", ".zip")) or media_type == "application/zip":
        return SourceKind(CONTENT_LIST, "application/zip")
    if suffix in _SUFFIXES or media_type in ("text/plain", "text/markdown"):
        kind = _SUFFIXES.get(suffix) or (MARKDOWN if media_type == "text/markdown" else TEXT)
        return SourceKind(kind, MEDIA_TYPES[kind])
    raise InvalidRequestError(
        f"{filename!r}: unsupported document type ({media_type or suffix or 'no extension'}); accepted: PDF, PNG, "
        "JPEG, Markdown (.md), plain text (.txt), and zipped MinerU output folders with a *_content_list.json"
    )


def unpack_content_list(archive: Path, into: Path, filename: str) -> Path:
    """Extract a zipped MinerU output folder and return its content list file. Unsafe members are refused."""
    try:
        with zipfile.ZipFile(archive) as bundle:
            members = bundle.infolist()
            if len(members) > MAX_ARCHIVE_MEMBERS:
                raise InvalidRequestError(f"{filename!r}: archive has {len(members)} members (limit {MAX_ARCHIVE_MEMBERS})")
            for member in members:
                path = PurePosixPath(member.filename)
                mode = member.external_attr >> 16
                if path.is_absolute() or ".." in path.parts or "\\" in member.filename or stat.S_ISLNK(mode):
                    raise InvalidRequestError(
                        f"{filename!r}: archive member {member.filename!r} points outside the archive's folder: refused"
                    )
            bundle.extractall(into)
    except zipfile.BadZipFile as error:
        raise InvalidRequestError(f"{filename!r} is not a readable zip archive ({error})") from None
    found = sorted(p for pattern in CONTENT_LIST_PATTERNS for p in into.rglob(pattern) if p.is_file())
    if not found:
        raise InvalidRequestError(f"{filename!r}: the archive holds no *_content_list.json (MinerU output folder expected)")
    return found[0]
