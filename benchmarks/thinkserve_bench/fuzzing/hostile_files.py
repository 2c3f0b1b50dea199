"""Hostile documents, generated: truncated and corrupted PDFs, images and zips; files whose name or declared type
lies; uploads over the size limit; nested, bombed, traversing and linking archives; MinerU content lists with
wrong types, escaping image paths and absurd values; text in odd encodings; PDFs and images whose pages would
render to gigapixels. Each is a Hypothesis strategy of HostileFile, so a failure shrinks and replays."""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from dataclasses import dataclass
from functools import lru_cache

from hypothesis import strategies as st


@dataclass(frozen=True)
class HostileFile:
    kind: str  # the family (the report counts by it)
    filename: str
    media_type: str
    data: bytes

    def describe(self) -> str:
        return f"{self.kind}: {self.filename!r} ({self.media_type or 'no media type'}, {len(self.data)} bytes)"


# ---------------------------------------------------------------------- well-formed material to break


@lru_cache(maxsize=None)
def small_pdf(pages: int = 2, size: tuple[float, float] = (612.0, 792.0)) -> bytes:
    """A real PDF with text on each page (reportlab), of the given page size in points."""
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=size)
    for number in range(pages):
        pdf.setFont("Helvetica", 12)
        pdf.drawString(72, size[1] - 72, f"Page {number + 1}: Acme sold {12 + number} robots in 2024.")
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def png(width: int, height: int, payload: bytes = b"", colour_type: int = 2, depth: int = 8) -> bytes:
    """A PNG with any declared size (the pixels need not match it: a decompression bomb declares gigapixels)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    if not payload:
        row = b"\x00" + b"\x80" * (width * 3 if colour_type == 2 else width)
        payload = zlib.compress(row * min(height, 64))
    header = struct.pack(">IIBBBBB", width, height, depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", payload) + chunk(b"IEND", b"")


@lru_cache(maxsize=None)
def small_jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, "JPEG")
    return buffer.getvalue()


def zipped(members: dict[str, bytes], symlinks: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if name in symlinks:
                info.external_attr = (0o120777 << 16)
            archive.writestr(info, data)
    return buffer.getvalue()


def zip_bomb(uncompressed_mib: int) -> bytes:
    """A content-list folder whose one image member inflates to `uncompressed_mib` MiB of zeros (~1000:1)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("doc_content_list.json", json.dumps([{"type": "text", "text": "hi", "page_idx": 0}]))
        with archive.open(zipfile.ZipInfo("images/zeros.png"), "w", force_zip64=True) as member:
            block = bytes(1 << 20)
            for _ in range(uncompressed_mib):
                member.write(block)
    return buffer.getvalue()


CONTENT_ITEMS = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "title", "image", "table", "equation", "chart", "list", "?", ""]),
                           "page_idx": st.one_of(st.integers(-5, 10**9), st.none(), st.text(max_size=5), st.floats())},
                          optional={"text": st.one_of(st.text(max_size=300), st.integers(), st.none(), st.lists(st.text(max_size=5))),
                                    "img_path": st.sampled_from(["images/a.jpg", "../../etc/passwd", "/etc/passwd",
                                                                 "images/missing.png", "", "images/", "images/a.jpg\x00.png"]),
                                    "bbox": st.one_of(st.lists(st.one_of(st.integers(-10**6, 10**6), st.floats()), max_size=6),
                                                      st.text(max_size=5), st.none()),
                                    "text_level": st.one_of(st.integers(-3, 99), st.text(max_size=3)),
                                    "table_body": st.text(max_size=300),
                                    "image_caption": st.one_of(st.lists(st.text(max_size=30), max_size=3), st.integers())}),
    st.integers(), st.text(max_size=20), st.none(), st.lists(st.integers(), max_size=3),
)


def _content_list(items, top) -> bytes:
    if top == "list":
        body = json.dumps(items, allow_nan=True)
    elif top == "object":
        body = json.dumps({"items": items})
    elif top == "deep":
        body = "[" * 100_000 + "]" * 100_000
    elif top == "invalid":
        body = '[{"type": "text", "text": "unterminated'
    else:
        body = "\ufeff" + json.dumps(items)
    return body.encode("utf-8", errors="surrogatepass")


# ---------------------------------------------------------------------- the families


def _truncated():
    sources = st.sampled_from(["pdf", "png", "jpeg", "zip"])

    def cut(kind: str, fraction: float, name_ok: bool) -> HostileFile:
        whole = {"pdf": lambda: small_pdf(2), "png": lambda: png(40, 30), "jpeg": small_jpeg,
                 "zip": lambda: zipped({"doc_content_list.json": b"[]", "images/a.jpg": small_jpeg()})}[kind]()
        data = whole[: max(1, int(len(whole) * fraction))]
        suffix = {"pdf": ".pdf", "png": ".png", "jpeg": ".jpg", "zip": ".zip"}[kind]
        return HostileFile("truncated", f"cut{suffix if name_ok else '.bin'}", "", data)

    return st.builds(cut, sources, st.floats(0.0, 0.999), st.booleans())


def _corrupted():
    def flip(kind: str, positions: list[int], value: int) -> HostileFile:
        whole = bytearray({"pdf": lambda: small_pdf(1), "png": lambda: png(40, 30), "jpeg": small_jpeg}[kind]())
        for position in positions:
            whole[position % len(whole)] = value
        return HostileFile("corrupted", f"flipped.{ {'pdf': 'pdf', 'png': 'png', 'jpeg': 'jpg'}[kind]}", "", bytes(whole))

    return st.builds(flip, st.sampled_from(["pdf", "png", "jpeg"]), st.lists(st.integers(0, 10**6), min_size=1, max_size=40),
                     st.integers(0, 255))


_CONTENTS = {
    "empty": b"", "html": b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>x</body></html>",
    "text": b"Just some words in a file.", "gif": b"GIF89a\x01\x00\x01\x00\x80\x00\x00",
    "random": bytes(range(256)) * 4, "nuls": b"\x00" * 4096, "utf16": "Hello".encode("utf-16"),
    "docx": b"", "json": b'{"a": [1, 2, 3]}', "elf": b"\x7fELF\x02\x01\x01" + b"\x00" * 100,
}


def _mislabelled():
    def make(content: str, name: str, media_type: str, extra: bytes) -> HostileFile:
        data = _CONTENTS[content] if content != "docx" else zipped({"word/document.xml": b"<w/>"})
        if content == "random":
            data = data + extra
        return HostileFile("mislabelled", name, media_type, data)

    names = st.sampled_from(["report.pdf", "scan.png", "photo.jpg", "photo.jpeg", "folder.zip", "notes.md", "a.txt",
                             "slides.pptx", "noext", ".pdf", "report.PDF", "a.pdf.exe", "x" * 300 + ".pdf"])
    media = st.sampled_from(["", "application/pdf", "image/png", "image/jpeg", "application/zip", "text/markdown",
                             "text/plain", "application/octet-stream", "text/html", "garbage/\x01"])
    return st.builds(make, st.sampled_from(sorted(_CONTENTS)), names, media, st.binary(max_size=512))


def _oversized(limit: int):
    def make(over: int, kind: str) -> HostileFile:
        head = b"%PDF-1.7\n" if kind == "pdf" else b"# big\n\n"
        return HostileFile("oversized", f"big.{'pdf' if kind == 'pdf' else 'md'}", "", head + b"a" * (limit + over - len(head)))

    return st.builds(make, st.sampled_from([1, 2, 1000, limit // 2]), st.sampled_from(["pdf", "md"]))


def _archives():
    inner = zipped({"doc_content_list.json": json.dumps([{"type": "text", "text": "Acme sold 12 robots.", "page_idx": 0}]).encode()})

    def make(shape: str, depth: int, members: int, bomb_mib: int, name: str) -> HostileFile:
        if shape == "nested":
            data = inner
            for level in range(depth):
                data = zipped({f"level{level}.zip": data})
        elif shape == "many":
            data = zipped({f"images/{i}.txt": b"x" for i in range(members)} | {"doc_content_list.json": b"[]"})
        elif shape == "bomb":
            data = zip_bomb(bomb_mib)
        elif shape == "traversal":
            data = zipped({"doc_content_list.json": b"[]", name: b"owned"})
        elif shape == "symlink":
            data = zipped({"doc_content_list.json": b"[]", "images/link.jpg": b"/etc/passwd"}, symlinks=("images/link.jpg",))
        elif shape == "no-content-list":
            data = zipped({"readme.txt": b"hello"})
        elif shape == "two-origins":
            data = zipped({"doc_content_list.json": b"[]", "a_origin.pdf": small_pdf(1), "b_origin.pdf": small_pdf(1)})
        elif shape == "fake-origin":
            data = zipped({"doc_content_list.json": b"[]", "doc_origin.png": b"not a png"})
        else:  # an empty archive
            data = b"PK\x05\x06" + b"\x00" * 18
        return HostileFile(f"archive-{shape}", "bundle.zip", "", data)

    return st.builds(make, st.sampled_from(["nested", "many", "bomb", "traversal", "symlink", "no-content-list",
                                            "two-origins", "fake-origin", "empty"]),
                     st.integers(1, 6), st.integers(100, 3000), st.sampled_from([64, 200, 600]),
                     st.sampled_from(["../evil.txt", "/abs/evil.txt", "a/../../evil", "a\\..\\evil"]))


def _content_lists():
    def make(items, top: str, with_image: bool, origin: str) -> HostileFile:
        members = {"doc_content_list.json": _content_list(items, top)}
        if with_image:
            members["images/a.jpg"] = small_jpeg()
        if origin == "pdf":
            members["doc_origin.pdf"] = small_pdf(1)
        elif origin == "truncated-pdf":
            members["doc_origin.pdf"] = small_pdf(2)[:700]
        elif origin == "png":
            members["doc_origin.png"] = png(40, 30)
        return HostileFile("content-list", "mineru.zip", "", zipped(members))

    return st.builds(make, st.lists(CONTENT_ITEMS, max_size=8),
                     st.sampled_from(["list", "list", "list", "object", "deep", "invalid", "bom"]), st.booleans(),
                     st.sampled_from(["none", "none", "pdf", "truncated-pdf", "png"]))


def _encodings():
    samples = {
        "utf16-bom": "# Title\n\nAcme sold 12 robots.".encode("utf-16"),
        "utf16-le": "# Title\n\nAcme".encode("utf-16-le"),
        "latin1": "Café crème, Acme sold 12 robots.".encode("latin-1"),
        "cp1252": "“Smart quotes” — Acme".encode("cp1252"),
        "invalid-utf8": b"Acme \xc3\x28 sold \xa0\xa1 robots",
        "overlong": b"\xc0\xaf\xe0\x80\xaf",
        "bom-only": b"\xef\xbb\xbf",
        "nuls": b"Acme\x00sold\x00\x00robots",
        "cr-only": b"# T\r\rAcme sold 12 robots.\rBolt bought 3.",
        "one-long-line": b"Acme sold robots " * 60_000,
        "whitespace": b" \n\t\r\n   \n",
        "headings": b"#" * 5000 + b" x\n\n" + b"# \n" * 2000,
        "zero-width": "A\u200bc\u200dm\ufeffe\u2060 sold \u202e12\u202c robots".encode(),
        "emoji": ("🙂🤖" * 5000).encode(),
        "control": bytes(range(1, 32)) * 50,
        "deep-list": ("\n".join("  " * i + "- item" for i in range(3000))).encode(),
        "table": ("|" + "a|" * 2000 + "\n|" + "-|" * 2000 + "\n").encode() * 20,
    }

    def make(which: str, suffix: str, media_type: str) -> HostileFile:
        return HostileFile("encoding", f"odd-{which}{suffix}", media_type, samples[which])

    return st.builds(make, st.sampled_from(sorted(samples)), st.sampled_from([".md", ".txt", ".markdown", ""]),
                     st.sampled_from(["", "", "text/plain", "text/markdown"]))


def _giant_pages():
    def make(kind: str, side: int) -> HostileFile:
        if kind == "pdf-page":  # a page measured in points: 14,400 pt is PDF's largest page (200 inches)
            return HostileFile("giant-page", "poster.pdf", "", small_pdf(1, (float(side), float(side))))
        if kind == "png-bomb":  # a PNG that declares side x side pixels with a few bytes of data
            return HostileFile("giant-page", "bomb.png", "", png(side * 10, side * 10, zlib.compress(b"\x00" * 1000)))
        if kind == "png-zero":
            return HostileFile("giant-page", "zero.png", "", png(0, 0))
        if kind == "png-16bit":
            return HostileFile("giant-page", "deep.png", "", png(4, 4, zlib.compress(b"\x00" + b"\x01" * 24) * 4, 2, 16))
        return HostileFile("giant-page", "thin.png", "", png(side * 10, 1))

    return st.builds(make, st.sampled_from(["pdf-page", "png-bomb", "png-zero", "png-16bit", "png-thin"]),
                     st.sampled_from([3, 100, 5000, 14_400, 20_000]))


def _pdfs():
    def make(shape: str, pages: int) -> HostileFile:
        from ..corpora import pdf_factory
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "x.pdf"
            if shape == "encrypted":
                pdf_factory.write_encrypted_pdf(path)
            elif shape == "empty":
                pdf_factory.write_empty_pdf(path)
            elif shape == "corrupt":
                pdf_factory.write_corrupt_pdf(path, seed=pages)
            data = path.read_bytes() if path.exists() else b""
        if shape == "many-pages":
            data = small_pdf(pages)
        elif shape == "junk-before-header":
            data = b"\x00" * 500 + small_pdf(1)
        elif shape == "two-documents":
            data = small_pdf(1) + small_pdf(2)
        elif shape == "header-only":
            data = b"%PDF-1.7\n%%EOF\n"
        return HostileFile(f"pdf-{shape}", f"{shape}.pdf", "", data)

    return st.builds(make, st.sampled_from(["encrypted", "empty", "corrupt", "many-pages", "junk-before-header",
                                            "two-documents", "header-only"]), st.sampled_from([1, 3, 40, 400]))


def hostile_files(max_upload_bytes: int) -> st.SearchStrategy[HostileFile]:
    """Every family, drawn evenly."""
    return st.one_of(_truncated(), _corrupted(), _mislabelled(), _oversized(max_upload_bytes), _archives(),
                     _content_lists(), _encodings(), _giant_pages(), _pdfs())


FAMILIES = ("truncated", "corrupted", "mislabelled", "oversized", "archive-*", "content-list", "encoding", "giant-page",
            "pdf-*")
