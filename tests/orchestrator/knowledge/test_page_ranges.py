"""A page that breaks the parser costs that page (orchestrator.knowledge.parsing.page_ranges): the control flow over a
parser whose failures are chosen per page. The real MinerU on a real PDF with a page it is not given is in
tests/integration/test_ocr.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.knowledge.parsing.documents import Block, ParsedDocument
from orchestrator.knowledge.parsing.mineru import MineruMemoryError, MineruOptions, MineruTimeoutError
from orchestrator.knowledge.parsing.page_ranges import parse_pages


@dataclass
class PagedParser:
    """Parses any range without `breaking` pages into one text block per page (with an image asset); a range
    holding a breaking page fails as MinerU does when it runs out of memory."""

    breaking: set[int]
    options: MineruOptions = field(default_factory=lambda: MineruOptions(timeout_s=1000))
    version: str = "4.0.12"
    calls: list[tuple[str, float]] = field(default_factory=list)

    def with_timeout(self, timeout_s: float) -> "PagedParser":
        self.calls.append(("timeout", timeout_s))
        return self

    def parse(self, pdf: Path, folder: Path, page_range: str = "") -> ParsedDocument:
        self.calls.append((page_range or "all", self.options.timeout_s))
        first, last = (int(p) - 1 for p in page_range.split("-")) if page_range else (0, 9)
        pages = range(first, last + 1)
        if self.breaking & set(pages):
            raise MineruMemoryError(f"MinerU's parse of {pdf.name} needed more than its memory limit", "stderr tail")
        blocks = [Block("text", f"page {p + 1}", page=p, asset=f"images/p{p}.jpg") for p in pages]
        return ParsedDocument(blocks, 10, "mineru-4.0.12/flash", asset_root=folder, warnings=["dropped 2 running heads"])


def test_a_document_that_parses_whole_is_parsed_once(tmp_path):
    parser = PagedParser(breaking=set())
    parsed, failed = parse_pages(parser, tmp_path / "d.pdf", tmp_path, 10, {}, range_pages=4)
    assert failed == {} and [c[0] for c in parser.calls] == ["all"] and len(parsed.blocks) == 10


def test_a_failing_parse_is_retried_in_ranges_then_pages_and_only_the_breaking_page_is_lost(tmp_path):
    parser = PagedParser(breaking={5})
    parsed, failed = parse_pages(parser, tmp_path / "d.pdf", tmp_path, 10, {}, range_pages=4)
    assert list(failed) == [5] and "memory limit" in failed[5] and "stderr" not in failed[5]
    assert [b.page for b in parsed.blocks] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    ranges = [c[0] for c in parser.calls if c[0] != "timeout"]
    assert ranges == ["all", "1-4", "5-8", "5-5", "6-6", "7-7", "8-8", "9-10"]
    # each range parsed into its own folder, assets named from the common work folder
    assert parsed.asset_root == tmp_path and parsed.blocks[4].asset == "pages-0005-0005/images/p4.jpg"
    assert parsed.warnings[0].startswith("the parse of the whole document failed (MinerU's parse of d.pdf needed")
    assert parsed.warnings.count("dropped 2 running heads") == 1
    # a range's time is the document's shared out by pages, never below two minutes
    assert {t for kind, t in parser.calls if kind == "timeout"} == {400.0, 120.0, 200.0}


def test_pages_not_given_to_the_parser_are_parsed_around(tmp_path):
    parser = PagedParser(breaking={3})  # the skipped page would break it
    parsed, failed = parse_pages(parser, tmp_path / "d.pdf", tmp_path, 10, {3: "187,176 drawing objects"}, range_pages=4)
    assert failed == {3: "187,176 drawing objects"}
    assert [c[0] for c in parser.calls if c[0] != "timeout"] == ["1-3", "5-10"]
    assert not any("whole document" in w for w in parsed.warnings)


def test_a_parser_that_fails_on_most_pages_fails_the_document_with_its_error(tmp_path):
    parser = PagedParser(breaking=set(range(10)))
    with pytest.raises(MineruMemoryError, match="memory limit"):
        parse_pages(parser, tmp_path / "d.pdf", tmp_path, 10, {}, range_pages=4)
    calls = [c[0] for c in parser.calls if c[0] != "timeout"]
    assert calls[:3] == ["all", "1-4", "1-1"] and len(calls) <= 3 + 6  # gave up once more than half had failed


def test_a_timeout_is_a_failure_like_any_other(tmp_path):
    class SlowPage(PagedParser):
        def parse(self, pdf, folder, page_range=""):
            if page_range in ("", "1-2", "2-2"):
                raise MineruTimeoutError("MinerU did not finish d.pdf within 120 s (killed)")
            return super().parse(pdf, folder, page_range)

    parsed, failed = parse_pages(SlowPage(breaking=set()), tmp_path / "d.pdf", tmp_path, 2, {}, range_pages=4)
    assert list(failed) == [1] and "did not finish" in failed[1] and [b.page for b in parsed.blocks] == [0]
