"""OCR in ingest: the text of pages without a text layer, and of the figures that hold none.

A PDF page that is only a picture (a scan, a slide exported as an image) gives a parser nothing but one
full-page image; its words become searchable only when something reads them. `DocumentOcr.read` renders each such
page (`ingest.ocr = "auto"`; every page with "always"; none with "off") at a resolution fit for reading, sends it
to the `ocr` model (PP-OCR served by Triton), and turns the lines into blocks (ocr_layout): text and titles with
their page, box and confidence, then passages, entities and indexes exactly like a parser's text. The full-page
picture a parser made of such a page is dropped (its words are now text); a smaller figure or chart on it keeps
the lines that fall inside it.

What is read is decided from what is known before reading, each rule measured on the dev PDFs (docs/measured/):
- A page's text layer is known before any parser runs (PDFium reads it at hundreds of pages a second), so the
  pages without one start being read while the parser still works (`start`), and the parse waits for nothing.
- A figure or chart whose box the parser found words in (a vector chart's labels, a table MinerU took for a
  picture: the text layer inside it) is not read again: that was four fifths of the dev set's OCR time, for no
  measured gain. Only a figure without them is read (`figures`: a picture may hold words nothing else has).
- A page with nothing drawn on it is not sent (its render says so); where the detector finds no line, the model
  runs no recogniser.

A page whose OCR fails costs a warning, never the document; a model that is down fails the ingest as any model
call does (nothing is stored). Images are read a few at a time (`concurrency`), each rendered only when its turn
comes, so memory stays bounded however long the document.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal, Optional, Sequence

from ...errors import InvalidRequestError, ModelExecutionError
from ...models.protocol import Models, PageText
from .documents import BBOX_SCALE, Block, ParsedDocument
from .ocr_layout import TextLine, contains, page_lines, paragraphs, reading_order, with_figure_text, without_running_heads

OcrMode = Literal["auto", "always", "off"]
FIGURE_TYPES = frozenset({"image", "chart"})
# An image block covering this share of its page is the page itself as a picture (a scan, an exported slide).
PAGE_PICTURE_AREA = 0.6

# The image of page `index` (encoded PNG/JPEG; no bytes: nothing is drawn on the page) and the page's width /
# height; runs in a worker thread.
PageImages = Callable[[int], tuple[bytes, float]]
# Told once per page OCR has read (the ingest's progress counts them as they come).
PageRead = Callable[[], None]
_Outcome = tuple[PageText, float] | str | None  # lines and the page's aspect; why it failed; None: blank


@dataclass(frozen=True)
class OcrOptions:
    mode: OcrMode = "auto"
    figures: bool = True  # also read the figures and charts the parser found no words in
    min_confidence: float = 0.5  # lines below are kept, in blocks of their own, and counted as low-confidence
    concurrency: int = 4  # images in flight


@dataclass
class OcrReport:
    pages: int = 0  # pages read
    figures: int = 0  # figure and chart crops read
    lines: int = 0
    low_confidence_lines: int = 0
    read_pages: bool = False  # OCR was on and had the document's pages to read (False: off, or no page images)
    seconds: float = 0.0  # from the first image sent to the last read (reading may overlap the parse)
    warnings: list[str] = field(default_factory=list)
    blank_pages: int = 0  # pages not sent: nothing is drawn on them
    figures_with_text: int = 0  # figures and charts not read: the parser found words in them


class PageReading:
    """Pages being read in the background, begun before the parser is done; `read` takes their outcomes."""

    def __init__(self, tasks: dict[int, "asyncio.Task[_Outcome]"], limit: asyncio.Semaphore, started: float):
        self.tasks = tasks
        self.limit = limit
        self.started = started

    async def cancel(self) -> None:
        """Stop reading (the document failed) and wait until no page is rendered or sent any more."""
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


class DocumentOcr:
    def __init__(self, models: Models, options: OcrOptions):
        self.models = models
        self.options = options

    def pages_before_parsing(self, layer_characters: Sequence[int]) -> list[int]:
        """The pages OCR reads whatever the parser finds, known from the text layer alone: "always" every page,
        "auto" those whose text layer holds no character."""
        if self.options.mode == "always":
            return list(range(len(layer_characters)))
        if self.options.mode == "auto":
            return [page for page, count in enumerate(layer_characters) if count == 0]
        return []

    def start(
        self, pages: Sequence[int], page_images: PageImages, timeout_s: Optional[float] = None, on_page: Optional[PageRead] = None,
    ) -> PageReading:
        """Begin reading `pages` now (each rendered when its turn comes); `read` takes what they gave."""
        limit = asyncio.Semaphore(self.options.concurrency)
        tasks = {page: asyncio.ensure_future(self._read_page(page, page_images, limit, timeout_s, on_page)) for page in pages}
        return PageReading(tasks, limit, time.monotonic())

    async def read(
        self, parsed: ParsedDocument, page_images: Optional[PageImages], timeout_s: Optional[float] = None,
        pages: Optional[Sequence[int]] = None, started: Optional[PageReading] = None, on_page: Optional[PageRead] = None,
    ) -> tuple[ParsedDocument, OcrReport]:
        """`parsed` with the text OCR found added. `page_images` renders a page (None: the source has no page
        images, only figure crops can be read); `pages` forces which pages are read (else the mode decides);
        `started`: pages begun before the parse (`start`), whose outcomes are used where the mode reads those pages."""
        report = OcrReport()
        early = started.tasks if started is not None else {}
        if self.options.mode == "off":
            if started is not None:
                await started.cancel()
            return parsed, report
        began = started.started if started is not None else time.monotonic()
        report.read_pages = page_images is not None
        if pages is None:
            pages = self.pages_to_read(parsed) if page_images is not None else []
        limit = started.limit if started is not None else asyncio.Semaphore(self.options.concurrency)
        figures = self._figures(parsed, set(pages), report) if self.options.figures else []
        blocks = list(parsed.blocks)
        page_jobs = [
            early[page] if page in early else asyncio.ensure_future(self._read_page(page, page_images, limit, timeout_s, on_page))
            for page in pages
        ] if page_images else []
        figure_jobs = [
            asyncio.ensure_future(self._read_figure(parsed.asset_root / parsed.blocks[i].asset, limit, timeout_s)) for i in figures
        ]
        try:
            results = await asyncio.gather(*page_jobs, *figure_jobs)
        finally:  # after a failure none is left running; pages begun early that the parser found text on stop here
            for job in [*early.values(), *page_jobs, *figure_jobs]:
                job.cancel()
            await asyncio.gather(*early.values(), *page_jobs, *figure_jobs, return_exceptions=True)
        page_results, figure_results = results[: len(page_jobs)], results[len(page_jobs) :]

        for index, outcome in zip(figures, figure_results):
            if isinstance(outcome, str):
                report.warnings.append(f"page {parsed.blocks[index].page + 1}: a figure could not be read by OCR ({outcome})")
                continue
            lines = page_lines(outcome.lines, outcome.boxes, outcome.confidence, parsed.blocks[index].bbox)
            report.figures += 1
            self._count(report, lines)
            blocks[index] = with_figure_text(blocks[index], lines)

        by_page: dict[int, tuple[list[TextLine], float]] = {}
        for page, outcome in zip(pages, page_results):
            if outcome is None:
                report.blank_pages += 1
                continue
            if isinstance(outcome, str):
                report.warnings.append(f"page {page + 1}: OCR failed ({outcome}); the page keeps what the parser found")
                continue
            text, aspect = outcome
            lines = page_lines(text.lines, text.boxes, text.confidence)
            report.pages += 1
            self._count(report, lines)
            by_page[page] = (lines, aspect)  # none: a blank page (ingest's warning on pages without text names it)
        if by_page:
            kept, heads = without_running_heads({page: lines for page, (lines, _) in by_page.items()})
            if heads:
                report.warnings.append(f"dropped {heads} lines repeated at one place on most pages read by OCR (running heads)")
            blocks = self._with_page_text(blocks, {page: (kept[page], aspect) for page, (_, aspect) in by_page.items()})
        report.seconds = time.monotonic() - began
        return replace(parsed, blocks=blocks, warnings=parsed.warnings + report.warnings), report

    def _figures(self, parsed: ParsedDocument, read_pages: set[int], report: OcrReport) -> list[int]:
        """The figures and charts to read: those with an image, on a page OCR does not read whole, in which the
        parser found no words (counted in `report`)."""
        figures = [
            i for i, block in enumerate(parsed.blocks)
            if block.type in FIGURE_TYPES and block.asset and parsed.asset_root is not None and block.page not in read_pages
        ]
        report.figures_with_text = sum(bool(parsed.blocks[i].content.strip()) for i in figures)
        return [i for i in figures if not parsed.blocks[i].content.strip()]

    def pages_to_read(self, parsed: ParsedDocument) -> list[int]:
        """"always": every page; "auto": the pages on which the parser found no text."""
        if parsed.page_count <= 0:
            return []
        if self.options.mode == "always":
            return list(range(parsed.page_count))
        with_text = {block.page for block in parsed.blocks if block.content.strip() or block.caption.strip()}
        return [page for page in range(parsed.page_count) if page not in with_text]

    def _count(self, report: OcrReport, lines: Sequence[TextLine]) -> None:
        report.lines += len(lines)
        report.low_confidence_lines += sum(line.confidence < self.options.min_confidence for line in lines)

    async def _read_page(
        self, page: int, page_images: PageImages, limit: asyncio.Semaphore, timeout_s: Optional[float],
        on_page: Optional[PageRead] = None,
    ) -> _Outcome:
        async with limit:  # rendered only when its turn comes: at most `concurrency` page images in memory
            try:
                image, aspect = await asyncio.to_thread(page_images, page)
            except (InvalidRequestError, OSError, ValueError) as error:
                return f"the page could not be rendered: {error}"
            if not image:
                return None  # nothing is drawn on it
            outcome = await self._recognized(image, timeout_s, aspect)
        if on_page is not None and not isinstance(outcome, str):
            on_page()
        return outcome

    async def _read_figure(self, path: Path, limit: asyncio.Semaphore, timeout_s: Optional[float]) -> PageText | str:
        async with limit:
            try:
                image = await asyncio.to_thread(path.read_bytes)
            except OSError as error:
                return f"its image could not be read: {error}"
            outcome = await self._recognized(image, timeout_s, 1.0)
            return outcome if isinstance(outcome, str) else outcome[0]

    async def _recognized(self, image: bytes, timeout_s: Optional[float], aspect: float) -> tuple[PageText, float] | str:
        """The model's reading of one image, or why it could not read it (an image it refuses, a failed run). A
        model that is unavailable or out of time raises: the document fails as with any model call."""
        try:
            [text] = await self.models.read_text([image], timeout_s)
        except (ModelExecutionError, InvalidRequestError) as error:
            return str(error).splitlines()[0]
        return text, aspect

    def _with_page_text(self, blocks: list[Block], by_page: dict[int, tuple[list[TextLine], float]]) -> list[Block]:
        """Each read page's blocks: the parser's, less the page-sized picture (and, with "always", less its text,
        which OCR replaces), figures with the lines inside them, the other lines as paragraphs; in reading order."""
        out: list[Block] = []
        pages_done: set[int] = set()
        for position, block in enumerate(blocks):
            page = block.page
            if page not in by_page:
                out.append(block)
                continue
            if page in pages_done:
                continue
            pages_done.add(page)
            out.extend(self._page_blocks([b for b in blocks[position:] if b.page == page], *by_page[page], page))
        for page in sorted(set(by_page) - pages_done):  # a page the parser gave no block at all
            insert_at = next((i for i, b in enumerate(out) if b.page > page), len(out))
            out[insert_at:insert_at] = self._page_blocks([], *by_page[page], page)
        return out

    def _page_blocks(self, parser_blocks: list[Block], lines: list[TextLine], aspect: float, page: int) -> list[Block]:
        kept = [b for b in parser_blocks if not _page_picture(b)]
        if self.options.mode == "always":
            kept = [b for b in kept if b.is_visual]
        free: list[TextLine] = []
        inside: dict[int, list[TextLine]] = {}
        for line in lines:
            owner = next((i for i, b in enumerate(kept) if b.is_visual and _placed(b) and contains(b.bbox, line)), None)
            if owner is None:
                free.append(line)
            elif kept[owner].type in FIGURE_TYPES:  # a table's or an equation's text is the parser's already
                inside.setdefault(owner, []).append(line)
        kept = [with_figure_text(b, inside[i]) if i in inside else b for i, b in enumerate(kept)]
        combined = kept + paragraphs(free, page, aspect, self.options.min_confidence)
        return [combined[i] for i in reading_order([b.bbox for b in combined], aspect)]


def _placed(block: Block) -> bool:
    return block.bbox[2] > block.bbox[0] and block.bbox[3] > block.bbox[1]


def _page_picture(block: Block) -> bool:
    """An image block that is (nearly) the whole page: what a parser without OCR makes of a scanned page."""
    x0, y0, x1, y1 = block.bbox
    return block.type == "image" and (x1 - x0) * (y1 - y0) >= PAGE_PICTURE_AREA * BBOX_SCALE * BBOX_SCALE
