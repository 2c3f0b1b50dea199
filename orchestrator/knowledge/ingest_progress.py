"""What the server's ingest has done and is doing, counted in pages: the figures a progress display, the ingest
report and the metrics show alike.

Ingest's time grows with pages, not documents (the dev PDFs run from 10 to 160 pages, a MinerU output folder holds
any number), so progress counts pages: a document's pages are known once it is opened (a PDF's page tree, a content
list's last page, one for a text or an image) and done when its commit is durable; OCR's pages as each is read.
"Done of total" spans a busy period, the documents ingested since the server last sat idle for `idle_s` (a batch
sent a few at a time is one period); totals since start feed the metrics' counters. Updated from the event loop,
read from any thread (a /metrics scrape): a lock guards the numbers.

Each document in flight is also followed on its own (`documents`, what GetIngestProgress answers and the console and
the CLI show while it ingests): the stage it is in, its pages parsed and read by OCR of those OCR is to read, and the
warnings known so far. Its pages are "read" once their text is in hand: MinerU hands over a document's pages all at
once when its parse ends, OCR one page at a time, so a deck without a text layer is read page by page while a PDF
with one is read at the parse's end.
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
class DocumentFigures:
    """One document in flight: where it is and what is known of it so far."""

    collection: str
    name: str
    stage: str  # the ingest stage it is in (parse, ocr, chunk, describe, extract, embed, sentences, commit, publish)
    pages_total: int  # 1 until its pages are known
    pages_parsed: int  # 0 until the parser hands them over
    ocr_pages: int  # pages OCR has read
    ocr_pages_planned: int  # pages OCR is to read, as far as known (before the parse ends: those without a text layer)
    seconds: float  # since it began
    warnings: tuple[str, ...]

    @property
    def pages_read(self) -> int:
        """Pages whose text is in hand: those the parser handed over that OCR is not to read, and those OCR read."""
        parsed = max(0, self.pages_parsed - self.ocr_pages_planned) if self.pages_parsed else 0
        return min(self.pages_total, parsed + self.ocr_pages)

    @property
    def pages_per_s(self) -> float:
        return self.pages_read / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ProgressTotals:
    """Since the server started: what the metrics' counters count."""

    documents: int
    documents_failed: int
    pages: int
    ocr_pages: int
    pages_in_flight: int


class _Document:
    def __init__(self, name: str, collection: str, started: float):
        self.name = name
        self.collection = collection
        self.started = started
        self.stage = "open"
        self.pages = 0
        self.pages_parsed = 0
        self.ocr_pages = 0
        self.ocr_planned = 0
        self.warnings: list[str] = []


class DocumentProgress:
    """One document's part: `pages` once they are known, `ocr_page` per page OCR reads, then `done` or `failed`;
    meanwhile the stage it enters, its pages parsed, the pages OCR is to read, and warnings as they arise."""

    def __init__(self, owner: "IngestProgress", key: int):
        self._owner = owner
        self._key = key

    def pages(self, count: int) -> None:
        self._owner._update(self._key, pages=count)

    def ocr_page(self) -> None:
        self._owner._update(self._key, ocr_page=True)

    def stage(self, name: str) -> None:
        self._owner._set(self._key, stage=name)

    def parsed(self, pages: int) -> None:
        self._owner._set(self._key, pages_parsed=max(0, pages))

    def ocr_planned(self, pages: int) -> None:
        self._owner._set(self._key, ocr_planned=max(0, pages))

    def warn(self, *warnings: str) -> None:
        """Warnings as they arise (each told once, however often it is repeated)."""
        self._owner._warn(self._key, warnings)

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

    def begin(self, name: str, collection: str = "") -> DocumentProgress:
        """A document arrives; a new busy period starts if none was in flight for `idle_s`."""
        now = self._clock()
        with self._lock:
            if not self._in_flight and (self._idle_since is None or now - self._idle_since >= self._idle_s):
                self._period_start = now
                self._done = [0, 0, 0, 0]
            key = next(self._keys)
            self._in_flight[key] = _Document(name, collection, now)
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

    def documents(self, collection: str) -> list[DocumentFigures]:
        """The collection's documents in flight, in the order they began."""
        now = self._clock()
        with self._lock:
            return [
                DocumentFigures(
                    collection=d.collection, name=d.name, stage=d.stage, pages_total=max(1, d.pages),
                    pages_parsed=d.pages_parsed, ocr_pages=d.ocr_pages, ocr_pages_planned=d.ocr_planned,
                    seconds=max(0.0, now - d.started), warnings=tuple(d.warnings),
                )
                for d in self._in_flight.values() if d.collection == collection
            ]

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

    def _set(self, key: int, **values) -> None:
        with self._lock:
            document = self._in_flight.get(key)
            if document is not None:
                for field, value in values.items():
                    setattr(document, field, value)

    def _warn(self, key: int, warnings: tuple[str, ...]) -> None:
        with self._lock:
            document = self._in_flight.get(key)
            if document is not None:
                document.warnings += [w for w in dict.fromkeys(warnings) if w not in document.warnings]

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
