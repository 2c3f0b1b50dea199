"""OCR through the real tritonserver: the `ocr` pipeline (BLS over ocr_detect, ocr_classify, ocr_recognize) reads
drawn words back where they were drawn, upright or upside down, batches pages, and names what it cannot read; and
ingest of PDFs whose pages have no text layer, through the real orchestrator, cites those pages."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from orchestrator.client import ThinkServeClient
from orchestrator.errors import InvalidRequestError
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.client.presentation import print_query
from tests.integration.test_models import call

pytestmark = pytest.mark.integration

WORDS = [("Quarterly revenue", (60, 60)), ("rose to 412 million", (60, 160)), ("Aarhus factory", (520, 400))]


def drawn_page(upside_down: bool = False, size: tuple[int, int] = (1000, 560)) -> tuple[bytes, list[tuple[str, tuple]]]:
    """A PNG page with WORDS drawn in Pillow's own font, and each phrase's box as fractions of the page."""
    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=40)
    boxes = []
    for text, (x, y) in WORDS:
        draw.text((x, y), text, fill="black", font=font)
        x0, y0, x1, y1 = draw.textbbox((x, y), text, font=font)
        boxes.append((text, (x0 / size[0], y0 / size[1], x1 / size[0], y1 / size[1])))
    if upside_down:
        page = page.rotate(180)
        boxes = [(text, (1 - x1, 1 - y1, 1 - x0, 1 - y0)) for text, (x0, y0, x1, y1) in boxes]
    buffer = io.BytesIO()
    page.save(buffer, "PNG")
    return buffer.getvalue(), boxes


def _box_of(boxes: np.ndarray) -> tuple[float, float, float, float]:
    return float(boxes[:, 0].min()), float(boxes[:, 1].min()), float(boxes[:, 0].max()), float(boxes[:, 1].max())


@pytest.mark.parametrize("upside_down", [False, True])
def test_drawn_words_are_read_back_where_they_were_drawn(triton, upside_down):
    image, expected = drawn_page(upside_down)
    [page] = call(triton, lambda models: models.read_text([image]))
    assert list(page.lines) == [text for text, _ in sorted(expected, key=lambda item: (item[1][1], item[1][0]))]
    assert page.boxes.shape == (3, 4, 2) and page.confidence.shape == (3,) and np.all(page.confidence > 0.8)
    for text, (x0, y0, x1, y1) in expected:
        bx0, by0, bx1, by1 = _box_of(page.boxes[page.lines.index(text)])
        # the detector's box holds the drawn text with a margin of about half its height
        assert bx0 <= x0 + 0.01 and by0 <= y0 + 0.01 and bx1 >= x1 - 0.01 and by1 >= y1 - 0.01
        assert bx1 - bx0 < (x1 - x0) * 1.3 and by1 - by0 < (y1 - y0) * 2.5


@pytest.mark.parametrize("turn", [Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_270])
def test_a_page_turned_a_quarter_is_read_line_by_line(triton, turn):
    """A scan fed in sideways: every line is vertical, read a quarter turned, each by its own 0/180 verdict."""
    image, _ = drawn_page()
    turned = io.BytesIO()
    Image.open(io.BytesIO(image)).transpose(turn).save(turned, "PNG")
    [page] = call(triton, lambda models: models.read_text([turned.getvalue()]))
    assert sorted(page.lines) == sorted(text for text, _ in WORDS)


def test_pages_sent_together_are_batched_and_read_as_alone(triton):
    pages = [drawn_page(i % 2 == 1)[0] for i in range(4)]

    async def work(models):
        together = await models.read_text(pages)
        alone = [(await models.read_text([page]))[0] for page in pages]
        statistics = await models.client.model_statistics("ocr_recognize")
        return together, alone, statistics

    together, alone, statistics = call(triton, work)
    assert [p.lines for p in together] == [p.lines for p in alone]
    assert all(np.allclose(a.boxes, b.boxes) for a, b in zip(together, alone))
    batches = statistics["model_stats"][0]["batch_stats"]
    assert any(int(entry["batch_size"]) > 1 for entry in batches)  # crops of several lines and pages per call


def test_crops_of_different_widths_share_an_execute_and_read_as_alone(triton):
    """The recogniser's requests of different widths are ragged: they share an execute, each width its own call
    (padding would change what it reads), so none waits for Triton to give the batch it was formed for up."""
    rng = np.random.default_rng(7)
    crops = [rng.random((1, 3, 48, width), dtype=np.float32) for width in (64, 128, 64, 192, 128, 320, 64, 96)]
    outputs = ["classes", "probabilities", "space_probability"]

    async def work(models):
        import asyncio

        before = await models.client.model_statistics("ocr_recognize")
        together = await asyncio.gather(*(models.client.infer("ocr_recognize", {"image": crop}, outputs) for crop in crops))
        after = await models.client.model_statistics("ocr_recognize")
        alone = [await models.client.infer("ocr_recognize", {"image": crop}, outputs) for crop in crops]
        return together, alone, before, after

    together, alone, before, after = call(triton, work)
    for crop, shared, single in zip(crops, together, alone):
        assert shared["classes"].shape == single["classes"].shape == (1, crop.shape[3] // 8)  # no padded columns
        assert np.array_equal(shared["classes"], single["classes"])
        assert np.allclose(shared["probabilities"], single["probabilities"], atol=1e-4)
    executions = int(after["model_stats"][0].get("execution_count", 0)) - int(before["model_stats"][0].get("execution_count", 0))
    # Triton alone batches equal shapes only, an execute per width at least: here several widths shared one
    assert executions < len({crop.shape[3] for crop in crops})


def test_blank_pages_read_as_nothing_and_bad_images_are_named(triton):
    blank = io.BytesIO()
    Image.new("RGB", (800, 600), "white").save(blank, "PNG")

    async def work(models):
        [empty] = await models.read_text([blank.getvalue()])
        with pytest.raises(InvalidRequestError, match="ocr.*not a readable image"):
            await models.read_text([b"\x89PNG\r\n\x1a\n truncated"])
        return empty

    empty = call(triton, work)
    assert empty.lines == () and empty.boxes.shape == (0, 4, 2) and empty.confidence.shape == (0,)


def scanned_pdf(path: Path) -> Path:
    """A two-page PDF: page 1 has a text layer, page 2 is only a picture of words (a scan)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    scan = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(scan)
    font = ImageFont.load_default(size=44)
    draw.text((120, 140), "Warehouse inspection", fill="black", font=ImageFont.load_default(size=80))
    draw.text((120, 300), "The Aarhus warehouse passed its", fill="black", font=font)
    draw.text((120, 360), "fire inspection on 14 March 2024.", fill="black", font=font)
    buffer = io.BytesIO()
    scan.save(buffer, "PNG")
    pdf = canvas.Canvas(str(path), pagesize=A4)
    pdf.setFont("Helvetica", 12)
    pdf.drawString(72, 760, "Northwind annual summary")
    pdf.drawString(72, 740, "Revenue for 2024 was 412 million euros, up from 380 million.")
    pdf.showPage()
    pdf.drawImage(ImageReader(io.BytesIO(buffer.getvalue())), 0, 0, width=A4[0], height=A4[1])
    pdf.showPage()
    pdf.save()
    return path


def test_an_image_only_page_is_ingested_as_text_and_cited_with_its_region(running_orchestrator, tmp_path):
    path = scanned_pdf(tmp_path / "inspection.pdf")
    with ThinkServeClient(running_orchestrator.address, timeout_s=300) as client:
        report = client.ingest_file("scans", path)
        document = report.document
        assert document.pages == 2 and document.ocr_pages == 1 and document.ocr_lines == 3
        assert "ocr" in {stage.stage for stage in report.stages}
        assert not any("no extractable text" in w for w in document.warnings)
        events = list(client.query("scans", "When did the Aarhus warehouse pass its fire inspection?"))
    final = next(e.final for e in events if e.WhichOneof("event") == "final")
    assert "14 March 2024" in final.text
    printed = io.StringIO()
    print_query("When?", events, printed)  # what `thinkserve ask` prints: the quote came from OCR
    assert re.search(r"cites: \[\d+\] inspection\.pdf p\.2 \(OCR, confidence 0\.\d\d\)", printed.getvalue())
    citation = final.citations[0]
    assert citation.page == 1 and "14 March 2024" in citation.quote
    [region] = citation.regions
    assert region.page == 1 and region.HasField("ocr_confidence") and region.ocr_confidence > 0.8
    x0, y0, x1, y1 = region.bbox
    assert 60 <= x0 < 200 and 130 <= y0 < 260 and 500 < x1 < 950 and y1 < 300  # the paragraph, where it was drawn

    segment = KnowledgeBase(running_orchestrator.data_dir, read_only=True).collection("scans").snapshot.segments[0]
    page_two = [b for b in segment.blocks if b.page == 1]
    assert [b.type for b in page_two] == ["title", "text"] and all(b.ocr_confidence > 0.8 for b in page_two)
    assert not any(b.type == "image" for b in segment.blocks)  # the page-sized picture gave way to its text
    assert all(b.ocr_confidence is None for b in segment.blocks if b.page == 0)


def test_a_page_the_parser_is_not_given_is_read_by_ocr(triton, tmp_path):
    """A page of too many drawing objects (here a lowered ingest.parser_max_page_objects) is parsed around by the
    real MinerU, and its rendered image read by OCR: the document keeps every page."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    from orchestrator.config import IngestSettings
    from orchestrator.knowledge.ingest import Ingestor
    from tests.conftest import MODEL_REPOSITORY

    path = tmp_path / "vector-chart.pdf"
    pdf = canvas.Canvas(str(path), pagesize=A4)
    pdf.setFont("Helvetica", 12)
    pdf.drawString(72, 760, "Northwind quarterly figures, see the chart overleaf.")
    pdf.showPage()
    pdf.setFont("Helvetica-Bold", 28)
    pdf.drawString(72, 740, "Regional sales by quarter")
    for i in range(1500):  # a chart drawn as many small vector marks
        pdf.rect(72 + (i % 50) * 9, 300 + (i // 50) * 9, 6, 6, stroke=0, fill=1)
    pdf.showPage()
    pdf.save()
    settings = IngestSettings(parser_max_page_objects=1000)
    tokenizer = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"

    async def work(models):
        ingestor = Ingestor(KnowledgeBase(tmp_path / "data"), models, settings, tokenizer)
        return await ingestor.ingest("charts", path.name, path.read_bytes())

    document = call(triton, work).document
    assert document.pages == 2 and document.unparsed_pages == (1,) and document.ocr_pages == 1
    assert any(w.startswith("page 2 was not parsed (1,50") and "OCR reads its page image" in w for w in document.warnings)
    segment = KnowledgeBase(tmp_path / "data", read_only=True).collection("charts").snapshot.segments[0]
    assert [b.content for b in segment.blocks if b.page == 0] == ["Northwind quarterly figures, see the chart overleaf."]
    page_two = [b for b in segment.blocks if b.page == 1]
    assert any("Regional sales by quarter" in b.content and b.ocr_confidence > 0.8 for b in page_two)


def test_a_whole_parse_that_fails_is_done_again_in_ranges_by_the_real_mineru(triton, tmp_path):
    """The whole document's parse killed (a one-second limit), its pages parsed again as a range (each range gets
    at least two minutes): nothing is lost, and the warning says what happened."""
    from thinkserve_bench.corpora import pdf_factory
    from orchestrator.config import IngestSettings
    from orchestrator.knowledge.ingest import Ingestor
    from tests.conftest import MODEL_REPOSITORY

    report = pdf_factory.write_sample_report(tmp_path / "report.pdf")
    tokenizer = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"

    async def work(models):
        ingestor = Ingestor(KnowledgeBase(tmp_path / "data"), models, IngestSettings(parser_timeout_s=1.0), tokenizer)
        return await ingestor.ingest("ranges", report.path.name, report.path.read_bytes())

    document = call(triton, work).document
    assert document.pages == 3 and document.unparsed_pages == () and document.units == 2 and document.passages >= 3
    assert document.warnings[0] == (
        "the parse of the whole document failed (MinerU did not finish report.pdf within 1 s (killed)): "
        "it was parsed in ranges of pages"
    )


def test_a_corrupt_figure_image_and_a_blank_page_cost_warnings_and_the_document_still_ingests(triton, tmp_path):
    """A content list made elsewhere whose figure image is corrupt, and a PDF with a blank page: each ingests,
    the figure keeps its caption, and the warnings say what OCR could not read."""
    import json
    import zipfile

    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    from orchestrator.config import IngestSettings
    from orchestrator.knowledge.ingest import Ingestor
    from tests.conftest import MODEL_REPOSITORY

    items = [
        {"type": "text", "text": "Freight volumes rose in the third quarter.", "bbox": [100, 100, 900, 140], "page_idx": 0},
        {"type": "image", "img_path": "images/chart.jpg", "image_caption": ["Figure 1: Freight by month"],
         "bbox": [100, 200, 900, 600], "page_idx": 0},
    ]
    bundle = io.BytesIO()
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("freight/freight_content_list.json", json.dumps(items))
        archive.writestr("freight/images/chart.jpg", b"\xff\xd8\xff\xe0 not really a JPEG")
    blank = tmp_path / "blank.pdf"
    pdf = canvas.Canvas(str(blank), pagesize=A4)
    pdf.setFont("Helvetica", 12)
    pdf.drawString(72, 700, "The only page with words on it.")
    pdf.showPage()
    pdf.showPage()  # nothing drawn: a blank page
    pdf.save()
    tokenizer = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"

    async def work(models):
        ingestor = Ingestor(KnowledgeBase(tmp_path / "data"), models, IngestSettings(ocr_figures=True), tokenizer)
        freight = await ingestor.ingest("bad", "freight.zip", bundle.getvalue())
        empty = await ingestor.ingest("bad", blank.name, blank.read_bytes())
        return freight.document, empty.document

    freight, empty = call(triton, work)
    assert freight.units == 1 and freight.ocr_figures == 0
    assert any(w.startswith("page 1: a figure could not be read by OCR (model ocr rejected the request") and
               "not a readable image" in w for w in freight.warnings)
    assert empty.pages == 2 and empty.ocr_pages == 0 and empty.ocr_lines == 0  # nothing drawn on it: never sent
    assert any(w.startswith("1 of 2 pages have no extractable text (page 2): OCR found no words on them either")
               for w in empty.warnings)


def _inferences(statistics) -> int:
    return int(statistics["model_stats"][0]["inference_count"])


def test_only_what_pays_is_read_on_a_generated_pdf_through_mineru_and_triton(triton, tmp_path):
    """The real MinerU and Triton on the four cases OCR's decisions tell apart: the page that is a picture of words
    is read (begun while MinerU parses); the blank page is never sent; the chart whose labels the parser took from
    the text layer is not read again; the photos (a figure and a whole page) are sent, the detector finds no line in
    them, and the recogniser reads only the scanned page's two lines."""
    from thinkserve_bench.corpora import pdf_factory
    from orchestrator.config import IngestSettings
    from orchestrator.knowledge.ingest import Ingestor
    from tests.conftest import MODEL_REPOSITORY

    cases = pdf_factory.write_ocr_cases(tmp_path / "cases.pdf")
    tokenizer = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"
    networks = ("ocr", "ocr_detect", "ocr_recognize")

    async def work(models):
        before = {m: _inferences(await models.client.model_statistics(m)) for m in networks}
        ingestor = Ingestor(KnowledgeBase(tmp_path / "data"), models, IngestSettings(ocr_figures=True), tokenizer)
        result = await ingestor.ingest("cases", cases.path.name, cases.path.read_bytes())
        after = {m: _inferences(await models.client.model_statistics(m)) for m in networks}
        return result, {m: after[m] - before[m] for m in networks}

    result, calls = call(triton, work)
    document = result.document
    assert (document.pages, document.ocr_pages, document.ocr_figures, document.ocr_lines) == (4, 2, 1, 2)
    assert calls == {"ocr": 3, "ocr_detect": 3, "ocr_recognize": 2}  # pages 2 and 4, the photo figure; 2 lines
    assert {"ocr", "ocr_reading"} <= set(result.stage_seconds)
    segment = KnowledgeBase(tmp_path / "data", read_only=True).collection("cases").snapshot.segments[0]
    chart = next(b for b in segment.blocks if b.caption == cases.figure_caption)
    assert all(label in chart.content for label in cases.chart_labels) and chart.ocr_confidence is None
    assert [b.content for b in segment.blocks if b.page == 1] == cases.scanned_words
    assert any(w.startswith("2 of 4 pages have no extractable text (page 3, 4)") for w in document.warnings)
