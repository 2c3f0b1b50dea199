"""PDF checks and page renders with pypdfium2: refuse bad uploads before any parser runs, and render page images.

PDFium keeps its last error in one process-wide variable and does not set it at all when it refuses a PDF with
no pages, so a failed open can report the error of an EARLIER document (measured: an empty PDF opened after an
encrypted one reports "Incorrect password"). `_open` therefore plants a known error first (opening a file that
does not exist) and reads a still-planted value as "PDFium gave no reason". PDFium is not thread-safe either:
every call here holds `_PDFIUM_LOCK`, the one module-level object, which guards the process-wide library.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from ...errors import InvalidRequestError

_PDFIUM_LOCK = threading.RLock()
_NO_SUCH_FILE = b"/nonexistent/thinkserve-pdfium-error-sentinel.pdf"

_REASONS = {
    pdfium_c.FPDF_ERR_FORMAT: "is corrupt or not a PDF (PDFium: data format error)",
    pdfium_c.FPDF_ERR_PASSWORD: "is encrypted: needs a password",
    pdfium_c.FPDF_ERR_SECURITY: "uses an unsupported security handler (encryption PDFium cannot open)",
    pdfium_c.FPDF_ERR_PAGE: "has an unreadable page tree",
    pdfium_c.FPDF_ERR_UNKNOWN: "cannot be opened (PDFium: unknown error)",
}


@contextmanager
def _open(path: Path) -> Iterator[pdfium.PdfDocument]:
    """Open a PDF for reading, mapping every way it can fail to an InvalidRequestError naming file and cause.

    The lock is held for opening and closing only: callers take it around each PDFium call, so a long render
    lets other documents be inspected between its pages.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidRequestError(f"{path.name}: PDF file not found")
    with _PDFIUM_LOCK:
        pdfium_c.FPDF_LoadDocument(_NO_SUCH_FILE, None)  # plants FPDF_ERR_FILE; returns NULL, nothing to close
        try:
            document = pdfium.PdfDocument(path)
        except pdfium.PdfiumError as error:
            code = getattr(error, "err_code", None)
            if code in (pdfium_c.FPDF_ERR_FILE, pdfium_c.FPDF_ERR_SUCCESS):
                reason = "has no pages"  # or a page tree PDFium rejects without saying why
            else:
                reason = _REASONS.get(code, f"cannot be opened ({error})")
            raise InvalidRequestError(f"{path.name}: PDF {reason}") from None
        if len(document) == 0:
            document.close()
            raise InvalidRequestError(f"{path.name}: PDF has no pages")
    try:
        yield document
    finally:
        with _PDFIUM_LOCK:
            document.close()


def inspect_pdf(path: Path) -> int:
    """The PDF's page count; InvalidRequestError if it is corrupt, needs a password or has no pages."""
    with _open(path) as document, _PDFIUM_LOCK:
        return len(document)


def page_aspects(path: Path) -> list[float]:
    """Each page's width / height as shown (rotation applied), read without loading the pages."""
    with _open(path) as document, _PDFIUM_LOCK:
        aspects = []
        for index in range(len(document)):
            width, height = document.get_page_size(index)
            aspects.append(width / height if height else 1.0)
        return aspects


def render_scale(width: float, height: float, dpi: float, max_side: int) -> float:
    """Pixels per point for a `width` x `height` point page: `dpi`, lowered so its longer side is at most `max_side`
    pixels. Every render goes through it: a page's size is the uploader's to choose (PDF allows 14,400 points a
    side, PDFium renders larger), and one poster page at 100 dpi uncapped is a 20,000-pixel-square bitmap, 4.4 GB
    at the peak of rendering and encoding it (measured; found by fuzzing, where it got the server OOM-killed)."""
    if dpi <= 0:
        raise ValueError(f"dpi must be positive, got {dpi}")
    if max_side <= 0:
        raise ValueError(f"max_side must be positive, got {max_side}")
    return min(dpi / 72.0, max_side / max(width, height, 1.0))


def render_pages(path: Path, out_dir: Path, dpi: float, max_side: int, jpeg_quality: Optional[int] = 85) -> list[Path]:
    """Render every page to `out_dir/page-0000.jpg`, ... at `dpi`, the longer side capped at `max_side` pixels
    (`jpeg_quality` None: lossless PNG, `page-0000.png`).

    One page and one bitmap are alive at a time, so memory stays flat however long the document is, and bounded
    however large its pages (render_scale). Encoding, most of the time per page, runs outside the PDFium lock.
    JPEG because it is what a page costs least as: on 4 dev PDFs (79 pages) at 100 dpi, JPEG at quality 85 took
    20 ms and 133 KiB a page, PNG 67 ms and 224 KiB.
    """
    render_scale(1.0, 1.0, dpi, max_side)  # the arguments' checks, before any file is touched
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with _open(path) as document:
        with _PDFIUM_LOCK:
            count = len(document)
        for index in range(count):
            with _PDFIUM_LOCK:
                page = _load_page(document, index, path)
                try:
                    bitmap = page.render(scale=render_scale(*page.get_size(), dpi, max_side), may_draw_forms=True)
                finally:
                    page.close()
            try:
                image = bitmap.to_pil()  # shares the bitmap's buffer; no PDFium call
                if jpeg_quality is None:
                    target = out_dir / f"page-{index:04d}.png"
                    image.save(target, format="PNG")
                else:
                    target = out_dir / f"page-{index:04d}.jpg"
                    image.convert("RGB").save(target, format="JPEG", quality=jpeg_quality)
                del image  # drop the view before the buffer is freed
            finally:
                with _PDFIUM_LOCK:
                    bitmap.warn_on_close = False  # safe: nothing references the buffer any more
                    bitmap.close()
            written.append(target)
    return written


# A render whose grey levels all lie within this many of each other has nothing drawn on it.
BLANK_GREY_SPREAD = 8


def render_page_png(path: Path, index: int, dpi: float, max_side: int, blank_as_empty: bool = False) -> tuple[bytes, float]:
    """Page `index` as a lossless PNG at `dpi`, its longer side capped at `max_side` pixels (what OCR reads: JPEG's
    ringing around thin strokes costs characters), and the page's width / height. `blank_as_empty`: a page with
    nothing drawn on it gives no bytes (there is nothing to read; the check costs a min/max over the bitmap)."""
    import io

    with _open(path) as document:
        with _PDFIUM_LOCK:
            page = _load_page(document, index, path)
            try:
                width, height = page.get_size()
                bitmap = page.render(scale=render_scale(width, height, dpi, max_side), may_draw_forms=True)
            finally:
                page.close()
        try:
            image = bitmap.to_pil()
            buffer = io.BytesIO()
            low, high = image.convert("L").getextrema() if blank_as_empty else (0, 255)
            if high - low >= BLANK_GREY_SPREAD:
                image.convert("RGB").save(buffer, format="PNG", compress_level=1)
            del image
        finally:
            with _PDFIUM_LOCK:
                bitmap.warn_on_close = False
                bitmap.close()
    return buffer.getvalue(), (width / height if height else 1.0)


def _load_page(document: pdfium.PdfDocument, index: int, path: Path) -> pdfium.PdfPage:
    """Page `index`, or an InvalidRequestError naming it. A page PDFium cannot load (a broken page object: truncated
    and corrupted PDFs, found by fuzzing, where it was an internal error) can be neither parsed, rendered nor read
    by OCR. Called with the lock held."""
    try:
        return document[index]
    except pdfium.PdfiumError as error:
        raise InvalidRequestError(
            f"{Path(path).name}: PDF page {index + 1} of {len(document)} cannot be read ({error}): the file is damaged"
        ) from None


def text_layer_characters(path: Path) -> list[int]:
    """The characters (whitespace aside) of each page's text layer: 0 for a page that is only a picture, which OCR
    can start reading before any parser has run (PDFium reads text at about 300 pages/s)."""
    with _open(path) as document:
        with _PDFIUM_LOCK:
            count = len(document)
        counts = []
        for index in range(count):
            with _PDFIUM_LOCK:
                page = _load_page(document, index, path)
                try:
                    text = page.get_textpage()
                    try:
                        counts.append(sum(not c.isspace() for c in text.get_text_range()))
                    finally:
                        text.close()
                finally:
                    page.close()
        return counts


def page_object_counts(path: Path) -> list[int]:
    """The number of drawing objects (text runs, paths, images) on each page: what a parser's memory grows with."""
    with _open(path) as document:
        with _PDFIUM_LOCK:
            count = len(document)
        counts = []
        for index in range(count):
            with _PDFIUM_LOCK:
                page = _load_page(document, index, path)
                try:
                    counts.append(int(pdfium_c.FPDFPage_CountObjects(page.raw)))
                finally:
                    page.close()
        return counts
