"""What a file's bytes actually are, in words, for the error that refuses it.

A file named `report.pdf` that holds an HTML page (a download that fetched a login page), nothing at all (an
interrupted copy) or an Office document should be refused with what it is, not with 'a PDF is not accepted':
the sender can only fix what the message names. Only the first bytes are read (and a zip's member names);
nothing here decides what is ingested, sources.detect does.
"""

from __future__ import annotations

import io
import zipfile

# magic bytes at offset 0 -> what a person would call the file
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x00\x00\x00\x0cjP  ", "a JPEG 2000 image"),
    (b"8BPS", "a Photoshop image"),
    (b"\x1f\x8b", "a gzip-compressed file"),
    (b"BZh", "a bzip2-compressed file"),
    (b"\xfd7zXZ\x00", "an xz-compressed file"),
    (b"(\xb5/\xfd", "a zstd-compressed file"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Microsoft Office document (.doc, .xls or .ppt)"),
    (b"{\\rtf", "an RTF document"),
    (b"%!PS", "a PostScript file"),
    (b"\x7fELF", "an executable (ELF)"),
    (b"MZ", "an executable (Windows)"),
    (b"\xca\xfe\xba\xbe", "a Java class or macOS executable"),
    (b"\x00asm", "a WebAssembly module"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"ID3", "an MP3 audio file"),
    (b"OggS", "an Ogg audio or video file"),
    (b"fLaC", "a FLAC audio file"),
    (b"\x1aE\xdf\xa3", "a Matroska or WebM video"),
    (b"wOFF", "a web font"),
    (b"wOF2", "a web font"),
)
_ZIP_KINDS = (("word/", "a Word document (.docx)"), ("ppt/", "a PowerPoint presentation (.pptx)"),
              ("xl/", "an Excel workbook (.xlsx)"), ("META-INF/", "a Java or EPUB archive"))
_HEAD = 1024


def describe(data: bytes) -> str:
    """A short phrase naming what `data` is ('an HTML page', 'an empty file', ...), never empty."""
    if not data:
        return "an empty file (0 bytes)"
    head = data[:_HEAD]
    if not head.strip():
        return f"a file of {len(data)} blank bytes (whitespace or NULs only)" if len(data) <= _HEAD else "blank bytes"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return _zip_kind(data)
    if head[:4] == b"RIFF" and head[8:12] in (b"WEBP", b"WAVE", b"AVI "):
        return {b"WEBP": "a WebP image", b"WAVE": "a WAV audio file", b"AVI ": "an AVI video"}[head[8:12]]
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        return "a HEIC/AVIF image" if brand in (b"heic", b"heix", b"mif1", b"avif") else "an MP4/QuickTime video"
    if head.startswith(b"BM") and len(head) > 14 and head[6:10] == b"\x00\x00\x00\x00":
        return "a BMP image"
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    return _text_kind(head, len(data))


def _zip_kind(data: bytes) -> str:
    """Which zip: Office documents and EPUBs are zips; names are read from the central directory only."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError):
        return "a damaged or truncated zip archive"
    if "mimetype" in names and any(n.endswith(".opf") for n in names):
        return "an EPUB book"
    for prefix, what in _ZIP_KINDS:
        if any(name.startswith(prefix) for name in names):
            return what
    return f"a zip archive of {len(names)} file{'s' if len(names) != 1 else ''}"


def _text_kind(head: bytes, size: int) -> str:
    """Text of some kind (HTML, XML, JSON, plain), or binary data nobody recognises."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16 text (only UTF-8 is read)"
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not just a character cut at the 1 KiB boundary
            printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in head) / len(head)
            return "text in an encoding other than UTF-8" if printable > 0.9 else f"binary data of no known format ({size} bytes)"
        text = head[: error.start].decode("utf-8-sig")
    start = text.lstrip().lower()
    if start.startswith(("<!doctype html", "<html")) or "<html" in start[:_HEAD] or "<body" in start[:_HEAD]:
        return "an HTML page"
    if start.startswith("<svg") or (start.startswith("<?xml") and "<svg" in start):
        return "an SVG image"
    if start.startswith("<?xml") or start.startswith("<"):
        return "an XML document"
    if start.startswith(("{", "[")):
        return "JSON or other structured text"
    if "\x00" in text or sum(ch.isprintable() or ch in "\t\r\n" for ch in text) < 0.9 * len(text):
        return f"binary data of no known format ({size} bytes)"
    return "plain text"
