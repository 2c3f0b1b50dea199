"""What OCR reads of a document, decided from what is known before reading (orchestrator.knowledge.parsing.page_ocr),
on a generated PDF with the real text layer and renders (pdf.py) and the in-process model double: a page without a
text layer is begun before the parse and read once, a blank page is never sent, a figure the parser found words in
is not read again, a photo without text is; a failure leaves nothing running."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest

from orchestrator.errors import TritonUnavailableError
from orchestrator.knowledge.parsing.documents import Block, ParsedDocument
from orchestrator.knowledge.parsing.page_ocr import DocumentOcr, OcrOptions
from orchestrator.knowledge.parsing.pdf import render_page_png, text_layer_characters
from orchestrator.models.protocol import PageText
from thinkserve_bench.corpora.pdf_factory import photo, write_ocr_cases
from tests.model_double import InProcessModels


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ocr-cases")
    cases = write_ocr_cases(folder / "cases.pdf")
    (folder / "images").mkdir()
    shutil.copyfile(folder / "cases-chart.png", folder / "images" / "chart.png")
    photo((400, 300)).save(folder / "images" / "photo.png")
    # the blocks MinerU 4's flash tier makes of it (checked on the real parser by tests/integration/test_ocr.py)
    blocks = [
        Block("text", "Northwind Traders grew its annual revenue to 48 million euros.", page=0, bbox=(101, 83, 898, 141)),
        Block("image", "  ".join(cases.chart_labels), page=0, bbox=(134, 347, 806, 644), asset="images/chart.png",
              caption=cases.figure_caption),
        Block("image", "", page=0, bbox=(134, 751, 470, 929), asset="images/photo.png"),
        Block("image", "", page=1, bbox=(0, 0, 1000, 1000), asset="images/photo.png"),
        Block("image", "", page=3, bbox=(0, 0, 1000, 1000), asset="images/photo.png"),
    ]
    return cases, ParsedDocument(blocks, cases.pages, "mineru-4.0.12/flash", asset_root=folder)


def _lines(*texts: str) -> PageText:
    boxes = np.array([[[0.1, 0.1 + 0.1 * i], [0.9, 0.1 + 0.1 * i], [0.9, 0.15 + 0.1 * i], [0.1, 0.15 + 0.1 * i]] for i in range(len(texts))])
    return PageText(tuple(texts), boxes.reshape(-1, 4, 2).astype(np.float32), np.full(len(texts), 0.95, np.float32))


class _Pages:
    """Renders pages as ingest does and remembers which image came from which page."""

    def __init__(self, path):
        self.path = path
        self.rendered: list[int] = []
        self.page_of: dict[bytes, int] = {}

    def __call__(self, page: int) -> tuple[bytes, float]:
        self.rendered.append(page)
        image, aspect = render_page_png(self.path, page, 150, 2000, blank_as_empty=True)
        self.page_of[image] = page
        return image, aspect


def test_pages_without_a_text_layer_are_begun_before_the_parse_and_only_what_pays_is_sent(cases):
    cases, parsed = cases
    pages = _Pages(cases.path)
    photo_bytes = (parsed.asset_root / "images" / "photo.png").read_bytes()
    chart_bytes = (parsed.asset_root / "images" / "chart.png").read_bytes()
    sent: list[str] = []

    def page_text(image: bytes):
        if image == chart_bytes:
            sent.append("chart")
        elif image == photo_bytes:
            sent.append("photo")
        else:
            sent.append(f"page {pages.page_of[image]}")
        return _lines(*cases.scanned_words) if sent[-1] == "page 1" else None  # the photo holds no text

    ocr = DocumentOcr(InProcessModels(page_text=page_text), OcrOptions())
    layer = text_layer_characters(cases.path)
    assert layer[0] > 200 and layer[1:] == [0, 0, 0]
    assert ocr.pages_before_parsing(layer) == [1, 2, 3]

    async def ingest():
        started = ocr.start(ocr.pages_before_parsing(layer), pages)  # while the parser would run
        return await ocr.read(parsed, pages, started=started)

    read, report = asyncio.run(ingest())
    assert sorted(pages.rendered) == [1, 2, 3]  # each page rendered once: the early reading is what `read` used
    assert sorted(sent) == ["page 1", "page 3", "photo"]  # not the blank page, not the chart the parser found words in
    assert (report.pages, report.blank_pages, report.figures, report.figures_with_text) == (2, 1, 1, 1)
    assert [b.content for b in read.blocks if b.page == 1] == cases.scanned_words  # two paragraphs, the picture gone
    assert read.blocks[1] == parsed.blocks[1]  # the chart keeps the parser's words, unchanged
    assert [b.page for b in read.blocks].count(3) == 0  # a photo page OCR found nothing on gives no text either


def test_a_page_begun_early_that_the_parser_found_text_on_keeps_the_parser_text(cases):
    cases, parsed = cases
    pages = _Pages(cases.path)
    ocr = DocumentOcr(InProcessModels(page_text=lambda image: _lines("read from pixels")), OcrOptions(figures=False))
    with_text = ParsedDocument([*parsed.blocks, Block("text", "The parser's own words.", page=3, bbox=(100, 100, 900, 200))],
                               parsed.page_count, parsed.parser, asset_root=parsed.asset_root)

    async def ingest():
        return await ocr.read(with_text, pages, started=ocr.start([1, 3], pages))

    read, report = asyncio.run(ingest())
    assert (report.pages, report.blank_pages) == (1, 1)  # pages 1 and 2 (blank); not 3
    assert [b.content for b in read.blocks if b.page == 3 and b.type == "text"] == ["The parser's own words."]


def test_a_model_that_is_down_fails_the_document_and_leaves_no_reading_behind(cases):
    cases, parsed = cases
    pages = _Pages(cases.path)
    models = InProcessModels(failures={"ocr": TritonUnavailableError("ocr: connection refused")}, delays={"ocr": 0.01})

    async def ingest():
        ocr = DocumentOcr(models, OcrOptions(concurrency=1))
        started = ocr.start([1, 2, 3], pages)
        with pytest.raises(TritonUnavailableError):
            await ocr.read(parsed, pages, started=started)
        await asyncio.sleep(0.05)
        return [task for task in asyncio.all_tasks() if task is not asyncio.current_task()], started

    left, started = asyncio.run(ingest())
    assert left == [] and all(task.done() for task in started.tasks.values())
    assert len(pages.rendered) < 3  # the pages behind the failed one were never rendered
