"""The OCR benchmark end to end on generated PDFs: pages with a text layer read through Triton and by RapidOCR,
scored against their text layer, and an image-only deck ingested."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image, ImageDraw, ImageFont

from thinkserve_bench.command import main as benchmark
from thinkserve_bench.scripts import ocr_quality
from thinkserve_bench.corpora import pdf_factory

pytestmark = pytest.mark.integration


def _deck(path):
    """Two slides that are only pictures of words (no text layer)."""
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    pdf = canvas.Canvas(str(path), pagesize=(960, 540))
    for title in ("Quarterly revenue by region", "Warehouse capacity in Aarhus"):
        slide = Image.new("RGB", (1920, 1080), "white")
        ImageDraw.Draw(slide).text((120, 120), title, fill="black", font=ImageFont.load_default(size=90))
        buffer = io.BytesIO()
        slide.save(buffer, "PNG")
        pdf.drawImage(ImageReader(io.BytesIO(buffer.getvalue())), 0, 0, width=960, height=540)
        pdf.showPage()
    pdf.save()


def test_the_ocr_benchmark_scores_both_engines_and_ingests_a_deck(model_repository, tmp_path):
    documents = tmp_path / "dataset" / "documents"
    documents.mkdir(parents=True)
    pdf_factory.write_sample_report(documents / "report.pdf")
    _deck(documents / "slides.pdf")
    assert benchmark(["ocr_quality", "--dataset", str(tmp_path / "dataset"), "--pages", "2", "--output", str(tmp_path / "out"),
                             "--set", f"triton.model_repository={model_repository}"]) == 0
    result = json.loads((tmp_path / "out" / "ocr_quality.json").read_text())
    pages = result["stats"]["pages"]
    assert [p["document"] for p in pages] == ["report.pdf", "report.pdf"]  # the deck has no text layer to score against
    overall = result["summary"]["by_kind"]["all"]
    assert overall["thinkserve"]["coverage"] > 0.9 and overall["thinkserve"]["cer_no_space"] < 0.05
    assert 0.5 < overall["rapidocr"]["coverage"] <= overall["thinkserve"]["coverage"]  # its per-line turns drop lines
    assert overall["thinkserve"]["word_recall"] >= overall["rapidocr"]["word_recall"]  # the word-space rule
    assert result["summary"]["pages_per_s"]["thinkserve"] > 0 and result["summary"]["ratio"] > 0
    speed = result["stats"]["speed"]  # the same graphs through Triton and in process, slides and text pages apart
    assert speed["slides"]["pages"] == 2 and speed["text pages"]["pages"] == 2
    assert all(row["ratio"] > 0 and row["recognizer"]["inferences"] >= row["recognizer"]["executions"] > 0 for row in speed.values())
    served = json.loads(ocr_quality._parameters(model_repository / "ocr" / "config.pbtxt")["reading"])
    assert result["stats"]["reading"] == served  # the in-process side reads as the served model does
    deck = result["stats"]["deck"]
    assert deck["document"] == "slides.pdf" and deck["pages"] == deck["ocr_pages"] == 2 and deck["passages"] >= 2
    assert "ocr" in deck["stages"] and "Ingest of slides.pdf, 2 pages without a text layer" in (tmp_path / "out" / "ocr_quality.md").read_text()
