"""What kind of document a client sent, decided from its bytes first and its name second.

A content list produced elsewhere travels as a zip of MinerU's output folder (the *_content_list.json with its
images/); it is unpacked with every member path checked, so an archive cannot write outside its folder. When the
folder also holds the document it was made from, as MinerU 1.x-3.x wrote it (`<name>_origin.pdf`) and as
`thinkserve ingest --ray` packs it (PDF, PNG or JPEG), that file gives the page count and the page images.
"""

from __future__ import annotations

import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

from ...errors import InvalidRequestError
from . import sniffing

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
ORIGIN_SUFFIXES = (".pdf", ".png", ".jpg", ".jpeg")  # `<name>_origin<suffix>` beside a content list


@dataclass(frozen=True)
class SourceKind:
    kind: str
    media_type: str


ACCEPTED = ("accepted: PDF, PNG, JPEG, Markdown (.md), plain text (.txt), and zipped MinerU output folders with a "
            "*_content_list.json")
# what a name or a declared media type claims; the bytes must agree before the file is read as that
_CLAIMED = {".pdf": "a PDF", ".png": "a PNG image", ".jpg": "a JPEG image", ".jpeg": "a JPEG image", ".zip": "a zip archive"}
_CLAIMED_MEDIA = {"application/pdf": "a PDF", "image/png": "a PNG image", "image/jpeg": "a JPEG image",
                  "application/zip": "a zip archive"}
PDF_HEADER_WITHIN = 1024  # readers accept the %PDF- header anywhere in the first KiB, after junk


def detect(filename: str, data: bytes, media_type: str = "") -> SourceKind:
    """The document's kind; unsupported or unrecognisable input gets an error that says what the bytes are and
    what is accepted."""
    if not data:
        raise InvalidRequestError(f"{filename!r} is empty (0 bytes): nothing to ingest")
    is_zip = data.startswith((b"PK\x03\x04", b"PK\x05\x06"))
    # a zip that stores a PDF uncompressed shows %PDF- in its first KiB too: its own magic decides first
    if not is_zip and b"%PDF-" in data[:PDF_HEADER_WITHIN]:
        return SourceKind(PDF, "application/pdf")
    for magic, image_type in _IMAGE_MAGIC.items():
        if data.startswith(magic):
            return SourceKind(IMAGE, image_type)
    suffix = PurePosixPath(filename).suffix.lower()
    # Office files are zips too: only a .zip (or a name without suffix, as the CLI sends folders) is MinerU output.
    if is_zip and (media_type == "application/zip" or (suffix in ("", ".zip") and media_type not in _CLAIMED_MEDIA)):
        return SourceKind(CONTENT_LIST, "application/zip")
    claimed = _CLAIMED_MEDIA.get(media_type) or _CLAIMED.get(suffix)
    if claimed:  # named or sent as a kind it is not: say what it is
        label = f"sent as {media_type}" if media_type in _CLAIMED_MEDIA else f"named {suffix}"
        raise InvalidRequestError(
            f"{filename!r} is not {claimed} ({label}): its bytes are "
            f"{sniffing.describe(data)}; {ACCEPTED}"
        )
    if suffix in _SUFFIXES or media_type in ("text/plain", "text/markdown"):
        kind = _SUFFIXES.get(suffix) or (MARKDOWN if media_type == "text/markdown" else TEXT)
        return SourceKind(kind, MEDIA_TYPES[kind])
    raise InvalidRequestError(
        f"{filename!r}: unsupported document type ({media_type or suffix or 'no extension'}); its bytes are "
        f"{sniffing.describe(data)}; {ACCEPTED}"
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


def find_origin(content_list: Path) -> Optional[Path]:
    """The original document beside a content list (`*_origin.pdf|png|jpg|jpeg`), None when there is none.

    Only the content list's own folder counts (MinerU's `_layout.pdf` / `_span.pdf` debug renders never match).
    Two candidates are refused rather than guessed between; an origin image must really be a PNG or JPEG.
    """
    found = sorted(
        path for path in content_list.parent.iterdir()
        if path.is_file() and not path.is_symlink() and path.name.lower().endswith(tuple(f"_origin{s}" for s in ORIGIN_SUFFIXES))
    )
    if len(found) > 1:
        raise InvalidRequestError(
            f"{content_list.name}: its folder holds {len(found)} original documents ({', '.join(p.name for p in found)}); keep one"
        )
    if not found:
        return None
    origin = found[0]
    if origin.suffix.lower() != ".pdf":
        with origin.open("rb") as file:
            head = file.read(8)
        if not any(head.startswith(magic) for magic in _IMAGE_MAGIC):
            raise InvalidRequestError(f"{origin.name}: not a PNG or JPEG image (refused as the original document)")
    return origin
