"""Recognised lines -> blocks (orchestrator.knowledge.parsing.ocr_layout), and OCR's place in ingest
(orchestrator.knowledge.parsing.page_ocr) over the in-process model double: which pages are read, what replaces what, and
failures that cost a warning, not the document."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.errors import TritonUnavailableError
from orchestrator.knowledge.parsing.documents import Block, ParsedDocument
from orchestrator.knowledge.parsing.ocr_layout import (
    TextLine, page_lines, paragraphs, reading_order, with_figure_text, without_running_heads,
)
from orchestrator.knowledge.parsing.page_ocr import DocumentOcr, OcrOptions
from orchestrator.models.protocol import PageText
from tests.model_double import InProcessModels


def line(text: str, x0: float, y0: float, x1: float, y1: float, confidence: float = 0.95) -> TextLine:
    return TextLine(text, (x0, y0, x1, y1), confidence)


def test_lines_become_paragraphs_and_a_title_in_reading_order():
    lines = [
        line("Annual Report", 100, 40, 600, 90),  # twice the body height: a title
        line("Revenue grew strongly in the", 100, 120, 900, 145),
        line("second half, led by exports.", 100, 150, 860, 175),
        line("Costs", 100, 260, 300, 285),  # far below: a paragraph of its own
    ]
    blocks = paragraphs(lines, page=2, aspect=1.0, min_confidence=0.5)
    assert [(b.type, b.content) for b in blocks] == [
        ("title", "Annual Report"),
        ("text", "Revenue grew strongly in the second half, led by exports."),
        ("text", "Costs"),
    ]
    assert all(b.page == 2 for b in blocks) and blocks[0].level == 1
    assert blocks[1].bbox == (100, 120, 900, 175) and blocks[1].ocr_confidence == pytest.approx(0.95)


def test_two_columns_are_read_one_after_the_other():
    left = [line(f"left {i}", 50, 100 + 30 * i, 450, 125 + 30 * i) for i in range(5)]
    right = [line(f"right {i}", 550, 100 + 30 * i, 950, 125 + 30 * i) for i in range(5)]
    heading = line("A heading across both columns", 50, 30, 950, 60)
    blocks = paragraphs(right + left + [heading], page=0, aspect=0.77, min_confidence=0.5)
    assert [b.content for b in blocks] == [
        "A heading across both columns", " ".join(f"left {i}" for i in range(5)), " ".join(f"right {i}" for i in range(5)),
    ]


def test_boxes_split_on_one_row_are_joined_and_hyphenated_words_mended():
    lines = [
        line("Operating", 100, 100, 260, 125),
        line("income", 275, 100, 380, 125),  # a wide space made two boxes of one row
        line("rose through a restruc-", 100, 130, 500, 155),
        line("turing of the business", 100, 160, 480, 185),
    ]
    [block] = paragraphs(lines, page=0, aspect=1.0, min_confidence=0.5)
    assert block.content == "Operating income rose through a restructuring of the business"


def test_low_confidence_lines_are_kept_apart_and_marked():
    lines = [
        line("Clear text line one", 100, 100, 500, 125, 0.97),
        line("~#e%& smudge", 100, 130, 500, 155, 0.31),
        line("Clear text line two", 100, 300, 500, 325, 0.96),
    ]
    blocks = paragraphs(lines, page=0, aspect=1.0, min_confidence=0.5)
    assert [(b.content, b.ocr_confidence) for b in blocks] == [
        ("Clear text line one", pytest.approx(0.97)), ("~#e%& smudge", pytest.approx(0.31)),
        ("Clear text line two", pytest.approx(0.96)),
    ]


def test_lines_of_a_figure_crop_land_inside_the_figure_on_the_page():
    boxes = np.array([[[0.0, 0.0], [0.5, 0.0], [0.5, 0.1], [0.0, 0.1]], [[0.5, 0.9], [1.0, 0.9], [1.0, 1.0], [0.5, 1.0]]])
    placed = page_lines(["Revenue", "2023"], boxes, np.array([0.9, 0.8]), region=(200, 400, 600, 800))
    assert placed[0].box == pytest.approx((200, 400, 400, 440)) and placed[1].box == pytest.approx((400, 760, 600, 800))
    figure = with_figure_text(Block("chart", "", page=3, bbox=(200, 400, 600, 800), caption="Figure 2"), placed)
    assert figure.content == "Revenue 2023" and figure.ocr_confidence == pytest.approx(0.8)


def test_reading_order_prefers_the_widest_gap_and_keeps_unplaced_blocks_last():
    boxes = [(0, 0, 0, 0), (510, 100, 900, 300), (100, 100, 490, 300), (100, 20, 900, 60)]
    assert reading_order(boxes) == [3, 2, 1, 0]


def _image_page(document_pages: int, text_pages: set[int]) -> ParsedDocument:
    blocks = []
    for page in range(document_pages):
        if page in text_pages:
            blocks.append(Block("text", f"Text layer of page {page + 1}.", page=page, bbox=(100, 100, 900, 200)))
        else:  # what MinerU's flash tier makes of a page without a text layer
            blocks.append(Block("image", "", page=page, bbox=(0, 0, 1000, 1000), asset=f"images/page-{page}.jpg"))
    return ParsedDocument(blocks, document_pages, "mineru-4.0.12/flash")


def _page_text(*lines: tuple[str, float]) -> PageText:
    boxes = np.array([[[0.1, 0.1 + 0.1 * i], [0.9, 0.1 + 0.1 * i], [0.9, 0.15 + 0.1 * i], [0.1, 0.15 + 0.1 * i]] for i in range(len(lines))])
    return PageText(tuple(t for t, _ in lines), boxes.reshape(-1, 4, 2).astype(np.float32), np.array([c for _, c in lines], np.float32))


def _render(page: int) -> tuple[bytes, float]:
    return f"page {page}".encode(), 1.0


def test_auto_reads_the_pages_without_text_and_replaces_their_page_picture():
    parsed = _image_page(3, text_pages={1})
    models = InProcessModels(page_text=lambda image: _page_text((f"Words of {image.decode()}", 0.9), ("noise", 0.2)))
    read, report = asyncio.run(DocumentOcr(models, OcrOptions(figures=False)).read(parsed, _render))
    assert models.calls.count("ocr") == 2 and (report.pages, report.lines, report.low_confidence_lines) == (2, 4, 2)
    assert [(b.page, b.type, b.content) for b in read.blocks] == [
        (0, "text", "Words of page 0"), (0, "text", "noise"),
        (1, "text", "Text layer of page 2."),
        (2, "text", "Words of page 2"), (2, "text", "noise"),
    ]
    assert read.blocks[1].ocr_confidence == pytest.approx(0.2) and read.blocks[2].ocr_confidence is None


def test_always_replaces_the_text_layer_and_off_reads_nothing():
    parsed = _image_page(2, text_pages={0, 1})
    models = InProcessModels(page_text=lambda image: _page_text(("What the page shows", 0.9)))
    read, report = asyncio.run(DocumentOcr(models, OcrOptions(mode="always")).read(parsed, _render))
    assert report.pages == 2 and [b.content for b in read.blocks] == ["What the page shows"] * 2
    untouched, nothing = asyncio.run(DocumentOcr(models, OcrOptions(mode="off")).read(parsed, _render))
    assert untouched is parsed and nothing.pages == 0 and models.calls.count("ocr") == 2


def test_a_page_that_cannot_be_read_costs_a_warning_and_a_blank_page_is_left_without_blocks():
    parsed = _image_page(3, text_pages=set())

    def page_text(image: bytes):
        if image == b"page 1":
            raise ValueError("not a readable image (truncated)")
        return None if image == b"page 2" else _page_text(("Hello", 0.9))

    read, report = asyncio.run(DocumentOcr(InProcessModels(page_text=page_text), OcrOptions()).read(parsed, _render))
    assert report.pages == 2
    assert [w for w in read.warnings if "page 2: OCR failed" in w and "truncated" in w]
    assert len(read.warnings) == 1  # the blank page is named by ingest's warning on pages without text
    assert [(b.page, b.type) for b in read.blocks] == [(0, "text"), (1, "image")]  # page 2 keeps its picture


def test_a_model_that_is_down_fails_the_ingest():
    models = InProcessModels(failures={"ocr": TritonUnavailableError("ocr: connection refused")})
    with pytest.raises(TritonUnavailableError):
        asyncio.run(DocumentOcr(models, OcrOptions()).read(_image_page(1, set()), _render))


def test_figure_crops_are_read_on_pages_with_text(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "chart.png").write_bytes(b"chart image")
    blocks = [
        Block("text", "Sales rose.", page=0, bbox=(100, 50, 900, 100)),
        Block("chart", "", page=0, bbox=(100, 200, 900, 600), asset="images/chart.png", caption="Figure 1: Sales"),
        Block("table", "a b", page=0, bbox=(100, 700, 900, 900), asset="images/chart.png"),
    ]
    parsed = ParsedDocument(blocks, 1, "mineru-4.0.12/flash", asset_root=tmp_path)
    models = InProcessModels(page_text=lambda image: _page_text(("2023 2024", 0.8)) if image == b"chart image" else None)
    read, report = asyncio.run(DocumentOcr(models, OcrOptions()).read(parsed, _render))
    assert report.figures == 1 and report.pages == 0 and models.calls.count("ocr") == 1  # tables are the parser's
    assert read.blocks[1].content == "2023 2024" and read.blocks[1].ocr_confidence == pytest.approx(0.8)
    assert read.blocks[0] == blocks[0] and read.blocks[2] == blocks[2]


SLIDE = 16 / 9


def test_a_slides_title_is_its_first_line_of_words_whatever_its_height():
    """On the dev decks slide titles were as tall as their text and big figures much taller: on a slide, its first
    paragraph that is not a mark is the one title, and a tall number or a small tagline is text."""
    lines = [
        line("AN UNCOMMON SENSE OF THE CONSUMER", 60, 30, 400, 45),  # a tagline in small print above the title
        line("GLOBAL OS BREAKDOWN", 70, 80, 370, 120),
        line("Android dominated the market", 70, 280, 420, 320),
        line("with a share of 82.8%.", 70, 330, 400, 370),
        line("86,2%", 600, 400, 760, 520),  # a figure three times taller than the text
    ]
    blocks = paragraphs(lines, page=5, aspect=SLIDE, min_confidence=0.5)
    assert [(b.type, b.content) for b in blocks if b.type == "title"] == [("title", "GLOBAL OS BREAKDOWN")]
    assert blocks[0].content.startswith("AN UNCOMMON") and blocks[0].type == "text"  # first in reading order
    assert {b.content: b.type for b in blocks}["86,2%"] == "text"
    portrait = paragraphs(lines, page=5, aspect=0.77, min_confidence=0.5)  # a page of a report: the height rule
    assert [b.content for b in portrait if b.type == "title"] == ["86,2%"]


def test_a_slide_that_opens_with_a_sentence_has_no_title():
    lines = [line("Prices rose by 4 percent in May.", 70, 80, 600, 120), line("Costs", 70, 300, 200, 340)]
    assert [b.type for b in paragraphs(lines, page=0, aspect=SLIDE, min_confidence=0.5)] == ["text", "text"]


def test_lines_repeated_at_one_place_on_most_pages_are_running_heads():
    pages = {
        page: [
            line("WESTBROOK TRANSIT", 820, 30 + page, 960, 50 + page),  # the logo, a little off on each page
            line(["Why the plan", "City policies", "Bicycle lanes", "Funding"][page], 60, 90, 600, 140),  # same place, other words
            line("Budget", 60, 300, 200, 330) if page < 2 else line(f"Point {page}", 60, 300, 200, 330),
            line(str(page + 1), 940, 950, 960, 970),  # the slide's number
        ]
        for page in range(4)
    }
    pages[4] = []  # a blank page counts for nothing
    kept, dropped = without_running_heads(pages)
    assert dropped == 8  # the logo and the number on each of the 4 pages
    assert [[t.text for t in kept[page]] for page in range(2)] == [["Why the plan", "Budget"], ["City policies", "Budget"]]
    assert kept[4] == []
    few, none = without_running_heads({page: pages[page] for page in range(2)})  # two pages: nothing recurs enough
    assert none == 0 and few[0] == pages[0]
