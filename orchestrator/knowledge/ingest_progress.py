"""What the server's ingest has done and is doing, counted in pages: the figures a progress display, the ingest
report and the metrics show alike.

Ingest's time grows with pages, not documents (the dev PDFs run from 10 to 160 pages, a MinerU output folder holds
any number), so progress counts pages: a document's pages are known once it is opened (a PDF's page tree, a content
list's last page, one for a text or an image) and done when its commit is durable; OCR's pages as each is read.
"Done of total" spans a busy period, the documents ingested since the server last sat idle for `idle_s` (a batch
sent a few at a time is one period); totals since start feed the metrics' counters. Updated from the event loop,
read from any thread (a /metrics scrape): a lock guards the numbers.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

# A busy period ends when no document has been in flight for this long: the next one starts the counts again.
IDLE_S = 10.0


@dataclass(frozen=True)
class ProgressFigures:
    """Pages done of pages total (the documents finished in this busy period, and those in flight as far as their
    pages are known), their rate, OCR's pages, and the document most recently begun that is still in flight."""

    pages_done: int
    pages_total: int
    documents_done: int
    documents_in_flight: int
    documents_failed: int
    ocr_pages: int
    seconds: float  # since the busy period began
    current_document: str  # "" when none is in flight

    @property
    def pages_per_s(self) -> float:
        return self.pages_done / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ProgressTotals:
    """Since the server started: what the metrics' counters count."""

    documents: int
    documents_failed: int
    pages: int
    ocr_pages: int
    pages_in_flight: int


class _Document:
    def __init__(self, name: str):
        self.name = name
        self.pages = 0
        self.ocr_pages = 0


class DocumentProgress:
    """One document's part: `pages` once they are known, `ocr_page` per page OCR reads, then `done` or `failed`."""

    def __init__(self, owner: "IngestProgress", key: int):
        self._owner = owner
        self._key = key

    def pages(self, count: int) -> None:
        self._owner._update(self._key, pages=count)

    def ocr_page(self) -> None:
        self._owner._update(self._key, ocr_page=True)

    def done(self, pages: Optional[int] = None) -> None:
        """Committed (or already present): its pages count as done; `pages` corrects the number told earlier."""
        self._owner._finish(self._key, pages, failed=False)

    def failed(self) -> None:
        """Its pages leave the total; OCR's pages stay counted (the work was done)."""
        self._owner._finish(self._key, None, failed=True)


class IngestProgress:
    def __init__(self, clock: Callable[[], float] = time.monotonic, idle_s: float = IDLE_S):
        self._clock = clock
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._in_flight: dict[int, _Document] = {}
        self._period_start = 0.0
        self._idle_since: Optional[float] = None  # None: never busy
        self._done = [0, 0, 0, 0]  # pages done, documents done, documents failed, OCR pages (this period)
        self._totals = [0, 0, 0, 0]  # documents, failed, pages, OCR pages (since start)

    def begin(self, name: str) -> DocumentProgress:
        """A document arrives; a new busy period starts if none was in flight for `idle_s`."""
        now = self._clock()
        with self._lock:
            if not self._in_flight and (self._idle_since is None or now - self._idle_since >= self._idle_s):
                self._period_start = now
                self._done = [0, 0, 0, 0]
            key = next(self._keys)
            self._in_flight[key] = _Document(name)
        return DocumentProgress(self, key)

    def figures(self) -> ProgressFigures:
        with self._lock:
            in_flight = list(self._in_flight.values())
            pages_done, documents_done, failed, ocr_done = self._done
            busy_until = self._clock() if in_flight or self._idle_since is None else self._idle_since
            return ProgressFigures(
                pages_done=pages_done,
                pages_total=pages_done + sum(d.pages for d in in_flight),
                documents_done=documents_done,
                documents_in_flight=len(in_flight),
                documents_failed=failed,
                ocr_pages=ocr_done + sum(d.ocr_pages for d in in_flight),
                seconds=max(0.0, busy_until - self._period_start) if self._idle_since is not None or in_flight else 0.0,
                current_document=in_flight[-1].name if in_flight else "",
            )

    def totals(self) -> ProgressTotals:
        with self._lock:
            documents, failed, pages, ocr_pages = self._totals
            in_flight = list(self._in_flight.values())
            return ProgressTotals(documents, failed, pages, ocr_pages + sum(d.ocr_pages for d in in_flight),
                                  sum(d.pages for d in in_flight))

    def _update(self, key: int, pages: Optional[int] = None, ocr_page: bool = False) -> None:
        with self._lock:
            document = self._in_flight.get(key)
            if document is None:
                return
            if pages is not None:
                document.pages = max(0, pages)
            document.ocr_pages += ocr_page

    def _finish(self, key: int, pages: Optional[int], failed: bool) -> None:
        with self._lock:
            document = self._in_flight.pop(key, None)
            if document is None:
                return
            if pages is not None:
                document.pages = max(0, pages)
            self._done[3] += document.ocr_pages
            self._totals[3] += document.ocr_pages
            if failed:
                self._done[2] += 1
                self._totals[1] += 1
            else:
                self._done[0] += document.pages
                self._done[1] += 1
                self._totals[0] += 1
                self._totals[2] += document.pages
            if not self._in_flight:
                self._idle_since = self._clock()
