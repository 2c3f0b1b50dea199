"""A page that breaks the parser costs that page, not the document.

MinerU parses a PDF whole. One page can sink that: a chart drawn as 187,176 vector objects took a real 17-page PDF
past the flash tier's 8 GiB budget after 313 s, and the whole document was refused. So:
- pages with more drawing objects than `max_page_objects` are never given to the parser (counted with PDFium
  beforehand, 5 ms a page);
- if the parse fails (out of memory, out of time, a crash), the document is parsed again in ranges of
  `range_pages` pages, and a range that fails again one page at a time;
- a page that fails alone, like a page never given to the parser, is degraded: it has no parsed blocks, and OCR
  of its rendered image reads it (page_ocr; "auto" reads every page without text). Each is named, with why.
A range's time limit is the document's limit shared out by pages (at least RANGE_MIN_TIMEOUT_S). When more than
half of the pages fail, the parser cannot read this document at all (a memory limit below any parse, a tier
without its models): the document fails with the parser's first error, as it would have without ranges.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .documents import ParsedDocument
from .mineru import MineruError, MineruParser

RANGE_MIN_TIMEOUT_S = 120.0
MAX_FAILED_SHARE = 0.5


def parse_pages(
    parser: MineruParser, pdf: Path, work_dir: Path, page_count: int, skipped: dict[int, str], range_pages: int,
) -> tuple[ParsedDocument, dict[int, str]]:
    """The document parsed without the `skipped` pages ({page: why}, 0-based), and every page that could not be
    parsed with why (the skipped ones included). The pages between skipped ones are parsed as whole runs; a run
    that fails is parsed again in ranges of `range_pages`, and a range that fails one page at a time."""
    failed = dict(skipped)
    first_error: MineruError | None = None
    if not skipped:
        try:
            return parser.parse(pdf, work_dir / "whole"), failed
        except MineruError as error:
            first_error = error
        queue = _ranges(list(range(page_count)), range_pages)
    else:
        queue = _ranges([p for p in range(page_count) if p not in skipped], page_count)
    parts: list[tuple[list[int], ParsedDocument, Path]] = []
    while queue:
        pages = queue.pop(0)
        folder = work_dir / f"pages-{pages[0] + 1:04d}-{pages[-1] + 1:04d}"
        share = max(RANGE_MIN_TIMEOUT_S, parser.options.timeout_s * len(pages) / max(page_count, 1))
        try:
            parts.append((pages, parser.with_timeout(share).parse(pdf, folder, f"{pages[0] + 1}-{pages[-1] + 1}"), folder))
        except MineruError as error:
            first_error = first_error or error
            if len(pages) > 1:  # smaller ranges, then one page at a time: down to the page that fails
                queue[0:0] = _ranges(pages, range_pages if len(pages) > range_pages else 1)
                continue
            failed[pages[0]] = _reason(error)
            if len(failed) - len(skipped) > MAX_FAILED_SHARE * page_count:
                raise first_error from None
    merged = _merged(parts, page_count, work_dir, f"mineru-{parser.version}/{parser.options.tier}")
    if not skipped and first_error is not None:
        merged.warnings.insert(0, f"the parse of the whole document failed ({_reason(first_error)}): it was parsed in ranges of pages")
    return merged, failed


def _ranges(pages: list[int], size: int) -> list[list[int]]:
    """Runs of consecutive pages, each cut to at most `size`."""
    runs: list[list[int]] = []
    for page in pages:
        if runs and runs[-1][-1] == page - 1 and len(runs[-1]) < size:
            runs[-1].append(page)
        else:
            runs.append([page])
    return runs


def _merged(parts: list[tuple[list[int], ParsedDocument, Path]], page_count: int, work_dir: Path, parser: str) -> ParsedDocument:
    """The ranges' blocks in page order, their assets named from `work_dir` (each range parsed into its folder)."""
    blocks, warnings = [], []
    for _, parsed, folder in sorted(parts, key=lambda part: part[0][0]):
        prefix = folder.relative_to(work_dir).as_posix()
        blocks += [dataclasses.replace(b, asset=f"{prefix}/{b.asset}") if b.asset else b for b in parsed.blocks]
        warnings += [w for w in parsed.warnings if "found no content" not in w and w not in warnings]
    aspects = next((parsed.page_aspects for _, parsed, _ in parts if parsed.page_aspects), [])  # each range's: the whole PDF's
    return ParsedDocument(blocks, page_count, parser, asset_root=work_dir, warnings=warnings, page_aspects=aspects)


def _reason(error: MineruError) -> str:
    return str(error).split("\n--- MinerU stderr", 1)[0]
